"""The HTTP routing service under load, against routing in-process, as one markdown table.

The service is serve() as users start it: one deployment, whose replicas (RouterService,
serving/app.py) are the HTTP ingress. Each reads and checks a request on its event loop and scores it
on its one worker thread, merged with the other requests waiting. In throughput mode HAProxy forwards
to the replicas directly; in standard mode Ray Serve's Python proxy does. A service is worth its
overhead only if it keeps most of in-process throughput under concurrency and adds little latency at
one client; the rows and targets are in docs/benchmark.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchgen_router.bench.service_report import Row, log_warnings, report_text, warning_lines
from benchgen_router.loading import load_router
from benchgen_router.routing import Router, run_router
from benchgen_router.serving import free_port, serve
from benchgen_router.serving.engine import STANDARD, THROUGHPUT, throughput_mode_problem
from benchgen_router.serving.replica import DEFAULT_MAX_BATCH_SIZE

logger = logging.getLogger("benchgen_router")

CONCURRENCY = (1, 8, 32, 128)
ROLES = ("router replica", "Ray Serve proxy", "HAProxy and its manager", "other Ray processes")
BURNER = "bench-service-cpu-burner"  # in the burner's command line, so its CPU time is left out
SUBJECTS = ("derivative", "integral", "prime", "triangle", "enzyme", "matrix", "treaty", "glacier", "orbit", "sonnet")
VERBS = ("Explain", "Compute", "Prove", "Describe", "Estimate", "Compare", "Summarise", "Find")


def benchmark_queries(count: int, seed: int = 0) -> list[str]:
    """Questions of a few words to a few sentences, like real routing traffic."""
    rng = np.random.default_rng(seed)
    queries = []
    for _ in range(count):
        parts = [f"{rng.choice(VERBS)} the {rng.choice(SUBJECTS)} of {int(rng.integers(2, 999))}"]
        parts += [f"then relate it to the {rng.choice(SUBJECTS)}" for _ in range(int(rng.integers(0, 6)))]
        queries.append(", ".join(parts) + "?")
    return queries


# ---------------------------------------------------------------------------------------------
# Background CPU load


@contextlib.contextmanager
def cpu_burner(active: bool, seconds: float) -> Iterator[None]:
    """A background process spinning on one core for at most `seconds` (killed on leaving)."""
    if not active:
        yield
        return
    spin = f"import time  # {BURNER}\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"
    burner = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(0.5)
        yield
    finally:
        burner.kill()
        burner.wait()


# ---------------------------------------------------------------------------------------------
# In-process


def in_process_rows(router: Any, tokenizer: Any, queries: Sequence[str], samples: int, label: str) -> list[Row]:
    """Throughput of one run_router call over every query and latency of one-query calls: the
    service's ceiling and floor, at torch's current thread count."""
    import torch

    run_router(router, tokenizer, queries[:16])  # warm-up
    cpu, started = time.process_time(), time.perf_counter()
    run_router(router, tokenizer, queries)
    rate = len(queries) / (time.perf_counter() - started)
    batch_cpu = 1000 * (time.process_time() - cpu) / len(queries)
    latencies = []
    cpu = time.process_time()
    for query in queries[:samples]:
        started = time.perf_counter()
        run_router(router, tokenizer, [query])
        latencies.append(1000 * (time.perf_counter() - started))
    single_cpu = 1000 * (time.process_time() - cpu) / samples
    threads = torch.get_num_threads()
    setup = f"in-process run_router ({threads} torch thread{'s' * (threads != 1)}){label}"
    return [
        Row(setup, f"{len(queries)} in one call", rate, np.array([]), cpu_ms=batch_cpu),
        Row(setup, "1 query per call", 1000 / float(np.mean(latencies)), np.array(latencies), cpu_ms=single_cpu),
    ]


def in_process_all(queries: Sequence[str], samples: int, label: str) -> list[Row]:
    """In-process rows with torch's default threads, then with 1 thread (as each replica runs)."""
    import torch

    router, tokenizer = load_router(None)
    default = torch.get_num_threads()
    rows = in_process_rows(router, tokenizer, queries, samples, label)
    if default != 1:
        torch.set_num_threads(1)
        try:
            rows += in_process_rows(router, tokenizer, queries, samples, label)
        finally:
            torch.set_num_threads(default)
    return rows


# ---------------------------------------------------------------------------------------------
# Against the service


async def load_level(
    url: str, queries: Sequence[str], concurrency: int, requests: int, seconds: float, per_request: int = 1
) -> Row:
    """`concurrency` closed-loop clients until `requests` were sent or `seconds` passed; the rate
    counts queries, so requests of several queries compare with one-query ones."""
    import aiohttp

    latencies: list[float] = []
    errors = 0
    sent = 0
    deadline = time.perf_counter() + seconds
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def client() -> None:
            nonlocal sent, errors
            while sent < requests and time.perf_counter() < deadline:
                first = (sent * per_request) % len(queries)
                batch = [queries[(first + i) % len(queries)] for i in range(per_request)]
                sent += 1
                started = time.perf_counter()
                try:
                    async with session.post(url, json={"queries": batch}) as response:
                        await response.read()
                        ok = response.status == 200
                except (TimeoutError, aiohttp.ClientError):
                    ok = False
                if ok:
                    latencies.append(1000 * (time.perf_counter() - started))
                else:
                    errors += 1

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return Row("", str(concurrency), per_request * len(latencies) / elapsed, np.array(latencies), errors)


def service_rows(
    url: str,
    queries: Sequence[str],
    setup: str,
    levels: Sequence[int],
    requests: int,
    seconds: float,
    per_request: int = 1,
) -> list[Row]:
    asyncio.run(load_level(url, queries, 4, 40, 10))  # warm-up: connections, first batches
    rows = []
    for concurrency in levels:
        pids = [pid for role in serve_processes().values() for pid in role] + [os.getpid()]
        before = cpu_seconds(pids)
        row = asyncio.run(load_level(url, queries, concurrency, requests, seconds, per_request))
        row.cpu_ms = 1000 * (cpu_seconds(pids) - before) / max(1, per_request * len(row.latencies_ms))
        row.setup = setup
        rows.append(row)
        logger.info("%s, %d clients: %.1f q/s", setup, concurrency, row.rate)
    return rows


# ---------------------------------------------------------------------------------------------
# Where the time goes


def serve_processes() -> dict[str, list[int]]:
    """Pids of the service's processes by role, found by the titles Ray gives its workers."""
    import psutil

    roles: dict[str, list[int]] = {role: [] for role in ROLES}
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            title = " ".join(child.cmdline())
            if BURNER in title or "py-spy" in title:
                continue
            if "ServeReplica" in title:  # the service's one deployment: reads, checks and scores
                roles["router replica"].append(child.pid)
            elif "ProxyActor" in title:
                roles["Ray Serve proxy"].append(child.pid)
            elif Path((child.cmdline() or [""])[0]).name == "haproxy" or "HAProxyManager" in title:
                roles["HAProxy and its manager"].append(child.pid)
            else:
                roles["other Ray processes"].append(child.pid)
    return roles


def cpu_seconds(pids: Sequence[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    return total


def profile_level(
    url: str, queries: Sequence[str], concurrency: int, requests: int, seconds: float, py_spy: bool, mode: str
) -> list[str]:
    """CPU ms per routed query by process (the client is this one) and, with py-spy, what the
    replicas' and the proxy's samples were doing: where the service's overhead goes."""
    roles = serve_processes()
    roles["client (this process)"] = [os.getpid()]
    before = {role: cpu_seconds(pids) for role, pids in roles.items()}
    spies = []
    spy_binary = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if py_spy and spy_binary is None:
        logger.warning("py-spy not found (pip install py-spy): CPU times only")
    if py_spy and spy_binary:
        for role in ("router replica", "Ray Serve proxy"):
            for pid in roles[role]:
                out = Path(tempfile.gettempdir()) / f"bench-service-{mode}-{role.replace(' ', '-')}-{pid}.txt"
                command = [spy_binary, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "50", "-f", "raw"]
                spies.append((role, out, subprocess.Popen([*command, "-o", str(out), "--nonblocking"])))
    row = asyncio.run(load_level(url, queries, concurrency, requests, seconds))
    routed = max(1, len(row.latencies_ms))
    lines = [
        f"{mode.capitalize()} mode, CPU time per routed query at {concurrency} clients ({row.rate:.1f} q/s, "
        "batching on):",
        "",
        "| process | CPU ms per query |",
        "| --- | ---: |",
    ]
    for role, pids in roles.items():
        lines.append(f"| {role} | {1000 * (cpu_seconds(pids) - before[role]) / routed:.2f} |")
    for role, out, spy in spies:
        spy.wait(timeout=seconds + 30)
        lines += ["", *py_spy_summary(role, out)]
    return lines


def py_spy_summary(role: str, path: Path) -> list[str]:
    """Shares of py-spy samples (all threads) by what they were doing."""
    if not path.exists():
        return [f"py-spy wrote no profile of the {role} (is py-spy installed, may it ptrace?)."]
    buckets = {
        "model (Router.score)": (f"{Router.score.__qualname__} (",),  # the one place every model run goes through
        "request checks": ("parse_route_body", "read_body"),
        "batch merging": ("BatchMerger", "drain (", "submit ("),
        "HTTP (uvicorn, starlette, fastapi)": ("uvicorn", "starlette", "fastapi"),
        "Ray core (actor calls, object refs)": ("ray/_private", "ray/actor.py", "_raylet"),
    }
    counts: Counter = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, number = line.rpartition(" ")
        if not number.isdigit():
            continue
        total += int(number)
        for name, needles in buckets.items():
            if any(needle in stack for needle in needles):
                counts[name] += int(number)
                break
        else:
            counts["other (event loops, idle threads)"] += int(number)
    shares = ", ".join(f"{name} {100 * n / max(1, total):.0f}%" for name, n in counts.most_common())
    return [f"py-spy, {role} {path.stem.rsplit('-', 1)[-1]} ({total} samples): {shares}"]


# ---------------------------------------------------------------------------------------------
# The run


@dataclass(frozen=True)
class ServiceBenchOptions:
    """One run's bounds and service settings, as the command takes them."""

    requests: int = 1500
    seconds: float = 12.0
    queries: int = 256
    samples: int = 50
    replicas: int = 2
    threads: int = 1
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    batch_wait_ms: float = 0.0
    profile: bool = False
    skip_load: bool = False
    modes: tuple[str, ...] = (THROUGHPUT, STANDARD)


def run_service_benchmark(options: ServiceBenchOptions) -> str:
    """The whole benchmark as the markdown report: in-process rows first, then the service's in each
    mode, one after the other in this one run."""
    queries = benchmark_queries(options.queries)
    load_before = os.getloadavg()
    bound = options.seconds * len(CONCURRENCY) * 3 + 300  # the burner never outlives the run
    rows = measure_in_process(queries, options, bound)
    extra: list[str] = []
    for mode in options.modes:
        problem = throughput_mode_problem() if mode == THROUGHPUT else None
        if problem:
            extra.append(f"- {mode} mode not measured: {problem}")
            continue
        served, mode_extra = measure_service(queries, options, bound, mode)
        rows += served
        extra += mode_extra
    return report_text(options, rows, extra, load_before)


def measure_in_process(queries: Sequence[str], options: ServiceBenchOptions, bound: float) -> list[Row]:
    rows = in_process_all(queries, options.samples, ", quiet")
    if not options.skip_load:
        with cpu_burner(True, bound):
            rows += in_process_all(queries, options.samples, ", beside a CPU burner")
    return rows


def measure_service(
    queries: Sequence[str], options: ServiceBenchOptions, bound: float, mode: str
) -> tuple[list[Row], list[str]]:
    """One service in `mode` on a Ray of its own: batching on (with several queries per request, and
    beside the burner), then off; the warnings its logs gathered, and the profile when asked for."""
    port = free_port()
    common: dict[str, Any] = {"port": port, "replicas": options.replicas, "threads": options.threads, "blocking": False}
    extra: list[str] = []
    limits = (options.requests, options.seconds)
    size = f"{options.replicas}x{options.threads} CPU"
    service = serve(
        None,
        max_batch_size=options.max_batch_size,
        batch_wait_ms=options.batch_wait_ms,
        throughput_mode=mode == THROUGHPUT,
        **common,
    )
    try:
        url = service.url + "/v1/route"
        setup = f"service, {mode} mode, batching on ({size}, batch {options.max_batch_size})"
        rows = service_rows(url, queries, setup, CONCURRENCY, *limits)
        for row in rows:
            row.judged = True
        # Several queries per request: Ray Serve's cost per request is shared by them.
        rows += service_rows(url, queries, f"{setup}, 8 queries per request", (32,), *limits, 8)
        if options.profile:
            extra += ["", *profile_level(url, queries, 32, options.requests, options.seconds, True, mode)]
        if not options.skip_load:
            with cpu_burner(True, bound):
                rows += service_rows(url, queries, setup + ", beside a CPU burner", (1, 32), *limits)
        # Joins this process's Ray (so in the same mode) and replaces the application: batches of one.
        serve(None, max_batch_size=1, batch_wait_ms=0.0, **common)
        setup = f"service, {mode} mode, batching off ({size}, batch 1)"
        rows += service_rows(url, queries, setup, CONCURRENCY, *limits)
        sent = sum(len(row.latencies_ms) + row.errors for row in rows)
        warnings = log_warnings()
    finally:
        service.close()
    for row in rows:
        row.mode = mode
    return rows, [*warning_lines(warnings, mode, sent), *extra]


if __name__ == "__main__":  # deprecated way in, kept until the next minor version
    from benchgen_router.bench import hand_over_to_command

    hand_over_to_command("benchgen_router.bench.service", ["bench", "service"])
