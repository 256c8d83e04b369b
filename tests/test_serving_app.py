"""The service's parts without a running Ray: request checks and body reading (serving.request_checks) over
Starlette's real Request and the ASGI protocol, errors as HTTP answers, /healthz while the router
loads, the batch merger and its bound, operating-point and trade-off checks (serving.replica), requests
under different trade-offs scored by a real probability head in one run, the application `serve run`
deploys (serving.service), and how a private Ray's processes are started (serving.local_ray). The service
itself, on a real Ray Serve, is tested in test_serving.py, test_serving_load.py and test_serving_stop.py."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from helpers import AGENTS, train_probability_router

pytest.importorskip("ray.serve")
from starlette.requests import Request

from benchgen_router.errors import InputError, RouterTypeError
from benchgen_router.serving.app import BODY_TIMEOUT_S, READY_WAIT_S, RouterService, api, http_error
from benchgen_router.serving.replica import (
    BatchMerger,
    ServedRouter,
    operating_points_of,
    pool_for_router,
    request_point,
    route_items,
)
from benchgen_router.serving.request_checks import DEFAULT_MAX_REQUEST_BYTES, RequestError, parse_route_body, read_body
from configuration_router import RouterConfig

POINTS = {"quality": {"cost_weight": 0.0, "latency_weight": 0.0}, "fast": {"cost_weight": 1.0, "latency_weight": 0.01}}


def problem_of(body: object, max_queries: int = 4) -> tuple[int, str]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(RequestError) as caught:
        parse_route_body(raw, max_queries)
    return caught.value.status, str(caught.value)


def test_a_good_body_gives_its_queries_point_and_tradeoff():
    body = json.dumps({"queries": ["a question?"], "operating_point": "fast"}).encode()
    assert parse_route_body(body, 4) == (["a question?"], "fast", None)
    assert parse_route_body(b'{"queries": ["q"]}', 4) == (["q"], None, None)
    assert parse_route_body(b'{"queries": ["q"], "tradeoff": "budget=0.3"}', 4) == (["q"], None, "budget=0.3")


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"\xff\xfe", 400, "not valid JSON"),
        (b"[" * 100_000 + b"]" * 100_000, 400, "nested too deeply"),
        (["q"], 400, "not an object"),
        ({"query": ["q"]}, 422, 'no "queries" field'),
        ({"queries": "q"}, 422, "a string, not a list"),
        ({"queries": {"a": 1}}, 422, "not a list"),
        ({"queries": []}, 422, "is empty"),
        ({"queries": ["q"] * 5}, 413, "limit of 4"),
        ({"queries": ["q", 3]}, 422, "query 1"),
        ({"queries": ["q", "   "]}, 422, "query 1"),
    ],
)
def test_bad_bodies_are_refused_with_one_line(body, status, words):
    got_status, message = problem_of(body)
    assert got_status == status and words in message and "\n" not in message


def answer_of(err: Exception) -> tuple[int, dict]:
    """(status, JSON body) of the answer the service's handlers give `err`, looked up as Starlette does."""
    status, body, _ = answer_with_headers(err)
    return status, body


def answer_with_headers(err: Exception) -> tuple[int, dict, dict]:
    handler = next(api.exception_handlers[cls] for cls in type(err).__mro__ if cls in api.exception_handlers)
    response = asyncio.run(handler(None, err))
    return response.status_code, json.loads(response.body), dict(response.headers)


def test_errors_become_answers_in_one_place():
    assert answer_of(RequestError(413, "too big; split it.")) == (413, {"error": "too big; split it."})
    assert answer_of(InputError("operating_point 'x' is not one of this router's: a, b.")) == (
        422,
        {"error": "operating_point 'x' is not one of this router's: a, b."},
    )
    assert answer_of(RouterTypeError('"operating_point" is int, not a name')) == (
        422,
        {"error": '"operating_point" is int, not a name'},
    )
    status, body, headers = answer_with_headers(RequestError(503, "busy; retry."))
    assert (status, body, headers.get("retry-after")) == (503, {"error": "busy; retry."}, "1")
    assert "retry-after" not in answer_with_headers(RequestError(413, "big"))[2]
    assert http_error(RuntimeError("a bug")) is None  # a 500, from the catch-all handler


def loaded_service(config: RouterConfig, max_waiting_queries: int = 8) -> tuple[object, ServedRouter]:
    """A RouterService as Ray Serve builds it, without Ray: its methods, a router config, a merger that
    answers each query with its text, point and trade-off (None for text that tokenizes to nothing)."""
    service = object.__new__(RouterService.func_or_class)
    loaded = ServedRouter({"name": "default", "revision": "r"}, router=SimpleNamespace(config=config))
    loaded.default_point = "quality"

    class Merger:
        queued = 0

        async def submit(self, items: list) -> list:
            return [
                None if text == "\u200b" else {"text": text, "point": point, "tradeoff": tradeoff}
                for text, point, tradeoff in items
            ]

    service.merger, service.max_waiting_queries = Merger(), max_waiting_queries
    return service, loaded


def test_refusals_are_the_librarys_errors_answered_with_a_422():
    config = RouterConfig(id2label=dict(enumerate(AGENTS)), operating_points=POINTS, operating_point="quality")
    service, loaded = loaded_service(config)
    assert asyncio.run(service.scored(loaded, ["q"], None)) == [{"text": "q", "point": "quality", "tradeoff": None}]
    assert asyncio.run(service.scored(loaded, ["q"], "fast"))[0]["point"] == "fast"
    for queries, point, kind, words in (
        (["q"], "cheap", InputError, "'cheap' is not one of this router's"),
        (["q"], 3, RouterTypeError, "is int, not a name"),
        (["q", "\u200b"], None, InputError, "query 1 tokenizes to nothing"),
    ):
        with pytest.raises(kind, match=words) as refused:
            asyncio.run(service.scored(loaded, queries, point))
        assert answer_of(refused.value)[0] == 422


@pytest.fixture(scope="module")
def trained(tmp_path_factory, backbone_dir) -> tuple:
    """(exported probability-head router, its training prompts)."""
    return train_probability_router(tmp_path_factory.mktemp("probability-router"), backbone_dir)


TRADEOFFS = ("budget=0.3@frontier_a", "tolerance=0.05", "lambda=0.5", "usd-per-1k=1.0", None)


def test_requests_at_different_tradeoffs_share_one_run_and_pick_as_pick_agent(trained):
    """A probability head in a replica: requests each at its own trade-off, waiting together, are scored
    in one model run by the real merger, and each gets pick_agent's decision under its rule."""
    from benchgen_router.loading import load_router
    from benchgen_router.routing import pick_agent

    router_path, prompts = trained
    queries = prompts[40:48]
    router, tokenizer = load_router(str(router_path))
    runs = []

    def counted(items: list) -> list:
        runs.append(len(items))
        return route_items(router, tokenizer, items)

    service = object.__new__(RouterService.func_or_class)
    loaded = ServedRouter({"name": str(router_path), "revision": "r"}, router=router, tokenizer=tokenizer)
    with ThreadPoolExecutor(1) as executor:
        service.merger, service.max_waiting_queries = BatchMerger(counted, executor, 64), 1024

        async def together() -> list:
            return await asyncio.gather(*(service.scored(loaded, queries, None, rule) for rule in TRADEOFFS))

        answers = asyncio.run(together())
    assert runs == [len(queries) * len(TRADEOFFS)]  # one backbone run for all five requests
    for rule, results in zip(TRADEOFFS, answers, strict=True):
        expected = pick_agent(queries, model=str(router_path), tradeoff=rule)
        assert [r["picked_agent"] for r in results] == [e["picked_agent"] for e in expected], rule
        assert [r["tradeoff"] for r in results] == [e["tradeoff"] for e in expected]
        for result, reference in zip(results, expected, strict=True):
            assert result["probabilities"] == pytest.approx(reference["probabilities"], abs=1e-5)
    picks = {rule: tuple(r["picked_agent"] for r in results) for rule, results in zip(TRADEOFFS, answers, strict=True)}
    assert len(set(picks.values())) > 1, picks  # the rules do decide differently on these queries


def test_a_bad_tradeoff_is_a_400_with_one_line(trained):
    from benchgen_router.loading import load_router

    router, tokenizer = load_router(str(trained[0]))
    service, _ = loaded_service(RouterConfig(id2label=dict(enumerate(AGENTS))))
    loaded = ServedRouter({"name": "p", "revision": "r"}, router=router, tokenizer=tokenizer)
    for bad, words in (
        ("budget=30%", "tolerance=T"),
        ("speed=1", "tolerance=T"),
        ("budget=0.3@nobody", "tolerance=T"),
        ("lambda=-1", "tolerance=T"),
        (3, '"tradeoff" is int'),
    ):
        with pytest.raises(RequestError, match=words) as refused:
            asyncio.run(service.scored(loaded, ["q"], None, bad))
        status, body = answer_of(refused.value)
        assert status == 400 and set(body) == {"error"} and "\n" not in body["error"], body
    cmaes_service, cmaes = loaded_service(
        RouterConfig(id2label=dict(enumerate(AGENTS)), operating_points=POINTS, operating_point="quality")
    )
    with pytest.raises(RequestError, match="needs a probability head") as refused:
        asyncio.run(cmaes_service.scored(cmaes, ["q"], None, "budget=0.3"))
    assert answer_of(refused.value)[0] == 400


def test_a_full_queue_is_a_503_at_once_and_room_is_taken_again():
    config = RouterConfig(id2label=dict(enumerate(AGENTS)), operating_points=POINTS, operating_point="quality")
    service, loaded = loaded_service(config, max_waiting_queries=8)
    service.merger.queued = 6
    with pytest.raises(RequestError) as full:
        asyncio.run(service.scored(loaded, ["a", "b", "c"], None))
    assert full.value.status == 503 and "6 queries waiting, its limit is 8" in str(full.value)
    assert len(asyncio.run(service.scored(loaded, ["a", "b"], None))) == 2  # 6 + 2 fit


def test_the_mergers_count_of_waiting_queries_follows_its_queue():
    gate = threading.Event()

    def run(items: list[int]) -> list[int]:
        gate.wait(5)
        return items

    async def scenario() -> list[int]:
        merger = BatchMerger(run, ThreadPoolExecutor(1), max_queries=4)
        first = asyncio.create_task(merger.submit([1, 2]))
        await asyncio.sleep(0.05)  # taken for a run: no longer waiting
        seen = [merger.queued]
        rest = asyncio.create_task(merger.submit([3, 4, 5]))
        await asyncio.sleep(0.05)
        seen.append(merger.queued)
        gate.set()
        await first, await rest
        return [*seen, merger.queued]

    assert asyncio.run(scenario()) == [0, 3, 0]


def test_healthz_is_a_json_503_while_the_router_loads_then_200_or_the_problem():
    from concurrent.futures import Future

    cls = RouterService.func_or_class
    service = object.__new__(cls)
    service.loading, service.loaded, service.gateway, service.merger = Future(), None, None, None
    service.max_batch_size, service.batch_wait_s, service.executor = 4, 0.0, ThreadPoolExecutor(1)

    async def health() -> tuple[int, dict, float]:
        started = time.monotonic()
        response = await service.healthz()
        if isinstance(response, dict):
            return 200, response, time.monotonic() - started
        return response.status_code, json.loads(response.body), time.monotonic() - started

    status, body, waited = asyncio.run(health())
    assert (status, body["status"]) == (503, "loading") and "still loading" in body["error"]
    assert READY_WAIT_S <= waited < READY_WAIT_S + 2
    identity = {"name": "default", "revision": "r"}
    service.loading.set_result(ServedRouter(identity, problem="the pool file lists agents ['x']; pass ..."))
    assert asyncio.run(health())[:2] == (
        503,
        {"error": "the pool file lists agents ['x']; pass ...", "status": "failed"},
    )
    service.loaded = None
    service.loading = Future()
    service.loading.set_result(ServedRouter(identity, router=object(), tokenizer=object()))
    assert asyncio.run(health())[:2] == (200, {"status": "ok", "router": identity})
    assert service.merger is not None  # made once the router is there


def asgi_request(messages: list[dict], headers: dict[str, str], stall: bool = False) -> tuple[Request, list[int]]:
    """A Starlette Request whose body arrives as these ASGI messages (then, with `stall`, never
    anything more); the list counts the messages read."""
    read = [0]

    async def receive() -> dict:
        if read[0] < len(messages):
            read[0] += 1
            return messages[read[0] - 1]
        if stall:
            await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/route",
        "headers": [(key.encode(), value.encode()) for key, value in headers.items()],
    }
    return Request(scope, receive), read


def body_problem(request: Request, limit: int, timeout_s: float = 5.0) -> RequestError:
    with pytest.raises(RequestError) as caught:
        asyncio.run(read_body(request, limit, timeout_s))
    return caught.value


def test_a_body_within_the_limit_is_read_whole():
    parts = [{"type": "http.request", "body": b'{"queries": ', "more_body": True}]
    parts.append({"type": "http.request", "body": b'["q"]}', "more_body": False})
    request, _ = asgi_request(parts, {"content-length": "18"})
    assert asyncio.run(read_body(request, 100, BODY_TIMEOUT_S)) == b'{"queries": ["q"]}'


def test_a_chunked_body_is_refused_at_the_chunk_that_crosses_the_limit():
    chunk = {"type": "http.request", "body": b"x" * 1000, "more_body": True}
    request, read = asgi_request([chunk] * 1000, {"transfer-encoding": "chunked"})
    problem = body_problem(request, 4096)
    assert problem.status == 413 and "limit of 4096 bytes" in str(problem)
    assert read[0] == 5  # 5 kB read of the 1 MB offered


def test_a_declared_length_over_the_limit_is_refused_before_reading():
    whole = {"type": "http.request", "body": b"{}", "more_body": False}
    request, read = asgi_request([whole], {"content-length": "9999"})
    problem = body_problem(request, 4096)
    assert problem.status == 413 and "9999 bytes" in str(problem) and read[0] == 0


def test_a_stalled_body_is_a_408_after_the_timeout():
    request, _ = asgi_request([{"type": "http.request", "body": b"{", "more_body": True}], {}, stall=True)
    started = time.monotonic()
    problem = body_problem(request, 4096, timeout_s=0.3)
    assert problem.status == 408 and "0.3 s" in str(problem)
    assert time.monotonic() - started < 5


def test_a_client_gone_mid_body_is_one_warning_line(caplog):
    request, _ = asgi_request([{"type": "http.request", "body": b'{"queries"', "more_body": True}], {})
    with caplog.at_level("WARNING", logger="benchgen_router.serving"):
        problem = body_problem(request, 4096)
    assert problem.status == 400
    assert [record.getMessage() for record in caplog.records] == [
        "a client disconnected after 10 bytes of its request body"
    ]


def test_the_merger_runs_what_queued_meanwhile_in_one_run_and_splits_big_requests():
    runs: list[list[int]] = []
    gate = threading.Event()

    def run(items: list[int]) -> list[int]:
        if not runs:
            gate.wait(5)  # the first run is slow: the next requests queue behind it
        runs.append(list(items))
        return [10 * item for item in items]

    async def scenario() -> list[list[int]]:
        merger = BatchMerger(run, ThreadPoolExecutor(1), max_queries=4)
        first = asyncio.create_task(merger.submit([1]))
        await asyncio.sleep(0.05)
        rest = [asyncio.create_task(merger.submit(items)) for items in ([2], [3, 4], [5, 6, 7, 8, 9, 10])]
        await asyncio.sleep(0.05)
        gate.set()
        return [await first] + [await task for task in rest]

    answers = asyncio.run(scenario())
    assert answers == [[10], [20], [30, 40], [50, 60, 70, 80, 90, 100]]  # each in order
    assert runs[0] == [1] and runs[1] == [2, 3, 4]  # what queued, merged up to 4 queries
    assert all(len(items) <= 4 for items in runs)
    assert sorted(item for items in runs for item in items) == list(range(1, 11))


def test_operating_points_and_pool_files_are_checked_against_the_router():
    config = RouterConfig(id2label=dict(enumerate(AGENTS)), operating_points=POINTS, operating_point="quality")
    router = SimpleNamespace(config=config)
    assert request_point(router, "fast") == "fast"
    with pytest.raises(InputError, match="not one of this router's: fast, quality"):
        request_point(router, "cheap")
    with pytest.raises(RouterTypeError, match="not a name"):
        request_point(router, 3)
    single = RouterConfig(id2label=dict(enumerate(AGENTS)))
    with pytest.raises(InputError, match="single head"):
        request_point(SimpleNamespace(config=single), "fast")
    assert [p["name"] for p in operating_points_of(config, "quality")] == ["fast", "quality"]
    assert operating_points_of(single, None) is None
    pool = [{"id": agent, "slug": f"vendor/{agent}"} for agent in reversed(AGENTS)]
    ordered, problem = pool_for_router(AGENTS, pool)
    assert problem is None and [agent["id"] for agent in ordered] == AGENTS
    assert "pass the pool file made for this router" in pool_for_router(AGENTS, pool[1:])[1]


def test_the_application_for_serve_run_is_the_one_serve_deploys():
    """`serve run benchgen_router.serving.service:app_builder model=... replicas=2`: the one deployment,
    with the arguments Ray Serve passes as text; bad ones are one line."""
    from benchgen_router.serving.service import app_builder

    application = app_builder({"replicas": "2", "max_queries": "16", "operating_point": "fast"})
    service = application._bound_deployment
    assert service.name == "Router" and service.num_replicas == 2
    assert service.init_args[0] is None  # None: the default router
    assert service.init_args[7:10] == ("fast", 16, DEFAULT_MAX_REQUEST_BYTES)
    with pytest.raises(InputError, match="unknown argument"):
        app_builder({"replica": "2"})
    with pytest.raises(InputError, match="replicas must be a number"):
        app_builder({"replicas": "two"})
    with pytest.raises(InputError, match="replicas must be a positive integer"):
        app_builder({"replicas": "0"})


def test_the_processes_ray_starts_lead_their_own_process_groups():
    """A signal to the command's process group must reach the command alone, which then stops Ray."""
    import subprocess
    import sys

    import ray._private.services as services

    from benchgen_router.serving.local_ray import own_process_groups

    original = services.ConsolePopen
    with own_process_groups():
        child = services.ConsolePopen(
            [sys.executable, "-c", "import os; print(os.getpgid(0) == os.getpid())"], stdout=subprocess.PIPE, text=True
        )
        out, _ = child.communicate(timeout=30)
    assert out.strip() == "True"
    assert services.ConsolePopen is original  # only while Ray starts


def test_haproxy_started_through_the_launcher_dies_with_the_process_that_started_it(tmp_path):
    """HAProxy's parent is a Ray worker, which Ray may kill with SIGKILL: the launcher makes the child
    die with it (here /bin/sleep stands for HAProxy)."""
    import os
    import signal
    import subprocess
    import sys

    import psutil

    from benchgen_router.serving.local_ray import haproxy_environment

    os.environ["RAY_SERVE_HAPROXY_BINARY_PATH"] = "/bin/sleep"
    try:
        launcher = haproxy_environment(str(tmp_path))["RAY_SERVE_HAPROXY_BINARY_PATH"]
    finally:
        del os.environ["RAY_SERVE_HAPROXY_BINARY_PATH"]
    parent = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, time; subprocess.Popen([{launcher!r}, '60']); time.sleep(60)"]
    )
    try:
        deadline = time.monotonic() + 20
        while not (children := psutil.Process(parent.pid).children()) and time.monotonic() < deadline:
            time.sleep(0.05)
        (sleeper,) = children
        while sleeper.name() != "sleep" and time.monotonic() < deadline:  # the launcher execs it
            time.sleep(0.05)
        assert sleeper.name() == "sleep"
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        gone, alive = psutil.wait_procs([sleeper], timeout=5)
        assert alive == [] and gone
    finally:
        parent.kill()
