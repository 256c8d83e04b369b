"""bench/service.py: the table and the targets it checks, from rows built here (no service is run)."""

from __future__ import annotations

import numpy as np

from benchgen_router.bench.service import Row, benchmark_queries, markdown, target_lines

QUIET = "in-process run_router (1 torch thread), quiet"
BATCHED = "service, batching on (2x1 CPU, batch 32)"


IN_PROCESS = [
    Row(QUIET, "256 in one call", 50.0, np.array([]), cpu_ms=8.0),
    Row(QUIET, "1 query per call", 25.0, np.array([38.0, 40.0, 42.0]), cpu_ms=17.0),
]


def rows(service_rate: float, one_client_ms: float) -> list[Row]:
    return [
        *IN_PROCESS,
        Row(BATCHED, "1", 30.0, np.array([one_client_ms - 3, one_client_ms, one_client_ms + 3]), cpu_ms=30.0),
        Row(BATCHED, "32", service_rate, np.array([400.0, 500.0]), cpu_ms=20.0),
        Row(BATCHED + ", beside a CPU burner", "32", 99.0, np.array([900.0])),
    ]


def test_targets_are_judged_against_the_best_quiet_in_process_figures():
    met = target_lines(rows(service_rate=40.0, one_client_ms=44.0))
    assert met[0].startswith("- throughput at >= 32 clients: 40.0 q/s (32 clients) = 80% of in-process 50.0 q/s")
    assert met[0].endswith("target >= 70%: met)")  # the burner row's 99 q/s does not count
    assert met[1].startswith("- CPU per query: service 20.0 ms") and "in-process 8.0 ms" in met[1]
    assert "median latency at 1 client: 44.0 ms vs in-process one query 40.0 ms" in met[2]
    assert met[2].endswith("+4.0 ms; target <= +5 ms: met)")
    missed = target_lines(rows(service_rate=30.0, one_client_ms=50.0))
    assert missed[0].startswith("- throughput at >= 32 clients: 30.0 q/s (32 clients) = 60% of in-process")
    assert missed[0].endswith("target >= 70%: missed)")
    assert missed[2] == (
        f"- median latency at 1 client: 50.0 ms vs in-process one query 40.0 ms ({QUIET}; +10.0 ms; "
        "target <= +5 ms: missed)"
    )
    assert target_lines(IN_PROCESS) == []  # no service rows: nothing to judge


def test_markdown_has_a_line_per_row_and_blank_latencies_for_one_call():
    lines = markdown(rows(service_rate=40.0, one_client_ms=44.0))
    assert lines[0] == "| setup | concurrency | q/s | p50 ms | p95 ms | p99 ms | CPU ms/query | errors |"
    assert lines[2] == f"| {QUIET} | 256 in one call | 50.0 |  |  |  | 8.0 | 0 |"
    assert lines[3].startswith(f"| {QUIET} | 1 query per call | 25.0 | 40.0 | 41.8 | 42.0 | 17.0 |")
    assert len(lines) == 2 + 5


def test_benchmark_queries_are_seeded_questions():
    queries = benchmark_queries(20)
    assert queries == benchmark_queries(20) and queries != benchmark_queries(20, seed=1)
    assert all(q.endswith("?") for q in queries) and len(set(queries)) == 20
