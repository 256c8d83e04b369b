"""Normal traffic to the service alone, then beside abuse, in one run: the share of normal requests
answered, their p50/p99, and the memory of the service's processes before and after each phase.
docs/service.md records its output. From the project root:

    python scripts/service_abuse.py --seconds 8

Phases (each bounded in time and in requests): normal traffic alone; beside 64 clients that send
headers and one byte of a body, then stall; beside 4 chunked uploads of 64 MiB each against a
4 KiB limit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import psutil

from benchgen_router.hardware import cpu_summary
from benchgen_router.serving import free_port, serve

QUERIES = [f"What is {i} times {i + 7}, and why is the product even or odd?" for i in range(64)]
REQUEST_LINE = b"POST /v1/route HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
STALLED_HEAD = REQUEST_LINE + b"Content-Length: 200\r\n\r\n{"
CHUNKED_HEAD = REQUEST_LINE + b"Transfer-Encoding: chunked\r\n\r\n"
CHUNK = b"10000\r\n" + b"x" * 65536 + b"\r\n"


def routed_ok(url: str, query: str) -> bool:
    body = json.dumps({"queries": [query]}).encode()
    req = urllib.request.Request(url + "/v1/route", data=body, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as response:
            return response.status == 200 and bool(json.loads(response.read())["results"])
    except (urllib.error.URLError, OSError, ValueError):
        return False


def abuse(url: str, head: bytes, chunks: list[bytes]) -> bytes:
    """Send `head` and `chunks`, then wait for the answer (a stalled client sends nothing more)."""
    host, port = url.removeprefix("http://").split(":")
    answer = b""
    with socket.create_connection((host, int(port)), timeout=60) as connection:
        connection.sendall(head)
        for chunk in chunks:
            try:
                connection.sendall(chunk)
            except OSError:  # refused at the limit, connection closed
                break
        with contextlib.suppress(OSError):
            while (piece := connection.recv(65536)) and b"\r\n\r\n" not in answer:
                answer += piece
    return answer[:12]


def service_rss_mb() -> dict[str, float]:
    roles = {"router replica": 0.0, "proxy (HAProxy or Ray Serve's)": 0.0}
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            title = " ".join(process.cmdline())
            role = (
                "router replica"
                if "ServeReplica:benchgen-router:Router" in title
                else "proxy (HAProxy or Ray Serve's)"
                if "ProxyActor" in title or Path(process.cmdline()[0]).name == "haproxy"
                else None
            )
            if role:
                roles[role] += process.memory_info().rss / 2**20
    return roles


def normal_traffic(url: str, clients: int, seconds: float, limit: int) -> tuple[int, int, list[float]]:
    """(sent, answered, latencies in s) of `clients` clients sending one query per request."""
    latencies: list[float] = []
    answered = 0
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def client(worker: int) -> None:
        nonlocal answered
        for index in range(limit // clients):
            if time.monotonic() > stop_at:
                return
            started = time.perf_counter()
            ok = routed_ok(url, QUERIES[(worker * 13 + index) % len(QUERIES)])
            with lock:
                latencies.append(time.perf_counter() - started)
                answered += ok

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    return len(latencies), answered, latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="normal traffic per phase")
    parser.add_argument("--clients", type=int, default=4, help="normal clients")
    parser.add_argument("--requests", type=int, default=800, help="normal requests per phase at most")
    args = parser.parse_args()
    rows = []
    with serve(None, port=free_port(), max_request_bytes=4096, blocking=False) as service:
        url = service.url
        normal_traffic(url, args.clients, 2.0, 40)  # warm-up
        phases = [
            ("normal traffic alone", None),
            ("beside 64 stalled uploads", (STALLED_HEAD, [], 64)),
            ("beside 4 chunked 64 MiB uploads", (CHUNKED_HEAD, [CHUNK] * 1024, 4)),
        ]
        for name, attack in phases:
            before = service_rss_mb()
            with ThreadPoolExecutor(64) as pool:
                attackers = [pool.submit(abuse, url, attack[0], attack[1]) for _ in range(attack[2])] if attack else []
                time.sleep(1.0 if attack else 0.0)
                sent, answered, latencies = normal_traffic(url, args.clients, args.seconds, args.requests)
                abusers = sorted({future.result(timeout=120).decode(errors="replace") for future in attackers})
            after = service_rss_mb()
            rows.append((name, sent, answered, latencies, before, after, abusers))
    print(f"CPU: {cpu_summary()}; {args.clients} normal clients, one query per request, {args.seconds:g} s per phase\n")
    print("| phase | normal requests | answered | p50 ms | p99 ms | RSS MB (replica / proxy) | abusers got |")
    print("| --- | ---: | ---: | ---: | ---: | --- | --- |")
    for name, sent, answered, latencies, before, after, abusers in rows:
        rss = " / ".join(f"{before[role]:.0f} -> {after[role]:.0f}" for role in before)
        print(
            f"| {name} | {sent} | {100 * answered / max(1, sent):.1f}% | {1000 * np.median(latencies):.0f} | "
            f"{1000 * np.percentile(latencies, 99):.0f} | {rss} | {', '.join(abusers) or '-'} |"
        )


if __name__ == "__main__":
    main()
