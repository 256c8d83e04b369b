"""What the OpenAI-compatible gateway adds, in one run on loopback: the latency of a chat completion
through the gateway against calling its upstream directly (the agent named, unrouted, and routed by
the default router; and routed by the same router in this process, then called directly), and how
many streams the gateway held open at once while /v1/route still answered. docs/gateway.md records
its output. From the project root:

    python scripts/gateway_overhead.py --requests 200 --streams 100,250,500,1000 --modes throughput,standard

The upstream is `transformers serve` over the tests' tiny random chat model (tests/upstream_server.py),
asked for one token; the held streams go to HeldUpstream, which never ends a stream. Each request kind
is sent in turn (direct, pass-through, routed, routed here, /v1/route), so that the machine's load and
the state of its caches fall on all of them alike.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

HOST = "127.0.0.1"
PROJECT_ROOT = Path(__file__).resolve().parents[1]
FIRST_CHUNK = {
    "id": "held",
    "object": "chat.completion.chunk",
    "choices": [{"index": 0, "delta": {"role": "assistant"}}],
}


class HeldUpstream:
    """An OpenAI-compatible upstream on 127.0.0.1 that never finishes an answer. A streamed request gets
    its status, a first chunk, then an SSE comment every `ping_s` (as a slow model's stream does) until
    the caller closes the connection; any other request gets nothing at all (a stalled upstream).

    `holding` counts the requests it holds now, `closed` those whose caller closed the connection, and
    `last_head` is the last request's line and headers."""

    def __init__(self, ping_s: float = 0.5) -> None:
        self.ping_s = ping_s
        self.holding = 0
        self.closed = 0
        self.last_head = b""
        self.port = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.server: asyncio.Server | None = None

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    def __enter__(self) -> HeldUpstream:
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self.hold, HOST, 0, backlog=4096), self.loop
        ).result(10)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            assert self.server is not None
            self.server.close()
            for task in asyncio.all_tasks() - {asyncio.current_task()}:
                task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    async def hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            body = json.loads(await reader.readexactly(length)) if length else {}
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, ConnectionError):
            writer.close()
            return
        streamed = isinstance(body, dict) and body.get("stream") is True
        self.last_head = head
        self.holding += 1
        try:
            if streamed:
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                    + chunk(f"data: {json.dumps(FIRST_CHUNK)}\n\n".encode())
                )
                await writer.drain()
            while True:
                try:
                    if not await asyncio.wait_for(reader.read(65536), self.ping_s):
                        break  # the caller closed the connection
                except TimeoutError:
                    if streamed:
                        writer.write(chunk(b": holding\n\n"))
                        await writer.drain()
            self.closed += 1
        except ConnectionError:
            self.closed += 1
        finally:
            self.holding -= 1
            writer.close()


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def percentiles(seconds: list[float]) -> tuple[float, float]:
    return 1000 * float(np.percentile(seconds, 50)), 1000 * float(np.percentile(seconds, 99))


def replica_rss_mb() -> float:
    total = 0
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "ServeReplica:benchgen-router:Router" in " ".join(process.cmdline()):
                total += process.memory_info().rss
    return total / 2**20


ROUTED_HERE = "routed in this process, then direct to the upstream"
ROUTER_ALONE = "the router alone, in this process (1 torch thread, as a replica)"


def latency_table(gateway: str, upstream, requests: int, held_agent: str) -> None:
    """p50/p99 of `requests` sequential calls of each kind, interleaved, and the gateway's two targets.

    The router's own one-query time is taken in the same interleaving, in this process with one torch
    thread (as a replica runs it), as the first half of a client that routes the query itself and then
    calls the agent directly. Timed in a loop of its own instead, with the caches its weights need kept
    warm, the run is about 1 ms faster than anywhere among the other calls, the replica's included."""
    from benchgen_router.bench.service_report import verdict
    from helpers import make_queries

    router = one_thread_router()
    queries = make_queries(40, seed=21)
    with httpx.Client(timeout=120, trust_env=False) as http:
        picks = http.post(f"{gateway}/v1/route", json={"queries": queries}).json()["results"]
        queries = [q for q, r in zip(queries, picks, strict=True) if r["picked_agent"] != held_agent]
        kinds = {
            "direct to the upstream": (f"{upstream.base_url}/chat/completions", upstream.model),
            "gateway, pass-through (agent named)": (f"{gateway}/v1/chat/completions", "frontier_a"),
            "gateway, routed (benchgen-router)": (f"{gateway}/v1/chat/completions", "benchgen-router"),
            ROUTED_HERE: (f"{upstream.base_url}/chat/completions", upstream.model),
            "/v1/route, the same query": (f"{gateway}/v1/route", None),
        }
        seconds: dict[str, list[float]] = {kind: [] for kind in [*kinds, ROUTER_ALONE]}
        for index in range(requests + 5):
            query = queries[index % len(queries)]
            for kind, (url, model) in kinds.items():
                body = (
                    {"queries": [query]}
                    if model is None
                    else {"model": model, "messages": [{"role": "user", "content": query}], "max_tokens": 1}
                )
                started = time.perf_counter()
                if kind == ROUTED_HERE:
                    router.route([query], [None])
                    routed_here = time.perf_counter()
                response = http.post(url, json=body)
                elapsed = time.perf_counter() - started
                if response.status_code != 200:
                    raise SystemExit(f"{kind}: {response.status_code} {response.text[:300]}")
                if index >= 5:  # the first calls warm connections and caches
                    seconds[kind].append(elapsed)
                    if kind == ROUTED_HERE:
                        seconds[ROUTER_ALONE].append(routed_here - started)
    direct = percentiles(seconds["direct to the upstream"])
    print(f"\n{requests} sequential requests of each kind, one token asked for (max_tokens=1):\n")
    print("| path | p50 ms | p99 ms | added p50 ms | added p99 ms |\n| --- | ---: | ---: | ---: | ---: |")
    for kind, values in seconds.items():
        p50, p99 = percentiles(values)
        added = "" if not kind.startswith("gateway") else f"{p50 - direct[0]:.1f}"
        added99 = "" if not kind.startswith("gateway") else f"{p99 - direct[1]:.1f}"
        print(f"| {kind} | {p50:.1f} | {p99:.1f} | {added} | {added99} |")
    passthrough = percentiles(seconds["gateway, pass-through (agent named)"])[0] - direct[0]
    routed = percentiles(seconds["gateway, routed (benchgen-router)"])[0]
    here = percentiles(seconds[ROUTED_HERE])[0]
    alone = percentiles(seconds[ROUTER_ALONE])[0]
    print(f"\n- pass-through adds {passthrough:.1f} ms p50 (target <= 2 ms: {verdict(passthrough <= 2)})")
    routed_adds = routed - direct[0]
    print(
        f"- routed adds {routed_adds:.1f} ms p50, the router's own one-query time {alone:.1f} ms + "
        f"{routed_adds - alone:.1f} ms (target <= + 3 ms: {verdict(routed_adds <= alone + 3)}); routing in this "
        f"process, then calling the agent, takes {here:.1f} ms: the gateway {routed - here:+.1f} ms"
    )


def one_thread_router() -> Any:
    """The default router in this process, on one torch thread as a replica runs it."""
    import torch

    from benchgen_router.loading import load_router
    from benchgen_router.routing import Router

    torch.set_num_threads(1)
    return Router(*load_router(None))


async def hold_streams(gateway: str, held: HeldUpstream, held_agent: str, count: int) -> tuple[int, list[float], float]:
    """Open `count` streams to the held agent, then time /v1/route while they stay open: (streams held
    open at both ends, /v1/route seconds, the replica's RSS in MB meanwhile)."""
    body = {"model": held_agent, "messages": [{"role": "user", "content": "hold"}], "stream": True}
    opened = asyncio.Event()
    started = 0
    release = asyncio.Event()

    async def one(http: httpx.AsyncClient) -> None:
        nonlocal started
        async with http.stream("POST", f"{gateway}/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                return
            chunks = response.aiter_raw()  # kept: a dropped iterator would close the connection
            await anext(chunks)
            started += 1
            if started == count:
                opened.set()
            await release.wait()

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=120, limits=limits, trust_env=False) as http:
        streams = [asyncio.create_task(one(http)) for _ in range(count)]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(opened.wait(), 120)
        routes = []
        for _ in range(20):
            begun = time.perf_counter()
            response = await http.post(f"{gateway}/v1/route", json={"queries": ["What is 2 + 2?"]})
            routes.append(time.perf_counter() - begun if response.status_code == 200 else float("inf"))
        held_now, rss = held.holding, replica_rss_mb()
        release.set()
        await asyncio.gather(*streams, return_exceptions=True)
    return min(started, held_now), routes, rss


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="sequential requests of each kind")
    parser.add_argument("--streams", default="100,250,500,1000", help="stream counts to hold, in turn")
    parser.add_argument(
        "--modes", default="throughput,standard", help="Ray Serve modes to measure in turn, each on a Ray of its own"
    )
    args = parser.parse_args()
    sys.path.insert(0, str(PROJECT_ROOT / "tests"))
    from benchgen_router.hardware import cpu_summary
    from benchgen_router.serving import free_port, serve
    from upstream_server import UpstreamServer, build_tiny_chat_model

    print(f"{datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}; {cpu_summary()}")
    agents = ["frontier_a", "frontier_b", "frontier_c", "open_mid", "open_cheap_reasoning"]
    held_agent = agents[-1]
    with tempfile.TemporaryDirectory() as folder, HeldUpstream() as held:
        model_dir = build_tiny_chat_model(Path(folder) / "chat-model")
        with UpstreamServer(model_dir) as upstream:
            pool = [
                {"agent_id": agent, "base_url": upstream.base_url, "model": upstream.model}
                if agent != held_agent
                else {"agent_id": agent, "base_url": held.base_url, "model": "held"}
                for agent in agents
            ]
            pool_file = Path(folder) / "agents.json"
            pool_file.write_text(json.dumps(pool))
            for mode in args.modes.split(","):
                print(f"\n## Ray Serve in {mode} mode")
                with serve(
                    None, port=free_port(), pool_file=pool_file, blocking=False, throughput_mode=mode == "throughput"
                ) as service:
                    measure(service.url, upstream, held, held_agent, args)


def measure(gateway: str, upstream, held: HeldUpstream, held_agent: str, args: argparse.Namespace) -> None:
    latency_table(gateway, upstream, args.requests, held_agent)
    print("\nStreams held open through the gateway (pass-through to an upstream that never ends them),")
    print("with 20 sequential /v1/route requests meanwhile:\n")
    print("| streams asked | held open | /v1/route p50 ms | /v1/route p99 ms | replica RSS MB |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for count in (int(n) for n in args.streams.split(",") if n):
        held_open, routes, rss = asyncio.run(hold_streams(gateway, held, held_agent, count))
        p50, p99 = percentiles(routes)
        print(f"| {count} | {held_open} | {p50:.0f} | {p99:.0f} | {rss:.0f} |")
        deadline = time.monotonic() + 60
        while held.holding and time.monotonic() < deadline:
            time.sleep(0.2)
        if held_open < count:
            break


if __name__ == "__main__":
    main()
