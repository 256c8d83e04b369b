"""Where the time of a one-query request goes, in one run on loopback: the figures docs/service.md
gives under "Why the targets are still missed". From the project root:

    python scripts/latency_floor.py --requests 300 --modes throughput,standard

Three parts, each at 1 client with requests sent one after another:

1. The default router in-process on one torch thread (as each replica runs it): CPU time per query
   in runs of 1 to 256 queries.
2. An empty Ray Serve app of the service's shape on a Ray of its own per mode: an ingress that
   answers by itself, one that calls a deployment returning its argument, and one whose deployment
   hands the call to a worker thread first, as the router replica does.
3. The service itself (serve() with the default router) in the same mode: /healthz, which calls no
   replica, and /v1/route with one query.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np

HOST = "127.0.0.1"
RUN_SIZES = (1, 4, 8, 16, 32, 64, 256)


def p50_ms(call: Callable[[], object], requests: int) -> float:
    for _ in range(max(10, requests // 10)):  # warm-up: connections, first-call costs
        call()
    times = []
    for _ in range(requests):
        started = time.perf_counter()
        call()
        times.append(1000 * (time.perf_counter() - started))
    return float(np.percentile(times, 50))


def model_costs() -> None:
    import torch

    from benchgen_router.bench.service import benchmark_queries
    from benchgen_router.loading import load_router
    from benchgen_router.routing import run_router

    router, tokenizer = load_router(None)
    queries = benchmark_queries(max(RUN_SIZES) * 4, seed=3)
    default_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_router(router, tokenizer, queries[:16])  # warm-up
        print("\nThe default router in-process on 1 torch thread, per query by run size:\n")
        print("| queries per run | wall ms per query | CPU ms per query |")
        print("| ---: | ---: | ---: |")
        for size in RUN_SIZES:
            runs = max(1, 256 // size)
            cpu, started = time.process_time(), time.perf_counter()
            for run in range(runs):
                first = (run * size) % len(queries)
                run_router(router, tokenizer, queries[first : first + size])
            wall_ms = 1000 * (time.perf_counter() - started) / (runs * size)
            print(f"| {size} | {wall_ms:.1f} | {1000 * (time.process_time() - cpu) / (runs * size):.1f} |")
    finally:
        torch.set_num_threads(default_threads)


def empty_app() -> object:
    """Front -> Echo and Front -> EchoViaThread, like the service's ingress -> router replica."""
    from ray import serve
    from starlette.requests import Request

    # No CPUs reserved: three replicas on two cores, each idle but for one request at a time.
    @serve.deployment(ray_actor_options={"num_cpus": 0})
    class Echo:
        def __init__(self, hand_off: bool) -> None:
            self.executor = ThreadPoolExecutor(1) if hand_off else None

        async def __call__(self, query: str) -> str:
            if self.executor is None:
                return query
            return await asyncio.get_running_loop().run_in_executor(self.executor, str, query)

        async def __del__(self) -> None:
            if self.executor is not None:
                self.executor.shutdown()

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    class Front:
        def __init__(self, echo: object, echo_via_thread: object) -> None:  # deployment handles
            self.targets = {"/echo": echo, "/echo-via-thread": echo_via_thread}

        async def __call__(self, request: Request) -> dict:
            query = (await request.json())["query"]
            target = self.targets.get(request.url.path)
            return {"answer": query if target is None else await target.remote(query)}

    return Front.bind(Echo.options(name="Echo").bind(False), Echo.options(name="EchoViaThread").bind(True))


def measure_mode(mode: str, requests: int) -> None:
    import ray
    from ray import serve as ray_serve

    from benchgen_router.serving import free_port, serve
    from benchgen_router.serving.service import start_ray

    print(f"\n## Ray Serve in {mode} mode\n")
    print("| request | p50 ms |")
    print("| --- | ---: |")
    port = free_port()
    start_ray(None, num_cpus=2, mode=mode)  # a private Ray in `mode`, as serve() starts one
    try:
        ray_serve.start(http_options={"host": HOST, "port": port}, logging_config={"enable_access_log": False})
        ray_serve.run(empty_app(), name="empty", route_prefix="/")
        with httpx.Client(base_url=f"http://{HOST}:{port}", trust_env=False, timeout=30) as http:
            for path, what in (
                ("/nothing", "empty app: the ingress answers by itself"),
                ("/echo", "empty app: the ingress calls a deployment"),
                ("/echo-via-thread", "empty app: ... whose call goes to a worker thread"),
            ):
                call = functools.partial(http.post, path, json={"query": "x"})
                print(f"| {what} | {p50_ms(call, requests):.1f} |")
    finally:
        ray_serve.shutdown()
        ray.shutdown()
    with (
        serve(None, port=free_port(), blocking=False, throughput_mode=mode == "throughput") as service,
        httpx.Client(base_url=service.url, trust_env=False, timeout=30) as http,
    ):
        body = {"queries": ["What is the derivative of x squared, and why?"]}
        print(f"| the service: /healthz | {p50_ms(lambda: http.get('/healthz'), requests):.1f} |")
        route = functools.partial(http.post, "/v1/route", json=body)
        print(f"| the service: /v1/route, one query | {p50_ms(route, requests):.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="sequential requests of each kind")
    parser.add_argument("--modes", default="throughput,standard", help="Ray Serve modes, each on a Ray of its own")
    args = parser.parse_args()
    from benchgen_router.hardware import cpu_summary

    print(f"{datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}; {cpu_summary()}")
    model_costs()
    for mode in args.modes.split(","):
        measure_mode(mode, args.requests)


if __name__ == "__main__":
    main()
