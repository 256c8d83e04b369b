"""Where the time of a one-query request goes, in one run on loopback, one part at a time: the floor
under `benchgen-router bench service`'s latency at 1 client. From the project root:

    python scripts/latency_floor.py --requests 300 --modes throughput,standard

Three parts, each at 1 client with requests sent one after another:

1. The default router in-process on one torch thread (as each replica runs it): wall and CPU time
   per query in runs of 1 to 256 queries.
2. An empty Ray Serve app of the service's shape, on a Ray of its own per mode: one deployment that
   is the HTTP ingress (HAProxy in front in throughput mode, Ray Serve's proxy in standard mode),
   answering on its event loop, or handing the call to its one worker thread first, as the router
   replica does.
3. The service itself (serve() with the default router) in the same mode: /healthz, which runs no
   model, and /v1/route with one query.

The model's one-query cost (1) plus the empty app's (2) is what a request cannot go below; the
rest of (3) is the service's own work per request.
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
    """One deployment that is the HTTP ingress, like the service's: /nothing answers on the event loop,
    /via-thread hands the call to the replica's one worker thread first."""
    from fastapi import FastAPI
    from ray import serve

    api = FastAPI()

    # No CPU reserved: the replica is idle but for one request at a time.
    @serve.deployment(ray_actor_options={"num_cpus": 0})
    @serve.ingress(api)
    class Empty:
        def __init__(self) -> None:
            self.executor = ThreadPoolExecutor(1)

        @api.post("/nothing")
        async def nothing(self, body: dict) -> dict:
            return {"answer": body["query"]}

        @api.post("/via-thread")
        async def via_thread(self, body: dict) -> dict:
            answer = await asyncio.get_running_loop().run_in_executor(self.executor, str, body["query"])
            return {"answer": answer}

        def __del__(self) -> None:
            self.executor.shutdown()

    return Empty.bind()


def measure_mode(mode: str, requests: int) -> None:
    from ray import serve as ray_serve

    from benchgen_router.serving import free_port, serve
    from benchgen_router.serving.local_ray import new_local_ray, stop_local_ray
    from benchgen_router.serving.service import start_ray

    print(f"\n## Ray Serve in {mode} mode\n")
    print("| request | p50 ms |")
    print("| --- | ---: |")
    port = free_port()
    local_ray = new_local_ray()  # a private Ray in `mode`, stopped with nothing left, as serve() starts one
    try:
        start_ray(None, num_cpus=2, mode=mode, local_ray=local_ray)
        local_ray.watch()
        ray_serve.start(http_options={"host": HOST, "port": port}, logging_config={"enable_access_log": False})
        ray_serve.run(empty_app(), name="empty", route_prefix="/")
        with httpx.Client(base_url=f"http://{HOST}:{port}", trust_env=False, timeout=30) as http:
            for path, what in (
                ("/nothing", "empty app: the deployment answers on its event loop"),
                ("/via-thread", "empty app: ... after a hop to its worker thread (as the replica scores)"),
            ):
                call = functools.partial(http.post, path, json={"query": "x"})
                print(f"| {what} | {p50_ms(call, requests):.1f} |")
    finally:
        ray_serve.shutdown()
        stop_local_ray(local_ray)
    with (
        serve(None, port=free_port(), blocking=False, throughput_mode=mode == "throughput") as service,
        httpx.Client(base_url=service.url, trust_env=False, timeout=30) as http,
    ):
        body = {"queries": ["What is the derivative of x squared, and why?"]}
        print(f"| the service: /healthz (no model) | {p50_ms(lambda: http.get('/healthz'), requests):.1f} |")
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
