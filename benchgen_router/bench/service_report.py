"""The service benchmark's report: its rows, the markdown table, the targets judged for each mode, and
the warnings of Ray's logs counted, so a flood shows (docs/benchmark.md, "The service under load")."""

from __future__ import annotations

import contextlib
import os
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from benchgen_router.hardware import cpu_summary

if TYPE_CHECKING:
    from benchgen_router.bench.service import ServiceBenchOptions

# "WARNING ... -- message" (Ray Serve), "... WARNING file.py:85 -- message" (Ray), "WARNING:name:message".
LOG_LEVEL = re.compile(r"\b(WARNING|ERROR)\b(?:.*? -- |:[\w.]*:)(.*)")
MASKED = re.compile(r"(?<=id=)'[^']*'|[\w-]*\d[\w-]*")  # ids, and every word with a digit (numbers, uuids)
FLOOD_LINES = 10  # the same warning this many times in one mode's run is a flood


@dataclass
class Row:
    setup: str
    concurrency: str
    rate: float  # queries per second
    latencies_ms: np.ndarray
    errors: int = 0
    cpu_ms: float | None = None  # CPU time of every process involved, per routed query
    mode: str | None = None  # the service's Ray Serve mode (serving.engine); None: in-process
    judged: bool = False  # a row the targets are judged on: batching on, one query per request, quiet

    def cells(self) -> list[str]:
        if len(self.latencies_ms):
            p50, p95, p99 = np.percentile(self.latencies_ms, [50, 95, 99])
            spread = [f"{p50:.1f}", f"{p95:.1f}", f"{p99:.1f}"]
        else:
            spread = ["", "", ""]
        cpu = "" if self.cpu_ms is None else f"{self.cpu_ms:.1f}"
        return [self.setup, self.concurrency, f"{self.rate:.1f}", *spread, cpu, str(self.errors)]


def markdown(rows: Sequence[Row]) -> list[str]:
    header = ["setup", "concurrency", "q/s", "p50 ms", "p95 ms", "p99 ms", "CPU ms/query", "errors"]
    lines = ["| " + " | ".join(header) + " |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    return lines + ["| " + " | ".join(row.cells()) + " |" for row in rows]


def target_lines(rows: Sequence[Row]) -> list[str]:
    """The targets for each mode measured, against the best quiet in-process figures (torch's default
    thread count can be far from the best on a busy machine)."""
    quiet = [r for r in rows if r.mode is None and "quiet" in r.setup]
    if not quiet:
        return []
    in_process = max((r for r in quiet if "one call" in r.concurrency), key=lambda r: r.rate)
    single = min((r for r in quiet if "per call" in r.concurrency), key=lambda r: float(np.median(r.latencies_ms)))
    cheapest = min((r for r in quiet if "one call" in r.concurrency), key=lambda r: r.cpu_ms or np.inf)
    lines = []
    for mode in dict.fromkeys(r.mode for r in rows if r.mode is not None):
        judged = [r for r in rows if r.mode == mode and r.judged]
        loaded = [r for r in judged if int(r.concurrency) >= 32]
        one = next((r for r in judged if r.concurrency == "1"), None)
        if loaded:
            best = max(loaded, key=lambda r: r.rate)
            share = 100 * best.rate / in_process.rate
            lines.append(
                f"- {mode} mode, throughput at >= 32 clients: {best.rate:.1f} q/s ({best.concurrency} clients) = "
                f"{share:.0f}% of in-process {in_process.rate:.1f} q/s ({in_process.setup}; target >= 70%: "
                f"{verdict(share >= 70)})"
            )
            if best.cpu_ms and cheapest.cpu_ms:
                ratio = best.cpu_ms / cheapest.cpu_ms
                lines.append(
                    f"- {mode} mode, CPU per query: {best.cpu_ms:.1f} ms (all the service's processes and the "
                    f"client) vs in-process {cheapest.cpu_ms:.1f} ms ({cheapest.setup}) = {ratio:.2f}x "
                    f"(target <= 1.5x: {verdict(ratio <= 1.5)})"
                )
        if one is not None and len(one.latencies_ms):
            p50, reference = float(np.median(one.latencies_ms)), float(np.median(single.latencies_ms))
            lines.append(
                f"- {mode} mode, median latency at 1 client: {p50:.1f} ms vs in-process one query "
                f"{reference:.1f} ms ({single.setup}; {p50 - reference:+.1f} ms; target <= +5 ms: "
                f"{verdict(p50 <= reference + 5)})"
            )
    return lines


def verdict(met: bool) -> str:
    return "met" if met else "missed"


def log_warnings() -> Counter:
    """Warning and error lines in the log files of this process's Ray, by message, with numbers and ids
    masked, so that one message repeated counts as one entry: a flood is one entry seen many times."""
    import ray

    logs = Path(ray._private.worker._global_node.get_logs_dir_path())  # no public API names the folder
    counts: Counter = Counter()
    for path in logs.rglob("*"):
        if not path.is_file() or path.suffix not in (".log", ".err", ".out"):
            continue
        with contextlib.suppress(OSError):
            counts.update(filter(None, map(warning_key, path.read_text(errors="replace").splitlines())))
    return counts


def warning_key(line: str) -> str | None:
    """ "LEVEL message" of a warning or error line, numbers and ids masked; None for other lines."""
    found = LOG_LEVEL.search(line)
    return None if found is None else f"{found.group(1)} {MASKED.sub('#', found.group(2).strip())[:100]}"


def warning_lines(counts: Counter, mode: str, requests: int) -> list[str]:
    total = sum(counts.values())
    floods = {message: n for message, n in counts.items() if n >= FLOOD_LINES}
    verdict = "missed" if floods else "met"
    lines = [
        f"- {mode} mode, warnings and errors in Ray's logs: {total} line{'s' * (total != 1)} over {requests} "
        f"requests; a message repeated >= {FLOOD_LINES} times: {len(floods)} (target no floods: {verdict})"
    ]
    lines += [f"  - x{n}: {message}" for message, n in counts.most_common(3)]
    return lines


def report_text(
    options: ServiceBenchOptions, rows: Sequence[Row], extra: Sequence[str], load_before: tuple[float, float, float]
) -> str:
    """The machine and its load first: on a shared machine other work skews every figure."""
    load_after = os.getloadavg()
    report = [
        f"Service load benchmark: default router, 127.0.0.1; one query per request unless a row says; at most "
        f"{options.requests} requests / {options.seconds:g} s per level; Ray Serve modes {', '.join(options.modes)}.",
        f"CPU: {cpu_summary()}.",
        f"Load average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f}.",
        "",
        *markdown(rows),
        "",
        *target_lines(rows),
    ]
    if extra:
        report += ["", *extra]
    return "\n".join(report) + "\n"
