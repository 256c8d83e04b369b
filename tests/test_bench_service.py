"""bench/service.py: what can be checked without starting a service (the report's rows and targets:
test_bench_service_report.py; the whole run against a real service is `benchgen-router bench service`)."""

from __future__ import annotations

from benchgen_router.bench.service import benchmark_queries


def test_benchmark_queries_are_seeded_questions():
    queries = benchmark_queries(20)
    assert queries == benchmark_queries(20) and queries != benchmark_queries(20, seed=1)
    assert all(q.endswith("?") for q in queries) and len(set(queries)) == 20
