"""The engine behind the gateway plugins: one load per process, forward passes on its own worker thread,
concurrent requests merged into shared passes, and a request's failure kept to that request."""

from __future__ import annotations

import asyncio
import shutil
import threading

import pytest

from benchgen_router import pick_agent
from benchgen_router.integrations import engine as engine_module
from benchgen_router.integrations.engine import RouterEngine, RouterSource, RoutingFailed, engine_for
from benchgen_router.routing import get_router
from helpers import make_queries


def route_all(engine: RouterEngine, queries: list[str], **settings: str) -> list:
    async def gather() -> list:
        return await asyncio.gather(*(engine.route(query, **settings) for query in queries), return_exceptions=True)

    return asyncio.run(gather())


def test_concurrent_requests_share_forward_passes_and_get_pick_agents_results(converted):
    folder = converted[0][0]
    engine = RouterEngine(RouterSource(str(folder)))
    queries = make_queries(24, seed=5)
    results = route_all(engine, queries)
    assert engine.queries == 24
    assert engine.passes < 6, f"{engine.passes} forward passes for 24 concurrent requests: they were not merged"
    expected = pick_agent(queries, model=folder)
    assert [result["picked_agent"] for result in results] == [result["picked_agent"] for result in expected]
    for result, reference in zip(results, expected, strict=True):
        assert result["probabilities"] == pytest.approx(reference["probabilities"], abs=1e-6)


def test_the_forward_pass_runs_on_the_worker_thread_not_the_event_loop(converted):
    folder = converted[8][0]
    engine = RouterEngine(RouterSource(str(folder)))
    model, _ = get_router(str(folder))
    seen: list[str] = []
    hook = model.backbone.register_forward_hook(lambda *args: seen.append(threading.current_thread().name))
    try:

        async def route() -> str:
            await engine.route("Explain the derivative of 3?")
            return threading.current_thread().name

        loop_thread = asyncio.run(route())
    finally:
        hook.remove()
    assert seen and all(name.startswith("benchgen-router") for name in seen), seen
    assert loop_thread not in seen


def test_event_loops_in_several_threads_route_at_once(converted):
    """An SDK caller may run an event loop per thread: each gets its own merger (a shared one would resolve
    one loop's futures from another loop's task)."""
    folder = converted[0][0]
    engine = RouterEngine(RouterSource(str(folder)))
    queries = make_queries(12, seed=8)
    expected = [result["picked_agent"] for result in pick_agent(queries, model=folder)]
    outcomes: dict[int, list] = {}

    def worker(index: int) -> None:
        outcomes[index] = route_all(engine, queries)

    threads = [threading.Thread(target=worker, args=(index,)) for index in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert sorted(outcomes) == [0, 1, 2]
    for results in outcomes.values():
        assert all(isinstance(result, dict) for result in results), results
        assert [result["picked_agent"] for result in results] == expected


def test_a_bad_setting_fails_its_own_request_only(converted, operating_router):
    folder = operating_router[0]
    engine = RouterEngine(RouterSource(str(folder)))
    queries = make_queries(6, seed=2)

    async def gather() -> list:
        requests = [engine.route(query, operating_point="quality") for query in queries]
        requests += [engine.route(queries[0], operating_point="nonexistent"), engine.route(queries[0], tradeoff="x=1")]
        return await asyncio.gather(*requests, return_exceptions=True)

    *good, unknown_point, tradeoff = asyncio.run(gather())
    expected = pick_agent(queries, model=folder, operating_point="quality")
    assert [result["picked_agent"] for result in good] == [result["picked_agent"] for result in expected]
    assert isinstance(unknown_point, RoutingFailed) and str(unknown_point).startswith("the router refused:")
    assert "nonexistent" in str(unknown_point) and "quality" in str(unknown_point)  # names the points it has
    assert isinstance(tradeoff, RoutingFailed) and "operating_point" in str(tradeoff)


def test_a_query_that_tokenizes_to_nothing_is_a_reason():
    engine = RouterEngine(RouterSource())  # the default router: its tokenizer drops zero-width characters
    [outcome] = route_all(engine, ["\u200b\u200b"])
    assert isinstance(outcome, RoutingFailed)
    assert str(outcome).startswith("no text to route on:")
    assert "\u200b" not in str(outcome)


def test_a_router_that_does_not_load_is_a_reason_and_is_tried_again_later(tmp_path, converted, monkeypatch):
    folder = tmp_path / "router"
    engine = RouterEngine(RouterSource(str(folder)))
    [first] = route_all(engine, ["Explain the prime of 7?"])
    assert isinstance(first, RoutingFailed) and str(first).startswith("the router did not load:")
    shutil.copytree(converted[0][0], folder)
    [cached] = route_all(engine, ["Explain the prime of 7?"])
    assert isinstance(cached, RoutingFailed), "a failed load is not retried at once"
    monkeypatch.setattr(engine_module, "RELOAD_AFTER_S", 0.0)
    [loaded] = route_all(engine, ["Explain the prime of 7?"])
    assert loaded["picked_agent"] == pick_agent("Explain the prime of 7?", model=folder)["picked_agent"]


def test_one_engine_per_router_and_settings_in_a_process(converted):
    folder = str(converted[0][0])
    found: list[RouterEngine] = []
    threads = [threading.Thread(target=lambda: found.append(engine_for(RouterSource(folder)))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(engine) for engine in found}) == 1
    assert engine_for(RouterSource(folder, dtype="float32")) is not found[0]
