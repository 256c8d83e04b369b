"""The service's parts without a running Ray: request checks and body reading (serving.app) over
Starlette's real Request and the ASGI protocol, errors as HTTP answers, the batch merger and
operating-point checks (serving.replica), and the start-up checks (serving.service). The service
itself, on a real Ray Serve, is tested in test_serving.py and test_serving_load.py."""

from __future__ import annotations

import asyncio
import json
import pickle
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from helpers import AGENTS

pytest.importorskip("ray.serve")
from starlette.requests import Request

from benchgen_router.errors import InputError, RouterTypeError
from benchgen_router.serving.app import (
    DEFAULT_MAX_REQUEST_BYTES,
    RequestError,
    api,
    http_error,
    parse_route_body,
    read_body,
)
from benchgen_router.serving.replica import (
    BatchMerger,
    RouterReplica,
    operating_points_of,
    pool_for_router,
    request_point,
)
from benchgen_router.serving.service import check_cpus, check_port_free, check_reachable
from configuration_router import RouterConfig

POINTS = {"quality": {"cost_weight": 0.0, "latency_weight": 0.0}, "fast": {"cost_weight": 1.0, "latency_weight": 0.01}}


def problem_of(body: object, max_queries: int = 4) -> tuple[int, str]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(RequestError) as caught:
        parse_route_body(raw, max_queries)
    return caught.value.status, str(caught.value)


def test_a_good_body_gives_its_queries_and_point():
    body = json.dumps({"queries": ["a question?"], "operating_point": "fast"}).encode()
    assert parse_route_body(body, 4) == (["a question?"], "fast")
    assert parse_route_body(b'{"queries": ["q"]}', 4) == (["q"], None)


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
    handler = next(api.exception_handlers[cls] for cls in type(err).__mro__ if cls in api.exception_handlers)
    response = asyncio.run(handler(None, err))
    return response.status_code, json.loads(response.body)


def test_errors_become_answers_in_one_place():
    from ray.exceptions import ActorDiedError, RayTaskError
    from ray.serve.exceptions import RayServeException

    assert answer_of(RequestError(413, "too big; split it.")) == (413, {"error": "too big; split it."})
    assert answer_of(InputError("operating_point 'x' is not one of this router's: a, b.")) == (
        422,
        {"error": "operating_point 'x' is not one of this router's: a, b."},
    )
    assert answer_of(RouterTypeError('"operating_point" is int, not a name')) == (
        422,
        {"error": '"operating_point" is int, not a name'},
    )
    # Raised inside a replica, a library error arrives as Ray's wrapper: both a RayError and the
    # error itself, whose text is the replica's process and traceback. The answer is the error's line.
    cause = InputError("query 0 tokenizes to nothing; a router cannot score it.")
    wrapped = RayTaskError("route", f"Traceback ...\nInputError: {cause}", cause).as_instanceof_cause()
    assert isinstance(wrapped, InputError) and str(wrapped).splitlines()[0] != str(cause)
    assert answer_of(wrapped) == (422, {"error": str(cause)})
    failed = RayTaskError("route", "Traceback ...", RuntimeError("boom")).as_instanceof_cause()
    for failure in (failed, ActorDiedError(), RayServeException("the deployment is gone")):
        status, body = answer_of(failure)
        assert status == 503 and body == {"error": f"the router replica failed ({type(failure).__name__}); retry."}
    assert http_error(RuntimeError("a bug")) is None  # a 500, from the catch-all handler
    copied = pickle.loads(pickle.dumps(RequestError(408, "late")))
    assert (copied.status, str(copied)) == (408, "late")


def test_a_replica_returns_its_refusals_for_the_ingress_to_raise():
    """Returned, not raised: Ray Serve would log a traceback for each bad request."""
    config = RouterConfig(id2label=dict(enumerate(AGENTS)), operating_points=POINTS, operating_point="quality")
    replica = object.__new__(RouterReplica.func_or_class)  # its methods run without Ray
    replica.router, replica.default_point = SimpleNamespace(config=config), "quality"

    class Merger:
        async def submit(self, items: list) -> list:
            return [None if text == "\u200b" else {"text": text, "point": point} for text, point in items]

    replica.merger = Merger()
    assert asyncio.run(replica.route(["q"], None)) == {"results": [{"text": "q", "point": "quality"}]}
    assert asyncio.run(replica.route(["q"], "fast"))["results"][0]["point"] == "fast"
    for queries, point, kind, words in (
        (["q"], "cheap", InputError, "'cheap' is not one of this router's"),
        (["q"], 3, RouterTypeError, "is int, not a name"),
        (["q", "\u200b"], None, InputError, "query 1 tokenizes to nothing"),
    ):
        refused = asyncio.run(replica.route(queries, point))["refused"]
        assert isinstance(refused, kind) and words in str(refused)
        assert answer_of(pickle.loads(pickle.dumps(refused)))[0] == 422  # it crosses processes


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
    assert asyncio.run(read_body(request, 100)) == b'{"queries": ["q"]}'


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


def test_start_up_checks_are_one_line_in_bounded_time():
    with pytest.raises(InputError, match="need 10000 CPUs"):
        check_cpus("replicas", 10_000)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(InputError, match="pass a free port"):
            check_port_free("127.0.0.1", busy.getsockname()[1], "the service")
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(InputError, match="no Ray cluster answers"):
        check_reachable(f"127.0.0.1:{port}")
    assert time.monotonic() - started < 15


def test_a_draining_ingress_refuses_new_requests_and_waits_for_those_it_took():
    from benchgen_router.serving.app import RouterIngress

    cls = RouterIngress.func_or_class  # the class Ray Serve deploys, its methods run without Ray
    ingress = SimpleNamespace(draining=False, in_flight=2, described=None)

    async def scenario() -> tuple[int, float, RequestError]:
        started = asyncio.get_running_loop().time()
        draining = asyncio.create_task(cls.drain(ingress, 5.0))
        await asyncio.sleep(0.2)
        with pytest.raises(RequestError) as refused:
            await cls.ready(ingress)
        ingress.in_flight = 0  # the two requests taken are answered
        return await draining, asyncio.get_running_loop().time() - started, refused.value

    left, waited, refused = asyncio.run(scenario())
    assert left == 0 and 0.2 <= waited < 2.0
    assert refused.status == 503 and "stopping" in str(refused)
    ingress.draining, ingress.in_flight = False, 1
    assert asyncio.run(cls.drain(ingress, 0.2)) == 1  # bounded: what is still in flight after the timeout


def test_the_application_for_serve_run_is_the_one_serve_deploys():
    """`serve run benchgen_router.serving.service:app_builder model=... replicas=2`: the ingress bound
    to the router replicas, with the arguments Ray Serve passes as text; bad ones are one line."""
    from benchgen_router.serving.service import app_builder

    application = app_builder({"replicas": "2", "max_queries": "16", "operating_point": "fast"})
    ingress = application._bound_deployment
    routers = ingress.init_args[0]._bound_deployment
    assert (ingress.name, routers.name) == ("Ingress", "Router")
    assert routers.num_replicas == 2 and ingress.init_args[1:] == (16, DEFAULT_MAX_REQUEST_BYTES)
    assert routers.init_args[0] is None and routers.init_args[-1] == "fast"  # None: the default router
    with pytest.raises(InputError, match="unknown argument"):
        app_builder({"replica": "2"})
    with pytest.raises(InputError, match="replicas must be a number"):
        app_builder({"replicas": "two"})
    with pytest.raises(InputError, match="replicas must be a positive integer"):
        app_builder({"replicas": "0"})


def test_the_ingress_never_loads_a_tokenizer_or_the_model():
    """The replicas tokenize every query; the ingress only checks that each is text, so its process never
    imports torch, transformers or tokenizers (nor pays their start-up and memory)."""
    import subprocess
    import sys

    probe = (
        "import sys, benchgen_router.serving.app, benchgen_router.serving.gateway; "
        "print(sorted(m for m in ('torch', 'transformers', 'tokenizers') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"
