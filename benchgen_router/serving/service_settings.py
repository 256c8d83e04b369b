"""The service's settings, checked before Ray starts (docs/service.md, "Checks before Ray starts"): numbers in
range, this machine's CPUs and ports for a local Ray, a Ray cluster that answers, the router's operating point,
and the gateway's settings read from the pool file. Each mistake is one InputError line in a second, where a
replica would find it out only after a minute of starting.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from benchgen_router.costs import read_pool_rows
from benchgen_router.errors import InputError, first_line, setting_error
from benchgen_router.serving.engine import free_port
from benchgen_router.serving.gateway import DEFAULT_MAX_REQUEST_BYTES as GATEWAY_MAX_REQUEST_BYTES
from benchgen_router.serving.gateway import DEFAULT_MAX_RESPONSE_BYTES as GATEWAY_MAX_RESPONSE_BYTES
from benchgen_router.serving.gateway import DEFAULT_TIMEOUT_S as GATEWAY_TIMEOUT_S
from benchgen_router.serving.gateway import GatewaySettings, check_gateway_settings, names_upstreams
from benchgen_router.serving.journal import service_retention
from benchgen_router.upstreams import read_upstream_pool

RAY_CONNECT_TIMEOUT_S = 10.0


def check_port_free(host: str, port: int, what: str) -> None:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            raise InputError(f"cannot listen on {host}:{port} for {what} ({err.strerror}); pass a free port.") from None


def check_cpus(what: str, wanted: int, declared: int | None = None) -> None:
    """Each replica or actor loads its own router: more of them than CPUs multiplies memory, not throughput."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    available = declared or cores
    if wanted > available:
        raise InputError(
            f"{what} need {wanted} CPUs but this machine has {available}; pass fewer {what}, or --address of a "
            "Ray cluster that has the CPUs."
        )


def check_reachable(address: str) -> None:
    """ray.init retries a HOST:PORT nothing listens on for minutes: one line in bounded time instead.
    Other forms ("auto") are left to Ray."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=RAY_CONNECT_TIMEOUT_S).close()
    except OSError as err:
        raise InputError(
            f"no Ray cluster answers at {address} ({err.strerror or type(err).__name__}); start one "
            "(`ray start --head`) or pass the address it printed."
        ) from None


def check_router_point(model: str | None, revision: str | None, operating_point: str | None) -> None:
    """From config.json alone, before Ray starts: each replica or actor would find out only after loading
    the router. A config.json only the cluster's nodes can read is left to them; they check again."""
    if operating_point is None:
        return
    if not isinstance(operating_point, str):
        raise InputError(f"operating_point must be a name (a str) or None, got {type(operating_point).__name__}.")
    from benchgen_router.loading import declared_config
    from benchgen_router.model_code import RouterConfig, default_router_dir

    try:
        declared = declared_config(str(default_router_dir() if model is None else model), revision)
    except InputError:
        return
    try:
        config = RouterConfig(
            operating_points=declared.get("operating_points"), operating_point=declared.get("operating_point")
        )
        config.check_operating_point(operating_point)
    except ValueError as err:
        raise InputError(first_line(err)) from None


def router_agents(model: str | None, revision: str | None) -> list[str] | None:
    """The router's agents, from its config.json, so that the pool's upstreams are checked against them
    before Ray starts; None for a config.json only the cluster's nodes can read (the replicas check)."""
    from benchgen_router.loading import declared_config
    from benchgen_router.model_code import default_router_dir

    try:
        declared = declared_config(str(default_router_dir() if model is None else model), revision)
    except InputError:
        return None
    labels = declared.get("id2label") or {}
    return [labels[key] for key in sorted(labels, key=int)]


def read_gateway(
    pool_file: str | os.PathLike | None,
    model: str | None,
    revision: str | None,
    route_on: str = "last-user",
    gateway_fallback: str | None = None,
    gateway_timeout_s: float = GATEWAY_TIMEOUT_S,
    gateway_max_request_bytes: int = GATEWAY_MAX_REQUEST_BYTES,
    gateway_max_response_bytes: int = GATEWAY_MAX_RESPONSE_BYTES,
    journal: str | os.PathLike | None = None,
    journal_text: bool = False,
    journal_max_bytes: int | None = None,
    journal_max_days: float | None = None,
) -> GatewaySettings | None:
    """The gateway's settings when the pool file names upstreams, every problem of the file at once (one
    line each); None when it names none: the service then has no gateway. The journal's retention left as
    None takes its default (serving/journal.py)."""
    journal_settings = {"journal_text": journal_text or None, "journal_max_bytes": journal_max_bytes,
                        "journal_max_days": journal_max_days}  # fmt: skip
    for name, value in journal_settings.items():
        if value is not None and journal is None:
            raise setting_error(f"{{{name}}} needs {{journal}}, the folder to journal to.")
    retention = service_retention(journal_max_bytes, journal_max_days)
    if pool_file is None or not names_upstreams(read_pool_rows(pool_file)):
        for name, value in (("gateway_fallback", gateway_fallback), ("journal", journal)):
            if value is not None:
                raise setting_error(f"{{{name}}} needs a pool file whose agents have a base_url (docs/gateway.md).")
        return None
    upstreams = read_upstream_pool(pool_file, router_agents(model, revision))
    check_gateway_settings(route_on, gateway_fallback, gateway_timeout_s, upstreams.agents)
    check_positive("gateway_max_request_bytes", gateway_max_request_bytes)
    check_positive("gateway_max_response_bytes", gateway_max_response_bytes)
    return GatewaySettings(
        upstreams,
        route_on,
        gateway_fallback,
        float(gateway_timeout_s),
        gateway_max_request_bytes,
        gateway_max_response_bytes,
        journal=journal_folder(journal),
        journal_text=journal_text,
        journal_retention=retention,
    )


def journal_folder(journal: str | os.PathLike | None) -> str | None:
    """The journal's folder as an absolute path (a replica's working directory is not the caller's)."""
    if journal is None:
        return None
    folder = Path(journal).expanduser().resolve()
    if folder.exists() and not folder.is_dir():
        raise setting_error(f"{{journal={journal}}} is a file; pass a folder (it is created when missing).")
    return str(folder)


def check_positive(name: str, value: float, integer: bool = True) -> None:
    if (integer and (not isinstance(value, int) or value < 1)) or value < 0:
        kind = "a positive integer" if integer else "a number >= 0"
        raise InputError(f"{name} must be {kind}, got {value!r}.")


def check_service_settings(
    replicas: int,
    max_batch_size: int,
    threads: int,
    max_queries: int,
    max_request_bytes: int,
    batch_wait_ms: float,
    ray_cpus: int | None,
) -> None:
    for name, value in (
        ("replicas", replicas),
        ("max_batch_size", max_batch_size),
        ("threads", threads),
        ("max_queries", max_queries),
        ("max_request_bytes", max_request_bytes),
    ):
        check_positive(name, value)
    check_positive("batch_wait_ms", batch_wait_ms, integer=False)
    if ray_cpus is not None:
        check_positive("ray_cpus", ray_cpus)


def check_local_machine(host: str, port: int, cpus: int, ray_cpus: int | None, metrics_port: int | None) -> int:
    """The metrics port, once this machine has the CPUs and the ports for a local Ray and the service."""
    check_cpus("replicas", cpus, ray_cpus)
    check_port_free(host, port, "the service")
    metrics_port = metrics_port or free_port(taken=(port,))
    check_port_free("127.0.0.1", metrics_port, "metrics")
    return metrics_port
