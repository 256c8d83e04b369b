"""Starting and stopping the service: serve() deploys its one deployment (serving.app), whose
replicas read the requests and hold the router, on Ray Serve, on a private local Ray
(serving.local_ray) or a cluster's (docs/service.md: lifecycle, metrics, clusters). Its settings are
checked before Ray starts by serving.service_settings.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import ray
from ray import serve as ray_serve

from benchgen_router.costs import read_pool_file
from benchgen_router.errors import InputError, Terminated, first_line
from benchgen_router.serving import engine
from benchgen_router.serving.app import (
    BODY_TIMEOUT_S,
    DEFAULT_MAX_QUERIES,
    DEFAULT_MAX_REQUEST_BYTES,
    MAX_ONGOING_REQUESTS,
    RouterService,
)
from benchgen_router.serving.engine import choose_mode, started_in
from benchgen_router.serving.gateway import DEFAULT_MAX_REQUEST_BYTES as GATEWAY_MAX_REQUEST_BYTES
from benchgen_router.serving.gateway import DEFAULT_MAX_RESPONSE_BYTES as GATEWAY_MAX_RESPONSE_BYTES
from benchgen_router.serving.gateway import DEFAULT_TIMEOUT_S as GATEWAY_TIMEOUT_S
from benchgen_router.serving.gateway import GatewaySettings
from benchgen_router.serving.journal import parse_max_bytes, parse_max_days
from benchgen_router.serving.local_ray import LocalRay, new_local_ray, own_process_groups, stop_local_ray
from benchgen_router.serving.replica import DEFAULT_MAX_BATCH_SIZE, DEFAULT_REPLICA_CPUS
from benchgen_router.serving.service_settings import (
    check_local_machine,
    check_positive,
    check_reachable,
    check_router_point,
    check_service_settings,
    read_gateway,
)

logger = logging.getLogger("benchgen_router.serving")

APP_NAME = "benchgen-router"
# How long a stopping service waits for the requests in flight to be answered (Kubernetes gives
# a pod 30 s between SIGTERM and SIGKILL by default).
DRAIN_TIMEOUT_S = 20.0
# How long serve() waits for the replicas to load the router (a Hub download included).
LOAD_TIMEOUT_S = 900.0


@dataclass
class RunningService:
    """A service serve(..., blocking=False) started; close() stops it, and the Ray it started."""

    url: str
    metrics_url: str | None
    local_ray: LocalRay | None  # a local Ray started for the service: stopped with it
    connected: bool  # this process connected to Ray for the service: disconnected at the end
    closed: bool = field(default=False, init=False)

    @property
    def owns_ray(self) -> bool:
        return self.local_ray is not None

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            shutdown_service(self.local_ray, self.connected)

    def __enter__(self) -> RunningService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def shutdown_service(local_ray: LocalRay | None, connected: bool) -> None:
    """Delete the application (its replicas answer the requests they took, for up to DRAIN_TIMEOUT_S),
    then disconnect; a local Ray started for the service is stopped with every process it started and
    its folder. On a shared Ray, other applications are left alone."""
    if ray.is_initialized():
        try:
            ray_serve.delete(APP_NAME)
        except Exception as err:  # a dead cluster must not keep us from disconnecting
            logger.warning("stopping the service failed (%s); disconnecting anyway", first_line(err))
        if local_ray is None and connected:
            ray.shutdown()
    if local_ray is not None:
        stop_local_ray(local_ray)


def start_ray(
    address: str | None,
    num_cpus: int,
    metrics_port: int | None = None,
    mode: str | None = None,
    local_ray: LocalRay | None = None,
    haproxy_timeouts: dict[str, str] | None = None,
    service_port: int | None = None,
) -> bool:
    """Connected here: join `address`, else this process's Ray, else start a private one (address "local":
    never someone else's) with no dashboard, its Ray Serve in `mode`, its files in `local_ray`'s folder,
    HAProxy's own ports apart from the service's and the metrics'."""
    if ray.is_initialized():
        return False
    if address:
        check_reachable(address)
        ray.init(address=address)
        return True
    folder = local_ray.folder if local_ray is not None else None
    taken = [port for port in (service_port, metrics_port) if port]
    with single_machine_ray(), own_process_groups(), started_in(mode, folder, haproxy_timeouts, taken):
        ray.init(
            address="local",
            num_cpus=num_cpus,
            include_dashboard=False,
            _metrics_export_port=metrics_port,
            _temp_dir=os.path.join(folder, "ray") if folder else None,
        )
    return True


@contextlib.contextmanager
def single_machine_ray() -> Iterator[None]:
    """Ray's single-machine mode while a private Ray starts, so that its ports listen on loopback only
    (`_node_ip_address="127.0.0.1"` does not: Ray swaps a loopback address for a routable one)."""
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


def build_application(
    model: str | None = None,
    *,
    revision: str | None = None,
    backbone: str | None = None,
    pool: list[dict[str, Any]] | None = None,
    replicas: int = 1,
    cpus: int = DEFAULT_REPLICA_CPUS,
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    batch_wait_ms: float = 0.0,
    max_queries: int = DEFAULT_MAX_QUERIES,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    operating_point: str | None = None,
    access_log: bool = False,
    gateway: GatewaySettings | None = None,
) -> Any:
    """The service's one deployment: what serve() runs, and `serve run ...:app_builder` too."""
    return RouterService.options(
        num_replicas=replicas,
        ray_actor_options={"num_cpus": cpus},
        # A request waiting for its body or for the model costs a coroutine: stalled uploads fill
        # these slots only by the thousand. The model's own queue is bounded apart (a 503 when full).
        max_ongoing_requests=MAX_ONGOING_REQUESTS,
        # Stopping: the replica answers what it took, checked every 0.1 s, for up to DRAIN_TIMEOUT_S.
        graceful_shutdown_wait_loop_s=0.1,
        graceful_shutdown_timeout_s=DRAIN_TIMEOUT_S,
        health_check_period_s=2,
        max_constructor_retry_count=3,
        logging_config={"enable_access_log": access_log},
    ).bind(
        model,
        revision,
        backbone,
        pool,
        cpus,
        max_batch_size,
        batch_wait_ms / 1000,
        operating_point,
        max_queries,
        max_request_bytes,
        gateway=gateway,
    )


def app_builder(args: dict[str, str]) -> Any:
    """For `serve run benchgen_router.serving.service:app_builder key=value ...` (keys: docs/service.md)."""
    integers = (
        "replicas",
        "cpus",
        "max_batch_size",
        "max_queries",
        "max_request_bytes",
        "gateway_max_request_bytes",
        "gateway_max_response_bytes",
    )
    numbers = ("batch_wait_ms", "gateway_timeout_s")
    gateway_keys = (
        "route_on",
        "gateway_fallback",
        "gateway_timeout_s",
        "gateway_max_request_bytes",
        "gateway_max_response_bytes",
        "journal",
        "journal_text",
        "journal_max_bytes",
        "journal_max_days",
    )
    known = {"model", "revision", "backbone", "pool", "operating_point", *numbers, *integers, *gateway_keys}
    unknown = sorted(set(args) - known)
    if unknown:
        raise InputError(f"unknown argument(s) {', '.join(unknown)}; pass some of {', '.join(sorted(known))}.")
    settings: dict[str, Any] = {key: value for key, value in args.items() if key not in ("model", "pool")}
    if "journal_text" in settings:
        if settings["journal_text"] not in ("true", "false"):
            raise InputError(f"journal_text must be true or false, got {settings['journal_text']!r}.")
        settings["journal_text"] = settings["journal_text"] == "true"
    if "journal_max_bytes" in settings:  # a size as the command line takes it: 1073741824, 512MiB
        settings["journal_max_bytes"] = parse_max_bytes(settings["journal_max_bytes"])
    if "journal_max_days" in settings:
        settings["journal_max_days"] = parse_max_days(settings["journal_max_days"])
    for key in settings:
        if key in integers or key in numbers:
            try:
                settings[key] = int(settings[key]) if key in integers else float(settings[key])
            except ValueError:
                raise InputError(f"{key} must be a number, got {settings[key]!r}.") from None
            check_positive(key, settings[key], integer=key in integers)
    gateway_settings = {key: settings.pop(key) for key in gateway_keys if key in settings}
    pool = read_pool_file(args["pool"]) if "pool" in args else None
    gateway = read_gateway(args.get("pool"), args.get("model"), args.get("revision"), **gateway_settings)
    return build_application(args.get("model"), pool=pool, gateway=gateway, **settings)


def serve(
    model: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    replicas: int = 1,
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
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
    route_on: str = "last-user",
    gateway_fallback: str | None = None,
    gateway_timeout_s: float = GATEWAY_TIMEOUT_S,
    gateway_max_request_bytes: int = GATEWAY_MAX_REQUEST_BYTES,
    gateway_max_response_bytes: int = GATEWAY_MAX_RESPONSE_BYTES,
    journal: str | os.PathLike | None = None,
    journal_text: bool = False,
    journal_max_bytes: int | None = None,
    journal_max_days: float | None = None,
    throughput_mode: bool | None = None,
) -> RunningService | None:
    """Serve the router over HTTP on host:port (arguments and lifecycle: docs/service.md). Settings are
    checked before Ray starts, so that a mistake is one InputError line in a second, not a minute."""
    cpus = DEFAULT_REPLICA_CPUS if threads is None else threads
    check_service_settings(replicas, max_batch_size, cpus, max_queries, max_request_bytes, batch_wait_ms, ray_cpus)
    check_router_point(model, revision, operating_point)
    pool = read_pool_file(pool_file) if pool_file is not None else None
    gateway = read_gateway(
        pool_file,
        model,
        revision,
        route_on,
        gateway_fallback,
        gateway_timeout_s,
        gateway_max_request_bytes,
        gateway_max_response_bytes,
        journal,
        journal_text,
        journal_max_bytes,
        journal_max_days,
    )
    local = not address and not ray.is_initialized()
    mode, mode_fallback = choose_mode(throughput_mode, joins_running_ray=not local)
    if local:
        metrics_port = check_local_machine(host, port, replicas * cpus, ray_cpus, metrics_port)
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
        gateway=gateway,
    )
    plan = ServicePlan(
        router="the default router" if model is None else model,
        address=address,
        num_cpus=ray_cpus or max(os.cpu_count() or 1, replicas * cpus),
        metrics_port=metrics_port if local else None,
        host=host,
        port=port,
        system_log_level=system_log_level,
        access_log=access_log,
        replicas=replicas,
        cpus=cpus,
        gateway_agents=len(gateway.upstreams.agents) if gateway is not None else 0,
        gateway_timeout_s=gateway_timeout_s,
        mode=mode,
        mode_fallback=mode_fallback,
    )
    return run_service(application, plan, blocking)


@dataclass(frozen=True)
class ServicePlan:
    """Where and how serve() starts the service, once its settings are checked."""

    router: str  # as the start-up line names it
    address: str | None  # a Ray cluster to join
    num_cpus: int  # of a local Ray started for the service
    metrics_port: int | None  # of a local Ray started for the service
    host: str
    port: int
    system_log_level: str
    access_log: bool
    replicas: int
    cpus: int  # per replica
    gateway_agents: int = 0  # agents with an upstream: the OpenAI-compatible gateway is on
    gateway_timeout_s: float = GATEWAY_TIMEOUT_S
    mode: str | None = None  # Ray Serve's data plane in a Ray the service starts (serving.engine)
    mode_fallback: str | None = None  # why that is standard mode when throughput mode was wanted


def run_service(application: Any, plan: ServicePlan, blocking: bool) -> RunningService | None:
    """Start the service; blocking, serve until Ctrl-C or SIGTERM. Whatever stops it (a failure at start,
    a signal), what was started is shut down and the exception raised again, for the caller's exit code."""
    local_ray = new_local_ray() if plan.address is None and not ray.is_initialized() else None
    connected = False
    sigterm = SigtermOnce()
    try:
        if blocking:
            sigterm.install()
        connected = start_ray(
            plan.address, plan.num_cpus, plan.metrics_port, plan.mode, local_ray, haproxy_timeouts(plan), plan.port
        )
        if local_ray is not None:
            local_ray.watch()
        if blocking:
            sigterm.install()  # again after ray.init, which sets its own handler
        service = deploy(application, plan, local_ray, connected)
        log_started(service, plan)
        if not blocking:
            return service
        logger.info("press Ctrl-C to stop")
        while True:
            time.sleep(3600)
    except BaseException as err:
        if blocking and isinstance(err, (KeyboardInterrupt, Terminated)):
            why = "SIGTERM" if sigterm.received else "interrupted"
            logger.info("stopping (%s): answering the requests in flight", why)
        shutdown_service(local_ray, connected)
        if blocking:
            # The process ends next. Its last garbage collection would walk the whole heap (Ray, torch,
            # transformers): seconds on a busy machine, after everything has stopped. Frozen objects
            # are left out of it.
            gc.freeze()
        raise
    finally:
        sigterm.restore()  # only now: a second SIGTERM must not cut the drain short


def haproxy_timeouts(plan: ServicePlan) -> dict[str, str]:
    """HAProxy's own guards, behind the service's: a client silent for 3x the body timeout is cut (the
    service answers a 408 first); a replica silent for longer than a routed gateway call with its
    retry may take is cut too."""
    return {
        "RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S": str(int(3 * BODY_TIMEOUT_S)),
        "RAY_SERVE_HAPROXY_TIMEOUT_SERVER_S": str(int(2 * plan.gateway_timeout_s + 3 * BODY_TIMEOUT_S)),
    }


class SigtermOnce:
    """SIGTERM (a service manager stopping us) as Terminated, so that it takes Ctrl-C's clean path; raised
    once only, so that a second SIGTERM does not cut the drain short."""

    def __init__(self) -> None:
        self.received = False
        self.previous: Any = None

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, self.on_sigterm)

    def on_sigterm(self, signum: int, frame: object) -> None:
        if not self.received:
            self.received = True
            raise Terminated

    def restore(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)
            self.previous = None


def deploy(application: Any, plan: ServicePlan, local_ray: LocalRay | None, connected: bool) -> RunningService:
    """Run the application behind Ray Serve's HTTP front and wait for its replicas to load the router;
    InputError (one line) when they cannot serve it."""
    try:
        ray_serve.start(
            http_options={"host": plan.host, "port": plan.port},
            logging_config={"log_level": plan.system_log_level, "enable_access_log": plan.access_log},
        )
        ray_serve.run(application, name=APP_NAME, route_prefix="/")
    except (ray.exceptions.RayError, RuntimeError) as err:  # Serve's front or a replica failed to start
        raise InputError(
            f"the service did not start on {plan.host}:{plan.port}: {ray_failure(err)}; check that nothing else "
            "listens on that port (on a joined Ray, another Serve application may), or pass another --port."
        ) from None
    # A Serve already running on a joined Ray keeps its own host and port.
    from ray.serve.context import _get_global_client

    http = _get_global_client().http_config
    url = f"http://{http.host}:{http.port}"
    problem = wait_until_loaded(probe_url(http.host, http.port), LOAD_TIMEOUT_S)
    if problem:
        raise InputError(problem)
    return RunningService(
        url=url,
        metrics_url=f"http://{ray.util.get_node_ip_address()}:{plan.metrics_port}/metrics" if local_ray else None,
        local_ray=local_ray,
        connected=connected,
    )


def ray_failure(err: BaseException) -> str:
    """The innermost cause of a Ray failure, in one line: a task's error wraps the real one (`cause`),
    under lines that name the task, its pid and the traceback. HAProxy's output tells why it did not
    start in its first alert, after notices."""
    while isinstance(getattr(err, "cause", None), BaseException) and err.cause is not err:
        err = err.cause
    noise = ("ray::", "Traceback", "File ", "^")
    lines = [line.strip() for line in str(err).splitlines() if line.strip() and not line.strip().startswith(noise)]
    alerts = [line.split("[ALERT]", 1)[1].lstrip(" (0123456789):") for line in lines if "[ALERT]" in line]
    return (["HAProxy: " + alerts[0]] if alerts else lines or [type(err).__name__])[0][:300]


def probe_url(host: str, port: int) -> str:
    """Where this process reaches the service: loopback for a service on every interface."""
    reachable = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{reachable}]:{port}" if ":" in reachable else f"http://{reachable}:{port}"


def wait_until_loaded(url: str, timeout_s: float) -> str | None:
    """None once /healthz answers 200; the line a replica that cannot serve answers with ("failed").
    Until the route exists, Ray Serve's front answers 404 or 503 without JSON: asked again."""
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy: the service is local
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with direct.open(url + "/healthz", timeout=10):
                return None
        except urllib.error.HTTPError as err:
            with contextlib.suppress(ValueError):
                body = json.loads(err.read())
                if isinstance(body, dict) and body.get("status") == "failed":
                    return str(body.get("error"))
        except OSError:  # not listening yet
            pass
        time.sleep(0.1)
    return f"the router did not load within {timeout_s:g} s; see the replicas' log lines above."


def log_started(service: RunningService, plan: ServicePlan) -> None:
    if plan.mode_fallback:
        logger.warning("Ray Serve in standard mode: %s", plan.mode_fallback)
    modes = {engine.THROUGHPUT: "throughput mode (HAProxy)", engine.STANDARD: "standard mode", None: "the Ray's mode"}
    logger.info(
        "serving %s on %s (API at %s/docs%s); %d replica%s, %d CPU%s each; Ray Serve in %s",
        plan.router,
        service.url,
        service.url,
        f", metrics at {service.metrics_url}" if service.metrics_url else "",
        plan.replicas,
        "s" * (plan.replicas != 1),
        plan.cpus,
        "s" * (plan.cpus != 1),
        modes[plan.mode],
    )
    if plan.gateway_agents:
        logger.info("OpenAI-compatible gateway at %s/v1 in front of %d agents", service.url, plan.gateway_agents)
