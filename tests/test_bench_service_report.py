"""bench/service_report.py: the table, the targets it checks and the warnings it counts, from rows and log lines
built here (no service is run)."""

from __future__ import annotations

from collections import Counter

import numpy as np

from benchgen_router.bench.service_report import Row, markdown, target_lines, warning_key, warning_lines

QUIET = "in-process run_router (1 torch thread), quiet"
BATCHED = "service, throughput mode, batching on (2x1 CPU, batch 64)"


IN_PROCESS = [
    Row(QUIET, "256 in one call", 50.0, np.array([]), cpu_ms=8.0),
    Row(QUIET, "1 query per call", 25.0, np.array([38.0, 40.0, 42.0]), cpu_ms=17.0),
]


def rows(service_rate: float, one_client_ms: float, cpu_ms: float = 12.0) -> list[Row]:
    return [
        *IN_PROCESS,
        Row(BATCHED, "1", 30.0, np.array([one_client_ms - 3, one_client_ms, one_client_ms + 3]), 0, 30.0, *JUDGED),
        Row(BATCHED, "32", service_rate, np.array([400.0, 500.0]), 0, cpu_ms, *JUDGED),
        Row(BATCHED + ", beside a CPU burner", "32", 99.0, np.array([900.0]), mode="throughput"),
    ]


JUDGED = ("throughput", True)


def test_targets_are_judged_against_the_best_quiet_in_process_figures():
    met = target_lines(rows(service_rate=40.0, one_client_ms=44.0))
    assert met[0].startswith(
        "- throughput mode, throughput at >= 32 clients: 40.0 q/s (32 clients) = 80% of in-process 50.0 q/s"
    )
    assert met[0].endswith("target >= 70%: met)")  # the burner row's 99 q/s does not count
    assert met[1].startswith("- throughput mode, CPU per query: 12.0 ms") and "in-process 8.0 ms" in met[1]
    assert met[1].endswith("= 1.50x (target <= 1.5x: met)")
    assert "median latency at 1 client: 44.0 ms vs in-process one query 40.0 ms" in met[2]
    assert met[2].endswith("+4.0 ms; target <= +5 ms: met)")
    missed = target_lines(rows(service_rate=30.0, one_client_ms=50.0, cpu_ms=20.0))
    assert missed[0].startswith("- throughput mode, throughput at >= 32 clients: 30.0 q/s (32 clients) = 60% of")
    assert missed[0].endswith("target >= 70%: missed)")
    assert missed[1].endswith("= 2.50x (target <= 1.5x: missed)")
    assert missed[2] == (
        f"- throughput mode, median latency at 1 client: 50.0 ms vs in-process one query 40.0 ms ({QUIET}; "
        "+10.0 ms; target <= +5 ms: missed)"
    )
    assert target_lines(IN_PROCESS) == []  # no service rows: nothing to judge


def test_each_mode_is_judged_on_its_own_rows():
    standard = [Row("service, standard mode", "32", 20.0, np.array([900.0]), 0, 30.0, "standard", True)]
    lines = target_lines(rows(service_rate=40.0, one_client_ms=44.0) + standard)
    assert [line.split(",")[0] for line in lines] == ["- throughput mode"] * 3 + ["- standard mode"] * 2
    assert lines[3].startswith("- standard mode, throughput at >= 32 clients: 20.0 q/s") and "40%" in lines[3]


def test_a_warning_repeated_is_a_flood_and_scattered_ones_are_not():
    scattered = Counter({f"WARNING message {n}": 1 for n in range(12)})
    assert warning_lines(scattered, "standard", 900)[0].endswith(": 0 (target no floods: met)")
    flood = Counter({"WARNING Failed to get queue length from Replica(id='#') within #s.": 40, "ERROR other": 1})
    lines = warning_lines(flood, "standard", 900)
    assert lines[0] == (
        "- standard mode, warnings and errors in Ray's logs: 41 lines over 900 requests; a message repeated "
        ">= 10 times: 1 (target no floods: missed)"
    )
    assert lines[1] == "  - x40: WARNING Failed to get queue length from Replica(id='#') within #s."


def test_markdown_has_a_line_per_row_and_blank_latencies_for_one_call():
    lines = markdown(rows(service_rate=40.0, one_client_ms=44.0))
    assert lines[0] == "| setup | concurrency | q/s | p50 ms | p95 ms | p99 ms | CPU ms/query | errors |"
    assert lines[2] == f"| {QUIET} | 256 in one call | 50.0 |  |  |  | 8.0 | 0 |"
    assert lines[3].startswith(f"| {QUIET} | 1 query per call | 25.0 | 40.0 | 41.8 | 42.0 | 17.0 |")
    assert len(lines) == 2 + 5


def test_warning_lines_of_each_log_format_are_found_and_masked():
    serve_line = (
        "WARNING 2026-12-02 07:40:46,535 serve 4131 -- Failed to get queue length from Replica(id='ab12cd34ef') "
        "within 0.1s."
    )
    assert warning_key(serve_line) == "WARNING Failed to get queue length from Replica(id=#) within #.#."
    ray_line = "2026-12-02 07:39:00,826\tERROR worker.py:85 -- Task 7 failed"
    assert warning_key(ray_line) == "ERROR Task # failed"
    assert warning_key("WARNING:benchgen_router.serving:a client disconnected after 12 bytes") == (
        "WARNING a client disconnected after # bytes"
    )
    capacity = (
        "WARNING 2026-12-02 09:01:02,003 serve 77 -- Replica at capacity of max_ongoing_requests=64, rejecting "
        "request 5f0c2a9e-1b7d-4c3e-a8f1-0d2b9c7e6a45."
    )
    assert warning_key(capacity) == "WARNING Replica at capacity of max_ongoing_requests=#, rejecting request #."
    assert warning_key("INFO 2026-12-02 07:40:46,535 serve 4131 -- Deleting app") is None
    assert warning_key("a line about WARNINGS in general") is None
