"""Starting and stopping the service: serve() deploys the ingress (serving.app) in front of the
router replicas (serving.replica) on Ray Serve, on a private local Ray or a cluster's.

Metrics (Prometheus text at the Ray node's metrics port, `http://127.0.0.1:PORT/metrics`): Ray
Serve's own (requests, latencies, replica health) plus `ray_benchgen_router_routed_queries_total`
(tag `agent`: queries routed to each agent) and `ray_benchgen_router_rejected_requests_total`
(tag `status`).

On a Ray cluster (`address=`) the replicas import this package, so it must be installed on every
node; the router is loaded on each replica from `model` (a Hub id, or a folder every node can
read). A pool file is read here, on the driver, and sent to the replicas.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import ray
from ray import serve as ray_serve

from benchgen_router.costs import read_pool_file
from benchgen_router.errors import InputError, Terminated, first_line
from benchgen_router.serving.app import (
    DEFAULT_MAX_QUERIES,
    DEFAULT_MAX_REQUEST_BYTES,
    INGRESS_MAX_ONGOING,
    RouterIngress,
)
from benchgen_router.serving.replica import DEFAULT_REPLICA_CPUS, RouterReplica

logger = logging.getLogger("benchgen_router.serving")

APP_NAME = "benchgen-router"
# How long a stopping service waits for the requests in flight to be answered (Kubernetes gives
# a pod 30 s between SIGTERM and SIGKILL by default).
DRAIN_TIMEOUT_S = 20.0
RAY_CONNECT_TIMEOUT_S = 10.0


@dataclass
class RunningService:
    """A started service (serve(..., blocking=False)); close() stops it, and the Ray it started."""

    url: str
    metrics_url: str | None
    owns_ray: bool  # a local Ray started for the service: stopped with it
    connected: bool  # this process connected to Ray for the service: disconnected at the end
    closed: bool = field(default=False, init=False)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            shutdown_service(self.owns_ray, self.connected)

    def __enter__(self) -> RunningService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def shutdown_service(owns_ray: bool, connected: bool) -> None:
    """Stop the service. First the ingress stops taking requests and answers those it took (up to
    DRAIN_TIMEOUT_S); then the application is deleted while Ray Serve's HTTP proxy still runs. Then, on
    the local Ray started for it, Ray itself (raylet, GCS, Serve's controller and proxy, workers:
    stopping Serve on its own first only adds retry warnings from its dying controller). On a Ray
    someone else runs (a cluster, or this process's own), nothing more, leaving other Serve
    applications alone; then disconnect if we connected."""
    if not ray.is_initialized():
        return
    try:
        drain_ingress()
    except Exception as err:  # e.g. the ingress died: the replicas are stopped all the same
        logger.warning("draining the service failed (%s); stopping it anyway", first_line(err))
    try:
        ray_serve.delete(APP_NAME)
    except Exception as err:  # a dead cluster must not keep us from disconnecting
        logger.warning("stopping the service failed (%s); disconnecting anyway", first_line(err))
    if connected:
        ray.shutdown()


def drain_ingress() -> None:
    """The ingress of a running service stops taking requests and answers those it took, while the
    replicas they wait on still run (up to DRAIN_TIMEOUT_S)."""
    application = ray_serve.status().applications.get(APP_NAME)
    if application is None or application.status != "RUNNING":
        return
    handle = ray_serve.get_app_handle(APP_NAME)
    left = handle.drain.remote(DRAIN_TIMEOUT_S).result(timeout_s=DRAIN_TIMEOUT_S + 5)
    if left:
        logger.warning("stopping with %d request%s unanswered after %g s", left, "s" * (left != 1), DRAIN_TIMEOUT_S)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def check_port_free(host: str, port: int, what: str) -> None:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            raise InputError(f"cannot listen on {host}:{port} for {what} ({err.strerror}); pass a free port.") from None


def check_cpus(what: str, wanted: int, declared: int | None = None) -> None:
    """Refuse, in one line, to start a local Ray for more CPUs than this machine has: each replica or
    actor loads its own router, so oversubscribing only multiplies the memory for no throughput."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    available = declared or cores
    if wanted > available:
        raise InputError(
            f"{what} need {wanted} CPUs but this machine has {available}; pass fewer {what}, or --address of a "
            "Ray cluster that has the CPUs."
        )


def check_reachable(address: str) -> None:
    """One line, in bounded time, for a HOST:PORT (or ray://HOST:PORT) nothing listens on: ray.init
    itself retries such an address for minutes. Other forms ("auto") are left to Ray."""
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


def start_ray(address: str | None, num_cpus: int, metrics_port: int | None = None) -> tuple[bool, bool]:
    """Join `address`, or start a private local Ray (address "local": never someone else's) with
    `num_cpus` CPUs and no dashboard; nothing when this process is already connected.
    Returns (owns the Ray: started it here, connected here)."""
    if ray.is_initialized():
        return False, False
    if address:
        check_reachable(address)
        ray.init(address=address)
        return False, True
    with single_machine_ray():
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, _metrics_export_port=metrics_port)
    return True, True


@contextlib.contextmanager
def single_machine_ray() -> Iterator[None]:
    """Ray's single-machine mode (its default on macOS and Windows) while a private local Ray starts:
    its node address is then 127.0.0.1, so the metrics endpoint and Ray's own ports listen on
    loopback only, not on every interface. `ray.init(_node_ip_address="127.0.0.1")` does not do
    this: Ray replaces a loopback address with the machine's routable one. A Ray without the
    switch starts as before."""
    constants = getattr(getattr(ray, "_private", None), "ray_constants", None)
    if constants is None or not hasattr(constants, "ENABLE_RAY_CLUSTER"):
        yield
        return
    previous = constants.ENABLE_RAY_CLUSTER
    constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        constants.ENABLE_RAY_CLUSTER = previous


def check_router_point(model: str | None, revision: str | None, operating_point: str | None) -> None:
    """InputError naming the router's operating points when it lacks `operating_point`, from its
    config.json alone: checked here, before Ray starts, since every replica or actor would only
    find out after loading the whole router. A config.json this machine cannot read (a folder only
    the cluster's nodes have) is left to the replicas and actors, which check the name again."""
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


def build_application(
    model: str | None = None,
    *,
    revision: str | None = None,
    backbone: str | None = None,
    pool: list[dict[str, Any]] | None = None,
    replicas: int = 1,
    cpus: int = DEFAULT_REPLICA_CPUS,
    max_batch_size: int = 32,
    batch_wait_ms: float = 0.0,
    max_queries: int = DEFAULT_MAX_QUERIES,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    operating_point: str | None = None,
    access_log: bool = False,
) -> Any:
    """The service as a Ray Serve application: the ingress bound to `replicas` router replicas of
    `cpus` CPUs each. serve() runs it; `serve run benchgen_router.serving.service:app_builder
    model=./router` runs it with Ray Serve's own command (arguments as serve()'s, as text)."""
    routers = RouterReplica.options(
        num_replicas=replicas,
        ray_actor_options={"num_cpus": cpus},
        # The ingress hands over whole requests; enough of them per replica to fill the next
        # batch while one is scored.
        max_ongoing_requests=max(2 * max_batch_size, 8),
        graceful_shutdown_wait_loop_s=0.5,
        graceful_shutdown_timeout_s=DRAIN_TIMEOUT_S,
        health_check_period_s=2,
        max_constructor_retry_count=3,
        logging_config={"enable_access_log": access_log},
    ).bind(model, revision, backbone, pool, cpus, max_batch_size, batch_wait_ms / 1000, operating_point)
    return RouterIngress.options(
        ray_actor_options={"num_cpus": 0},  # it waits on the network, and never loads the model
        max_ongoing_requests=INGRESS_MAX_ONGOING,
        graceful_shutdown_wait_loop_s=0.5,
        # Longer than the replicas': a request whose replica is stopped at the deadline still
        # gets its 503 from the ingress.
        graceful_shutdown_timeout_s=DRAIN_TIMEOUT_S + 5,
        logging_config={"enable_access_log": access_log},
    ).bind(routers, max_queries, max_request_bytes)


def app_builder(args: dict[str, str]) -> Any:
    """For `serve run benchgen_router.serving.service:app_builder key=value ...`: model, revision,
    backbone, pool (a pool file), replicas, cpus, max_batch_size, max_queries, max_request_bytes,
    operating_point."""
    integers = ("replicas", "cpus", "max_batch_size", "max_queries", "max_request_bytes")
    known = {"model", "revision", "backbone", "pool", "operating_point", "batch_wait_ms", *integers}
    unknown = sorted(set(args) - known)
    if unknown:
        raise InputError(f"unknown argument(s) {', '.join(unknown)}; pass some of {', '.join(sorted(known))}.")
    settings: dict[str, Any] = {key: value for key, value in args.items() if key not in ("model", "pool")}
    for key in settings:
        if key in integers or key == "batch_wait_ms":
            try:
                settings[key] = int(settings[key]) if key in integers else float(settings[key])
            except ValueError:
                raise InputError(f"{key} must be a number, got {settings[key]!r}.") from None
            check_positive(key, settings[key], integer=key in integers)
    pool = read_pool_file(args["pool"]) if "pool" in args else None
    return build_application(args.get("model"), pool=pool, **settings)


def check_positive(name: str, value: float, integer: bool = True) -> None:
    if (integer and (not isinstance(value, int) or value < 1)) or value < 0:
        kind = "a positive integer" if integer else "a number >= 0"
        raise InputError(f"{name} must be {kind}, got {value!r}.")


def serve(
    model: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    replicas: int = 1,
    max_batch_size: int = 32,
    batch_wait_ms: float = 0.0,
    pool_file: str | os.PathLike | None = None,
    address: str | None = None,
    threads: int | None = None,
    max_queries: int = DEFAULT_MAX_QUERIES,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    blocking: bool = True,
    *,
    revision: str | None = None,
    backbone: str | None = None,
    ray_cpus: int | None = None,
    metrics_port: int | None = None,
    access_log: bool = False,
    operating_point: str | None = None,
    system_log_level: str = "WARNING",
) -> RunningService | None:
    """Serve the router over HTTP on host:port with Ray Serve; see the module docstring for the API.

    `model`: a router folder or Hub id (None: the bundled default router, no network needed).
    `replicas` replicas, each given `threads` CPUs (default 1) and as many torch threads.
    `max_batch_size` / `batch_wait_ms`: Ray Serve's dynamic batching (queries per run_router call;
    how long a batch waits for more once it has one: 0 by default, since the batches that close
    while the model runs are merged anyway, and a wait only delays requests to an idle service).
    `max_queries` / `max_request_bytes`: the per-request limits. `address`: join that Ray
    cluster; else this process's Ray if it has one, else a local Ray is started with `ray_cpus`
    CPUs (default: this machine's cores, at least replicas x threads) and Prometheus metrics on
    `metrics_port` (default: a free port, logged).
    `access_log`: Ray Serve's per-request log lines (off: they cost throughput).
    `system_log_level`: what Serve's controller and HTTP proxy log (by default only warnings: at
    INFO they log a line per cancelled request and per routing-table update).
    `operating_point`: for a router with several heads, the point requests without one are routed
    at (default: the router's own); checked against its config.json before Ray starts, and again
    by each replica.

    blocking=True serves until Ctrl-C or SIGTERM, then drains the requests in flight and shuts
    down cleanly (the application; Serve and Ray too when they were started here), and raises
    KeyboardInterrupt or errors.Terminated again, so that the caller exits as interrupted.
    blocking=False returns a RunningService to close(). Raises InputError (one line) for bad
    settings, a busy port, a router that cannot be loaded, an operating point it does not have, or
    a pool file that does not fit it.
    """
    cpus = DEFAULT_REPLICA_CPUS if threads is None else threads
    for name, value in (
        ("replicas", replicas),
        ("max_batch_size", max_batch_size),
        ("threads", cpus),
        ("max_queries", max_queries),
        ("max_request_bytes", max_request_bytes),
    ):
        check_positive(name, value)
    check_positive("batch_wait_ms", batch_wait_ms, integer=False)
    check_router_point(model, revision, operating_point)
    if ray_cpus is not None:
        check_positive("ray_cpus", ray_cpus)
    pool = read_pool_file(pool_file) if pool_file is not None else None
    local = not address and not ray.is_initialized()
    if local:
        check_cpus("replicas", replicas * cpus, ray_cpus)
        check_port_free(host, port, "the service")
        metrics_port = metrics_port or free_port()
        check_port_free("127.0.0.1", metrics_port, "metrics")

    owns_ray = connected = False
    service: RunningService | None = None
    terminated = threading.Event()
    previous_handler = None

    def stop() -> None:
        if service is not None:
            service.close()
        else:
            shutdown_service(owns_ray, connected)

    def on_sigterm(signum: int, frame: Any) -> None:
        if not terminated.is_set():  # a second SIGTERM must not cut the drain short
            terminated.set()
            raise Terminated

    try:
        owns_ray, connected = start_ray(
            address, ray_cpus or max(os.cpu_count() or 1, replicas * cpus), metrics_port if local else None
        )
        if blocking and threading.current_thread() is threading.main_thread():
            # After ray.init, which sets its own handler: SIGTERM (a service manager stopping
            # us) takes the same clean path as Ctrl-C.
            previous_handler = signal.signal(signal.SIGTERM, on_sigterm)
        ray_serve.start(
            http_options={"host": host, "port": port},
            logging_config={"log_level": system_log_level, "enable_access_log": access_log},
        )
        application = build_application(
            model,
            revision=revision,
            backbone=backbone,
            pool=pool,
            replicas=replicas,
            cpus=cpus,
            max_batch_size=max_batch_size,
            batch_wait_ms=batch_wait_ms,
            max_queries=max_queries,
            max_request_bytes=max_request_bytes,
            operating_point=operating_point,
            access_log=access_log,
        )
        handle = ray_serve.run(application, name=APP_NAME, route_prefix="/")
        service = RunningService(
            url=f"http://{host}:{port}",
            metrics_url=f"http://{ray.util.get_node_ip_address()}:{metrics_port}/metrics" if owns_ray else None,
            owns_ray=owns_ray,
            connected=connected,
        )
        problem = handle.get_startup_problem.remote().result()
        if problem:
            raise InputError(problem)
        logger.info(
            "serving %s on %s (API at %s/docs%s); %d replica%s, %d CPU%s each",
            "the default router" if model is None else model,
            service.url,
            service.url,
            f", metrics at {service.metrics_url}" if service.metrics_url else "",
            replicas,
            "s" * (replicas != 1),
            cpus,
            "s" * (cpus != 1),
        )
        if not blocking:
            return service
        logger.info("press Ctrl-C to stop")
        while True:
            time.sleep(3600)
    except (KeyboardInterrupt, Terminated):
        if blocking:
            why = "SIGTERM" if terminated.is_set() else "interrupted"
            logger.info("stopping (%s): answering the requests in flight", why)
        stop()
        raise
    except BaseException:
        stop()
        raise
    finally:
        if previous_handler is not None:
            signal.signal(signal.SIGTERM, previous_handler)
