"""bench/service.py: what can be checked without starting a service (the report's rows and targets:
test_bench_service_report.py; the whole run against a real service is `benchgen-router bench service`)."""

from __future__ import annotations

from benchgen_router.bench.service import benchmark_queries, py_spy_summary


def test_benchmark_queries_are_seeded_questions():
    queries = benchmark_queries(20)
    assert queries == benchmark_queries(20) and queries != benchmark_queries(20, seed=1)
    assert all(q.endswith("?") for q in queries) and len(set(queries)) == 20


def test_py_spy_summary_counts_a_replicas_model_run_as_the_model(tmp_path):
    """py-spy's raw lines (stack, space, count) as it wrote them for a replica: the worker thread's
    model run, the event loop's HTTP handling, and a frame no bucket names."""
    worker = (
        "Thread.run (threading.py:982);_worker (concurrent/futures/thread.py:83);"
        "route_items (benchgen_router/serving/replica.py:40);Router.route (benchgen_router/routing.py:342);"
        "Router.score (benchgen_router/routing.py:290);RouterModel.forward (modeling_router.py:239)"
    )
    loop = "run_forever (asyncio/base_events.py:608);run_endpoint_function (fastapi/routing.py:380)"
    raw = tmp_path / "bench-service-throughput-router-replica-4242.txt"
    raw.write_text(f"{worker} 6\n{loop} 3\nselect (selectors.py:468) 1\n")
    assert py_spy_summary("router replica", raw) == [
        "py-spy, router replica 4242 (10 samples): model (Router.score) 60%, "
        "HTTP (uvicorn, starlette, fastapi) 30%, other (event loops, idle threads) 10%"
    ]
