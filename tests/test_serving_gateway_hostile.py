"""The gateway against hostile upstreams and clients, through the service's real app: its FastAPI routes and
error handlers, a RouterService holding a real tiny router, served over real HTTP on 127.0.0.1 by uvicorn (a
replica's own HTTP server in throughput mode is uvicorn too), without Ray, so each case takes a second or less.
The upstream is MisbehavingUpstream (tests/upstream_server.py), scripted per test: an error body, headers or a
stream that echo the key (escaped, or cut across chunks), a 429 with Retry-After, usage no call has, a stream
without line ends, an answer that never ends or is too large. Each case here failed before the gateway refused,
masked or bounded it (docs/gateway.md, "What the gateway refuses", "Keys"), but for those that check that an
ordinary answer passes untouched."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers import convert_release, make_queries, write_operating_release
from upstream_server import HOST, MisbehavingUpstream, Scripted, free_port, parse_sse

KEY_ENV = "BENCHGEN_HOSTILE_TEST_KEY"
KEY = "sk-hostile/test+4d2b=8e6a1c=="  # "/", "+" and "=": the characters that JSON and URLs may escape
os.environ[KEY_ENV] = KEY

httpx = pytest.importorskip("httpx")
pytest.importorskip("ray.serve")
uvicorn = pytest.importorskip("uvicorn")

from benchgen_router.chat_text import ROUTING_TEXT_MAX_CHARS  # noqa: E402
from benchgen_router.serving.app import RouterService, api  # noqa: E402
from benchgen_router.serving.call_usage import MAX_COST_PER_CALL_USD, MAX_TOKENS_PER_CALL  # noqa: E402
from benchgen_router.serving.gateway import (  # noqa: E402
    DEFAULT_MAX_REQUEST_BYTES,
    GatewayError,
    GatewaySettings,
    parse_chat_body,
    routing_text,
)
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


def key_forms(key: str) -> dict[str, str]:
    """The ways an upstream may write `key`: as it is, JSON-escaped ("/" as "\\/", any character as \\uXXXX, in
    either case of hex), or percent-encoded."""
    return {
        "raw": key,
        "slash-escaped": key.replace("/", "\\/"),
        "unicode-escaped": "".join(f"\\u{ord(c):04x}" if c in "/+=" else c for c in key),
        "all-escaped-upper": "".join(f"\\u{ord(c):04X}" for c in key),
        "percent-encoded": urllib.parse.quote(key, safe=""),
    }


KEY_FORMS = key_forms(KEY)


def holds_key(text: str) -> bool:
    return any(form in text for form in KEY_FORMS.values())


@pytest.mark.parametrize("form", list(KEY_FORMS))
def test_a_key_the_upstream_escapes_in_its_body_is_masked(app, upstream, form):
    echoed = KEY_FORMS[form]
    body = f'{{"error": {{"message": "Incorrect API key provided: {echoed}.", "code": "invalid_api_key"}}}}'
    upstream.script = lambda request: Scripted(401, body.encode())
    for model in ("alpha", "benchgen-router"):
        response = chat(app, model)
        assert response.status_code == 401
        assert not holds_key(response.text), response.text
        message = response.json()["error"]["message"]  # JSON-decoded: an escaped key would be whole again
        assert KEY not in urllib.parse.unquote(message) and message == "Incorrect API key provided: ***."


def test_a_key_in_any_relayed_header_is_masked(app, upstream):
    """The headers a client gets from the upstream: its rate limits, Retry-After, request id, content type."""
    headers = {
        "content-type": f"application/json; key={KEY}",
        "retry-after": KEY,
        "openai-processing-ms": KEY_FORMS["percent-encoded"],
        "x-ratelimit-remaining-requests": f"0 (key {KEY_FORMS['slash-escaped']})",
        "x-ratelimit-reset-tokens": KEY_FORMS["unicode-escaped"],
        "x-request-id": f"req_{KEY}",
    }
    slow_down = {"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}}
    for status, answer in ((200, OK_ANSWER), (429, slow_down)):
        upstream.script = lambda request, status=status, answer=answer: Scripted(status, answer, headers)
        response = chat(app, "alpha")
        assert response.status_code == status
        relayed = {name: value for name, value in response.headers.items() if name != "x-request-id"}
        assert not any(holds_key(value) for value in relayed.values()), relayed
        assert set(headers) - {"x-request-id"} <= set(relayed), relayed  # masked, not dropped
        assert relayed["retry-after"] == "***" and relayed["x-benchgen-upstream-request-id"] == "req_***"


def stream_event(content: str) -> bytes:
    return b'data: {"choices": [{"index": 0, "delta": {"content": "' + content.encode() + b'"}}]}\n\n'


def streamed(app: AppServer, model: str = "alpha") -> tuple[bytes, list[tuple[float, bytes]]]:
    """(the whole stream the client got, each piece as it came with the second it came at)."""
    body = {"model": model, "messages": [{"role": "user", "content": "what is two plus two"}], "stream": True}
    arrivals = []
    with (
        httpx.Client(timeout=30, trust_env=False) as http,
        http.stream("POST", f"{app.url}/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        for piece in response.iter_raw():
            arrivals.append((time.monotonic(), piece))
    return b"".join(piece for _, piece in arrivals), arrivals


@pytest.mark.parametrize("form", list(KEY_FORMS))
def test_a_key_cut_across_stream_chunks_is_masked(app, upstream, form):
    """The key, in each form, cut into 5-byte pieces that reach the gateway one by one (the cuts fall inside
    escapes too: "\\u00" then "2b")."""
    events = stream_event("hello ") + stream_event(f"key {KEY_FORMS[form]} end") + b"data: [DONE]\n\n"
    pieces = [events[start : start + 5] for start in range(0, len(events), 5)]
    upstream.script = lambda request: Scripted(
        pieces=pieces, every_s=0.01, headers={"content-type": "text/event-stream"}
    )
    for model in ("alpha", "benchgen-router"):
        relayed, _ = streamed(app, model)
        assert not holds_key(relayed.decode()), relayed
        chunks, done = parse_sse(relayed.decode().splitlines())
        assert done and [chunk["choices"][0]["delta"]["content"] for chunk in chunks] == ["hello ", "key *** end"]


def test_an_ordinary_stream_is_relayed_event_by_event_without_delay(app, upstream):
    """Masking holds back only what may begin a key: an event that ends reaches the client before the next
    is sent, byte for byte."""
    events = [stream_event("first"), stream_event("sk-hostile"), stream_event("second"), b"data: [DONE]\n\n"]
    upstream.script = lambda request: Scripted(
        pieces=events, every_s=0.5, headers={"content-type": "text/event-stream"}
    )
    relayed, arrivals = streamed(app)
    assert relayed == b"".join(events)
    assert [piece for _, piece in arrivals] == events  # one event per piece: none held for the next
    gaps = [later - earlier for (earlier, _), (later, _) in itertools.pairwise(arrivals)]
    assert min(gaps) > 0.3, gaps


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


def relayed_beside_routes(app: AppServer, upstream: MisbehavingUpstream, chunk: bytes) -> tuple[float, list[float]]:
    """(seconds the replica took to relay 1 MiB of an endless stream of `chunk`, sent as fast as the connection
    takes it; the seconds of /v1/route requests on the replica meanwhile)."""
    upstream.script = lambda request: Scripted(body=b"data: ", endless=chunk, every_s=0)
    relayed, stop = [0], threading.Event()

    def read_stream() -> None:
        body = {"model": "alpha", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        with (
            httpx.Client(timeout=60, trust_env=False) as http,
            http.stream("POST", f"{app.url}/v1/chat/completions", json=body) as response,
        ):
            for piece in response.iter_raw():
                relayed[0] += len(piece)
                if stop.is_set():
                    break

    reader = threading.Thread(target=read_stream, daemon=True)
    started = time.perf_counter()
    reader.start()
    routes = []
    with httpx.Client(timeout=60, trust_env=False) as http:
        while relayed[0] < 1 << 20 and time.perf_counter() - started < 60:  # past the longest line scanned
            asked = time.perf_counter()
            assert http.post(f"{app.url}/v1/route", json={"queries": ["what is two plus two"]}).status_code == 200
            routes.append(time.perf_counter() - asked)
    relay_s = time.perf_counter() - started
    stop.set()
    reader.join(30)
    assert relayed[0] >= 1 << 20
    return relay_s, routes


def test_a_stream_without_line_ends_costs_the_replica_what_one_with_them_does(app, upstream):
    """64-byte chunks as fast as they come. A stream that never ends a line is relayed as fast as one that ends
    a line in every chunk (scanning it for usage took seconds a MiB), and /v1/route answers meanwhile (4 ms
    alone; here the upstream, the reader and the replica share one interpreter)."""
    ordinary_s, _ = relayed_beside_routes(app, upstream, b"x" * 63 + b"\n")
    endless_line_s, routes = relayed_beside_routes(app, upstream, b"x" * 64)
    median = sorted(routes)[len(routes) // 2]
    print(
        f"1 MiB relayed in {ordinary_s:.1f} s with line ends, {endless_line_s:.1f} s without; /v1/route beside it: "
        f"median {1000 * median:.0f} ms, max {1000 * max(routes):.0f} ms over {len(routes)}"
    )
    assert endless_line_s < 2 * ordinary_s + 2.0, (ordinary_s, endless_line_s)
    assert median < 0.3, routes


# ---------------------------------------------------------------------------------------------
# A body that is seconds of checking


def invisible_body(model: str, lettered: bool = False) -> bytes:
    """A chat completion body just under the gateway's 16 MiB: user messages of 65,537 zero-width spaces, each
    checked for visible text up to the 65,536 characters the router reads, and none has any; or, `lettered`,
    the same size with a letter opening each message, where each check ends at its first character."""
    characters = ROUTING_TEXT_MAX_CHARS + 1
    count = (DEFAULT_MAX_REQUEST_BYTES - 4096) // (3 * characters + 40)  # 3 bytes each in UTF-8
    content = "a" + "\u200b" * (characters - 1) if lettered else "\u200b" * characters
    messages = [{"role": "user", "content": content}] * count
    body = json.dumps({"model": model, "messages": messages}, ensure_ascii=False).encode()
    assert DEFAULT_MAX_REQUEST_BYTES - (1 << 20) < len(body) <= DEFAULT_MAX_REQUEST_BYTES
    return body


HEARTBEAT_S = 0.01


def loop_lag_beside_a_body(app: AppServer, body: bytes) -> tuple[httpx.Response, float]:
    """(the answer to chat completion `body`, the longest the replica's event loop was late, in seconds, for a
    10 ms heartbeat run on it while that answer was awaited). Every /v1/route request waits for the loop, so a
    check run on it shows as a lag of the whole check; one run off it, as a few of the GIL's 5 ms turns."""
    lags: list[float] = []
    stop = asyncio.Event()

    async def heartbeat() -> None:
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            asked = loop.time()
            await asyncio.sleep(HEARTBEAT_S)
            lags.append(loop.time() - asked - HEARTBEAT_S)

    beating = asyncio.run_coroutine_threadsafe(heartbeat(), app.loop)
    try:
        with httpx.Client(timeout=120, trust_env=False) as http:
            answer = http.post(
                f"{app.url}/v1/chat/completions", content=body, headers={"content-type": "application/json"}
            )
    finally:
        app.loop.call_soon_threadsafe(stop.set)
        beating.result(30)
    assert lags, "the heartbeat never ran"
    return answer, max(lags)


def checking_alone_s(body: bytes) -> float:
    """Seconds the check of `body`'s messages takes in this process with nothing beside it."""
    messages = parse_chat_body(body)["messages"]
    started = time.perf_counter()
    with pytest.raises(GatewayError, match="only invisible characters"):
        routing_text(messages, "last-user")
    return time.perf_counter() - started


def assert_the_loop_was_free(alone_s: float, lag_s: float, beside_s: float = 0.0) -> None:
    """The replica's event loop did not wait for a body's check: on it, the loop is late by the whole check
    (at least the check alone); off it, by the GIL's turns between the checking thread and the loop's, and by
    `beside_s`, what the same request without the check makes it late (in this harness the upstream reading
    what it is sent shares the interpreter)."""
    assert alone_s > 0.2, alone_s  # a body that stalls the loop for long enough to show
    assert lag_s < beside_s + 0.4 * alone_s, (alone_s, lag_s, beside_s)


def test_the_loop_stays_free_while_a_body_of_invisible_text_is_checked(app, upstream):
    """Which message to route on is checked in a worker thread for a large body: on the event loop, 16 MiB of
    zero-width spaces was seconds of checking there, and every /v1/route request sent to the replica meanwhile
    waited for it."""
    body = invisible_body("benchgen-router")
    alone_s = checking_alone_s(body)
    answer, lag_s = loop_lag_beside_a_body(app, body)
    error = openai_error(answer, 400)
    assert error["param"] == "messages" and "only invisible characters" in error["message"]
    size_mib = len(body) / 2**20
    print(f"{size_mib:.1f} MiB checked alone in {alone_s:.2f} s; the loop late by {1000 * lag_s:.0f} ms at most")
    assert_the_loop_was_free(alone_s, lag_s)


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


@pytest.mark.parametrize("invisible", ["\u200b", "\x00", "\u200b\x00\ufeff"], ids=["zero-width", "nul", "mixed"])
def test_an_invisible_last_user_message_is_skipped_for_the_last_with_words(app, upstream, invisible):
    """Routed as the words before it are, not as the invisible text (which this router's tokenizer scores
    as an unknown token, and the bundled one reduces to nothing, a 400)."""
    with httpx.Client(timeout=30, trust_env=False) as http:

        def pick(text: str) -> str | None:
            answer = http.post(f"{app.url}/v1/route", json={"queries": [text]})
            return answer.json()["results"][0]["picked_agent"] if answer.status_code == 200 else None

        # Words that route elsewhere than the invisible text would, so that the agent tells which was scored.
        words = next(query for query in make_queries(40, seed=3) if pick(query) != pick(invisible))
        sent = len(upstream.requests)
        messages = [{"role": "user", "content": words}, {"role": "user", "content": invisible}]
        routed = http.post(f"{app.url}/v1/chat/completions", json={"model": "benchgen-router", "messages": messages})
        assert routed.status_code == 200, routed.text
        assert routed.headers["x-benchgen-agent"] == pick(words)
    assert len(upstream.requests) == sent + 1 and upstream.requests[-1]["messages"] == messages  # sent as it was


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
