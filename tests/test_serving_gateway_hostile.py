"""The gateway against hostile upstreams and clients, through the service's real app: its FastAPI routes and
error handlers, a RouterService holding a real tiny router, served over real HTTP on 127.0.0.1 by uvicorn (a
replica's own HTTP server in throughput mode is uvicorn too), without Ray, so each case takes a second or less.
The upstream is MisbehavingUpstream (tests/upstream_server.py), scripted per test: an error body that echoes
the key, a 429 with Retry-After, usage no call has, an answer that never ends or is too large. Each case here
failed before the gateway refused or bounded it (docs/gateway.md, "What the gateway refuses")."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers import convert_release, write_operating_release
from upstream_server import HOST, MisbehavingUpstream, Scripted, free_port

KEY_ENV = "BENCHGEN_HOSTILE_TEST_KEY"
KEY = "sk-hostile-test-4d2b8e6a1c"
os.environ[KEY_ENV] = KEY

httpx = pytest.importorskip("httpx")
pytest.importorskip("ray.serve")
uvicorn = pytest.importorskip("uvicorn")

from benchgen_router.serving.app import RouterService, api  # noqa: E402
from benchgen_router.serving.call_usage import MAX_COST_PER_CALL_USD, MAX_TOKENS_PER_CALL  # noqa: E402
from benchgen_router.serving.gateway import GatewaySettings  # noqa: E402
from benchgen_router.upstreams import Upstream, UpstreamPool  # noqa: E402

AGENTS = ["alpha", "beta"]
MAX_RESPONSE_BYTES = 1 << 20
OK_ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "4"}, "finish_reason": "stop"}],
}


def answered(usage: dict | None = None, **headers: str) -> Scripted:
    return Scripted(
        body={**OK_ANSWER, "usage": usage or {"prompt_tokens": 10, "completion_tokens": 2}}, headers=headers
    )


@pytest.fixture(scope="module")
def upstream() -> Iterator[MisbehavingUpstream]:
    with MisbehavingUpstream(lambda body: answered()) as server:
        yield server


@pytest.fixture(autouse=True)
def well_behaved(upstream):
    """Each test scripts the upstream as it needs; it answers normally otherwise."""
    upstream.script = lambda body: answered()


def build_router(folder: Path, backbone_dir: Path) -> Path:
    """A converted tiny router over alpha and beta, with two operating points."""
    points = {"quality": (0.0, 0.0), "fast": (0.0, 0.01)}
    manifest, weights, _ = write_operating_release(
        folder / "release", 32, points, "quality", seed=5, backbone=str(backbone_dir), agents=AGENTS
    )
    return convert_release(manifest, weights, folder / "router", backbone_dir)


@pytest.fixture(scope="module")
def router_dir(backbone_dir, tmp_path_factory) -> Path:
    return build_router(tmp_path_factory.mktemp("hostile-router"), backbone_dir)


def pool_of(base_url: str) -> UpstreamPool:
    upstreams = {
        agent: Upstream(
            agent=agent,
            model=f"served-{agent}",
            base_url=base_url,
            api_key_env=KEY_ENV,
            slug=f"tiny/{agent}",
            price_per_1m_prompt_usd=1.0,
            price_per_1m_output_usd=2.0,
        )
        for agent in AGENTS
    }
    return UpstreamPool(agents=tuple(AGENTS), upstreams=upstreams)


class ServedByThread:
    """Ray Serve's replica context as the app's routes read it (servable_object: the instance they run on):
    here the service of the server thread they run in, so that several apps can serve at once."""

    local = threading.local()

    @property
    def servable_object(self) -> object:
        return self.local.service


class AppServer:
    """The service's app on a real HTTP server in a thread, its routes bound to `service` as Ray Serve binds
    them to a replica's instance (through the replica context)."""

    def __init__(self, service: object) -> None:
        self.service = service
        self.port = free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(api, host=HOST, port=self.port, log_level="warning", lifespan="off")
        )
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        ServedByThread.local.service = self.service
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self.server.serve())

    def stop_replica(self) -> None:
        """What Ray Serve does when a replica stops: the service's async __del__, awaited in its event loop
        (garbage collection, which would only make the coroutine, is kept from calling it)."""
        user_class = RouterService.func_or_class.__mro__[1]
        asyncio.run_coroutine_threadsafe(user_class.__del__(self.service), self.loop).result(30)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def __enter__(self) -> AppServer:
        import ray.serve.context as context

        self.previous = context._INTERNAL_REPLICA_CONTEXT
        context._INTERNAL_REPLICA_CONTEXT = ServedByThread()
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.server.started, "uvicorn did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        import ray.serve.context as context

        self.server.should_exit = True
        self.thread.join(10)
        context._INTERNAL_REPLICA_CONTEXT = self.previous


def make_service(router_dir: Path, settings: GatewaySettings) -> object:
    """A RouterService as a replica holds it: the class Ray Serve deploys, built by the service's own __init__
    (the ingress wrapper's, which starts Ray Serve's ASGI machinery, is left out)."""
    import ray.serve.context as context

    wrapper = RouterService.func_or_class
    service = object.__new__(type("HeldService", (wrapper,), {"__del__": lambda self: None}))  # see stop_replica
    running, context._INTERNAL_REPLICA_CONTEXT = context._INTERNAL_REPLICA_CONTEXT, None  # metrics outside a replica
    try:
        wrapper.__mro__[1].__init__(service, str(router_dir), None, None, None, 1, 16, 0.0, gateway=settings)
    finally:
        context._INTERNAL_REPLICA_CONTEXT = running
    assert service.loading.result(120).problem is None
    return service


@pytest.fixture(scope="module")
def app(router_dir, upstream) -> Iterator[AppServer]:
    settings = GatewaySettings(pool_of(upstream.base_url), timeout_s=30.0, max_response_bytes=MAX_RESPONSE_BYTES)
    with AppServer(make_service(router_dir, settings)) as server:
        yield server


def chat(app: AppServer, model: str = "alpha", content: str = "what is two plus two", **fields) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": content}], **fields}
    with httpx.Client(timeout=30, trust_env=False) as http:
        return http.post(f"{app.url}/v1/chat/completions", json=body)


def openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and "\n" not in error["message"], error
    return error


def test_a_well_behaved_upstream_answers_through_the_app(app, upstream):
    for model in ("alpha", "benchgen-router"):
        response = chat(app, model)
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["message"]["content"] == "4"
        assert float(response.headers["x-benchgen-cost-usd"]) == pytest.approx((10 * 1.0 + 2 * 2.0) / 1e6)
    assert upstream.heads[-1].count(f"Bearer {KEY}".encode()) == 1  # the key went upstream


# ---------------------------------------------------------------------------------------------
# The pool's key


def test_an_upstream_that_echoes_the_key_has_it_masked_routed_or_passed_through(app, upstream):
    def echo(body: dict) -> Scripted:
        message = f"Incorrect API key provided: Bearer {KEY}. You can find your API key at ..."
        return Scripted(
            401, {"error": {"message": message, "type": "invalid_request_error", "code": "invalid_api_key"}}
        )

    upstream.script = echo
    for model in ("alpha", "benchgen-router"):
        response = chat(app, model)
        assert response.status_code == 401
        assert KEY not in response.text
        assert response.json()["error"]["message"].startswith("Incorrect API key provided: Bearer ***.")


# ---------------------------------------------------------------------------------------------
# A client that leaves


def send_and_leave(app: AppServer, upstream: MisbehavingUpstream, body: dict) -> float | None:
    """Send `body` on a raw connection, close it once the upstream holds the call: seconds until the
    upstream saw its connection closed (None: not within 10 s)."""
    closed = upstream.closed
    data = json.dumps(body).encode()
    with socket.create_connection((HOST, app.port)) as connection:
        connection.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(data)}\r\n\r\n".encode()
            + data
        )
        deadline = time.monotonic() + 10
        while upstream.holding == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert upstream.holding == 1
        time.sleep(0.3)
    return upstream.wait_closed(closed, 10)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("model", ["alpha", "benchgen-router"])
def test_a_client_that_leaves_cancels_the_upstream_call(app, upstream, stream, model):
    """The upstream never ends its answer (a trickle of bytes, as a slow model's); the client leaves."""
    upstream.script = lambda body: Scripted(body=b'{"choices": [', endless=b" ", every_s=0.1)
    seconds = send_and_leave(
        app, upstream, {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    )
    assert seconds is not None and seconds < 5, seconds


# ---------------------------------------------------------------------------------------------
# Fields with odd values


@pytest.mark.parametrize("value", ["true", 1, 0, "false", [True], {}])
def test_a_stream_that_is_not_a_boolean_is_a_400(app, upstream, value):
    sent = len(upstream.requests)
    error = openai_error(chat(app, stream=value), 400)
    assert error["param"] == "stream" and "not a boolean" in error["message"]
    assert len(upstream.requests) == sent  # nothing went upstream


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_number_json_does_not_allow_is_a_400(app, upstream, number):
    sent = len(upstream.requests)
    body = f'{{"model": "alpha", "messages": [{{"role": "user", "content": "hi"}}], "temperature": {number}}}'
    with httpx.Client(timeout=30, trust_env=False) as http:
        response = http.post(
            f"{app.url}/v1/chat/completions", content=body, headers={"content-type": "application/json"}
        )
    error = openai_error(response, 400)
    assert number in error["message"] and "finite numbers" in error["message"]
    assert len(upstream.requests) == sent


def test_a_passed_through_429_keeps_its_status_and_retry_after(app, upstream):
    slow_down = {"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}}
    upstream.script = lambda body: Scripted(429, slow_down, {"retry-after": "7", "x-ratelimit-remaining-requests": "0"})
    response = chat(app, "alpha")
    assert response.status_code == 429 and response.headers["retry-after"] == "7"
    assert response.headers["x-ratelimit-remaining-requests"] == "0" and response.json() == slow_down
    sent = len(upstream.requests)
    routed = chat(app, "benchgen-router")  # routed: retried on the other agent, whose 429 is then passed on
    assert len(upstream.requests) == sent + 2
    assert routed.status_code == 429 and routed.headers["retry-after"] == "7"
    assert routed.headers["x-benchgen-retried-from"] != routed.headers["x-benchgen-agent"]


def test_the_upstreams_request_id_is_renamed_so_that_the_answer_has_one(app, upstream):
    upstream.script = lambda body: answered(**{"x-request-id": "req_upstream_1"})
    response = chat(app, "alpha")
    assert response.status_code == 200
    assert response.headers.get_list("x-request-id") == []  # Ray Serve adds the service's own
    assert response.headers["x-benchgen-upstream-request-id"] == "req_upstream_1"


# ---------------------------------------------------------------------------------------------
# Usage no call has


@pytest.fixture
def implausible(app) -> list[dict]:
    """The implausible-usage counter's increments (the Prometheus series is read in test_serving_gateway)."""
    metrics = app.service.gateway.metrics
    seen: list[dict] = []
    counter = metrics.implausible_usage
    metrics.implausible_usage = SimpleNamespace(inc=lambda value, tags: seen.append(tags))
    yield seen
    metrics.implausible_usage = counter


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": 10**30, "completion_tokens": 1},
        {"prompt_tokens": MAX_TOKENS_PER_CALL + 1, "completion_tokens": 1},
        {"prompt_tokens": -5, "completion_tokens": 1},
        {"prompt_tokens": 1.5, "completion_tokens": 1},
        {"prompt_tokens": 1, "completion_tokens": 1, "cost": 1e308},
        {"prompt_tokens": 1, "completion_tokens": 1, "cost": -0.01},
        {"prompt_tokens": 1, "completion_tokens": 1, "cost": MAX_COST_PER_CALL_USD * 1.01},
        {"prompt_tokens": MAX_TOKENS_PER_CALL, "completion_tokens": MAX_TOKENS_PER_CALL, "cost": None},
    ],
    ids=["1e30-tokens", "over-cap", "negative", "fraction", "1e308-cost", "negative-cost", "cost-over-cap", "priced"],
)
def test_implausible_usage_is_not_counted_nor_priced(app, upstream, implausible, usage):
    """Dropped from every count and from the cost header. The last case is the most a call may report: 10M
    tokens each way, 30 USD at this pool's prices, counted."""
    upstream.script = lambda body: answered(usage)
    response = chat(app, "alpha")
    assert response.status_code == 200 and response.json()["usage"] == json.loads(json.dumps(usage))
    if usage.get("cost", 0) is None:
        assert implausible == []
        assert float(response.headers["x-benchgen-cost-usd"]) == pytest.approx(30.0)
        return
    assert implausible == [{"agent": "alpha"}]
    assert "x-benchgen-cost-usd" not in response.headers


# ---------------------------------------------------------------------------------------------
# An answer too large


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_an_answer_over_the_limit_is_a_502_and_read_no_further(app, upstream, declared):
    if declared:
        upstream.script = lambda body: Scripted(body=b"x" * (MAX_RESPONSE_BYTES + 1))
    else:  # an answer that never ends, as fast as the connection takes it
        upstream.script = lambda body: Scripted(body=b'{"choices": ["', endless=b"x" * 65536, every_s=0)
    closed = upstream.closed
    started = time.monotonic()
    error = openai_error(chat(app, "alpha"), 502)
    assert error["code"] == "upstream_error" and f"limit of {MAX_RESPONSE_BYTES}" in error["message"]
    assert time.monotonic() - started < 10
    if not declared:
        assert upstream.wait_closed(closed, 10) is not None  # the gateway closed the connection


# ---------------------------------------------------------------------------------------------
# Smaller


def test_text_that_tokenizes_to_nothing_gets_a_chat_shaped_400(app, upstream):
    error = openai_error(chat(app, "benchgen-router", "\u200b\u200b"), 400)
    assert error["param"] == "messages" and "only invisible characters" in error["message"]
    assert "query 0" not in error["message"]


def raw_get(app: AppServer, path: str) -> tuple[int, bytes, bytes]:
    """(status, head, body) of GET `path` sent as it is written (a client library would normalize it)."""
    with socket.create_connection((HOST, app.port)) as connection:
        connection.sendall(f"GET {path} HTTP/1.1\r\nhost: gateway\r\nconnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), head, body


def asgi_get(path: str) -> tuple[int, dict]:
    """(status, JSON body) of GET `path` given to the app as the server decoded it (%0D%0A: a CR LF)."""

    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(), "query_string": b""}
    asyncio.run(api({**scope, "headers": [], "root_path": ""}, receive, send))
    return sent[0]["status"], json.loads(b"".join(message.get("body", b"") for message in sent[1:]))


def test_a_model_name_no_route_can_hold_is_a_404_in_openais_shape(app):
    status, body = asgi_get("/v1/models/evil\r\nx-injected: 1")  # "." in the route's pattern stops at a line end
    error = body["error"]
    assert status == 404 and set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "model_not_found" and "\\r\\n" in error["message"]  # named, escaped: one line
    status, head, raw = raw_get(app, "/v1/models/evil%0D%0Ax-injected:%201")  # over HTTP too
    assert status == 404 and json.loads(raw)["error"]["code"] == "model_not_found"
    assert b"x-injected" not in head and b"\r" not in raw and b"\n" not in raw.strip()
    status, _, raw = raw_get(app, "/v1/chat/completions")  # the wrong method
    assert status == 405 and json.loads(raw)["error"]["type"] == "invalid_request_error"
