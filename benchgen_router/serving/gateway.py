"""The OpenAI-compatible gateway (docs/gateway.md): which agent a chat completion goes to, the call
to that agent's upstream, and the answer with the decision in its headers.

    {"model": "benchgen-router", "messages": [...]}        routed at the service's default operating point
    {"model": "benchgen-router:fast", "messages": [...]}   routed at the operating point "fast"
    {"model": "benchgen-router:budget=0.3", ...}          a probability head, under that trade-off rule
    {"model": "<agent id or slug>", "messages": [...]}     passed straight to that agent, unrouted

The routes themselves are the service's deployment's (serving/app.py), which relays in the process that scores.
A call's plan (the agents it tries) and its journal line are serving/call_plan.py's; one upstream call's
exchange is serving/upstream_call.py's; masking the pool's keys in what is relayed, serving/redaction.py's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
from ray.exceptions import TaskCancelledError
from starlette.requests import ClientDisconnect
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from benchgen_router import chat_text
from benchgen_router.chat_text import ROUTE_ON, RoutingText
from benchgen_router.errors import InputError, setting_error
from benchgen_router.serving.call_plan import Journaled, Plan
from benchgen_router.serving.call_usage import (
    CallUsage,
    GatewayMetrics,
    StreamUsage,
    body_usage,
    cost_headers,
)
from benchgen_router.serving.journal import Retention, TrafficJournal
from benchgen_router.serving.redaction import KeyRedactor, StreamRedactor, key_redactor
from benchgen_router.serving.upstream_call import (
    ResponseTooLarge,
    call_upstream,
    encode_body,
    failure_reason,
    relayed_headers,
)
from benchgen_router.upstreams import Upstream, UpstreamPool, retryable_status

logger = logging.getLogger("benchgen_router.serving")

ROUTER_MODEL = "benchgen-router"
DEFAULT_TIMEOUT_S = 120.0
# A refused or unreachable host is known within a few seconds; the rest of the timeout is for the answer.
CONNECT_TIMEOUT_S = 10.0
# Chat bodies carry whole conversations and base64 images: far more than a /v1/route body.
DEFAULT_MAX_REQUEST_BYTES = 16 << 20
# Bodies past this size are parsed and written in a thread: tens of milliseconds of JSON on the event
# loop would stall every stream this replica relays, and the requests it reads.
LARGE_BODY_BYTES = 1 << 20
# The text to route on is found by looking at messages character by character (is any visible?), 50-120 ms
# a MiB of zero-width characters: past this size the look is taken in a thread, so that the event loop
# never waits on it for more than a few milliseconds (a 16 MiB body held it for up to 1.4 s, docs/gateway.md).
LARGE_TEXT_BYTES = 64 << 10
# A stream that arrives faster than it is relayed is read from buffers without a pause: its relay gives the
# event loop back after this long, so that the replica's other requests (and streams) are served meanwhile.
RELAY_TURN_S = 0.001
# Idle upstream connections kept open: a burst of calls to an HTTPS upstream then skips new handshakes.
KEEPALIVE_CONNECTIONS = 256
# A non-streamed answer is held whole before it is relayed: past this size it is refused (a 502), unread.
DEFAULT_MAX_RESPONSE_BYTES = 32 << 20


class GatewayError(InputError):
    """A chat completion the gateway refuses or could not get answered: its HTTP status, and the `code`
    and `param` of OpenAI's error shape."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.param = status, code, param

    def __reduce__(self) -> tuple[type, tuple[int, str, str | None, str | None]]:
        return type(self), (self.status, str(self), self.code, self.param)


def openai_error(status: int, message: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error body, which its clients parse into their exceptions."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass(frozen=True)
class GatewaySettings:
    """What a replica needs to forward chat completions; sent to it with the application."""

    upstreams: UpstreamPool
    route_on: str = "last-user"  # or "first-user", "conversation": what the router scores (routing_text)
    fallback_agent: str | None = None  # None: the router's fallback for the point, else the head's next choice
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    journal: str | None = None  # a folder: every call journaled there (serving/journal.py)
    journal_text: bool = False  # the routed text stored too, not only its salted hash
    journal_retention: Retention = field(default_factory=Retention)  # what the folder keeps, in bytes and days


def names_upstreams(document: Any) -> bool:
    """Whether a pool file (parsed) names upstreams: a base_url for the pool or for any agent."""
    if isinstance(document, dict):
        if "base_url" in document:
            return True
        document = document.get("agents")
    return isinstance(document, list) and any(isinstance(row, dict) and "base_url" in row for row in document)


def check_gateway_settings(route_on: str, fallback_agent: str | None, timeout_s: float, agents: Sequence[str]) -> None:
    if route_on not in ROUTE_ON:
        raise setting_error(f"{{route_on}} must be one of {', '.join(ROUTE_ON)}, got {route_on!r}.")
    if fallback_agent is not None and fallback_agent not in agents:
        raise setting_error(
            f"{{gateway_fallback={fallback_agent}}} is not an agent of the pool; pass one of {', '.join(agents)}."
        )
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not timeout_s > 0:
        raise setting_error(
            f"{{gateway_timeout_s}} must be a number of seconds > 0, got {timeout_s!r}.",
            {"gateway_timeout_s": "--gateway-timeout"},
        )


# ---------------------------------------------------------------------------------------------
# What a request asks for


@dataclass(frozen=True)
class Target:
    """A model name resolved: an agent to call as asked (pass-through), or routing at `point`
    (None: the service's default point) under `tradeoff` (a probability head's rule, docs/tradeoff.md;
    None: its default)."""

    upstream: Upstream | None = None
    point: str | None = None
    tradeoff: str | None = None


def parse_model(name: Any, upstreams: UpstreamPool, points: Sequence[str]) -> Target:
    if not isinstance(name, str) or not name:
        raise GatewayError(
            400, f'the body names no "model"; send "{ROUTER_MODEL}" to route, or an agent id.', param="model"
        )
    if name == ROUTER_MODEL:
        return Target()
    if name.startswith(f"{ROUTER_MODEL}:"):
        point = name.split(":", 1)[1]
        if "=" in point:  # a trade-off rule (budget=0.3); operating point names never hold "="
            return Target(tradeoff=point)
        if point not in points:
            choices = (
                f"send one of {', '.join(f'{ROUTER_MODEL}:{p}' for p in points)}"
                if points
                else f'this router has a single head: send "{ROUTER_MODEL}"'
            )
            raise GatewayError(
                400, f"model {name!r}: {point!r} is not an operating point of this router; {choices}.", param="model"
            )
        return Target(point=point)
    upstream = upstreams.resolve(name)
    if upstream is None:
        raise GatewayError(
            404,
            f"the model {name!r} does not exist here; send {ROUTER_MODEL}, {ROUTER_MODEL}:<operating point>, "
            f"{ROUTER_MODEL}:<trade-off rule> or an agent of GET /v1/models.",
            code="model_not_found",
            param="model",
        )
    return Target(upstream=upstream)


def chosen_tradeoff(target: Target, payload: Mapping[str, Any]) -> str | None:
    """The trade-off a routed request asks for: from its model name or its "tradeoff" field (both only
    when they agree); its spelling is checked against the router afterwards."""
    in_body = payload.get("tradeoff")
    if in_body is not None and not isinstance(in_body, str):
        raise GatewayError(
            400, f'"tradeoff" is {type(in_body).__name__}, not a rule; send e.g. "budget=0.3".', param="tradeoff"
        )
    if in_body is not None and target.tradeoff is not None and in_body != target.tradeoff:
        raise GatewayError(
            400,
            f'the model name asks for the trade-off {target.tradeoff!r} and "tradeoff" for {in_body!r}; send one.',
            param="tradeoff",
        )
    return target.tradeoff if target.tradeoff is not None else in_body


def routing_text(messages: Any, route_on: str) -> RoutingText:
    """chat_text.routing_text, its refusal a 400 naming the messages."""
    try:
        return chat_text.routing_text(messages, route_on)
    except InputError as err:
        raise GatewayError(400, str(err), param="messages") from None


class NotJsonNumber(ValueError):
    """NaN, Infinity, or a number too large for a float: Python's json reads them, JSON has none."""


def finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NotJsonNumber(text)
    return value


def not_a_number(text: str) -> float:
    raise NotJsonNumber(text)


def parse_chat_body(body: bytes, expected: str = "an OpenAI chat completion request") -> dict[str, Any]:
    """The request's JSON object, with its documented fields' types checked; no NaN or Infinity, which
    would be sent upstream as invalid JSON."""
    try:
        payload = json.loads(body, parse_constant=not_a_number, parse_float=finite_float)
    except NotJsonNumber as err:
        raise GatewayError(
            400, f"the body holds the number {err}, which JSON does not allow; send finite numbers."
        ) from None
    except (ValueError, RecursionError):
        raise GatewayError(400, f"the body is not valid JSON; send {expected}.") from None
    if not isinstance(payload, dict):
        raise GatewayError(400, f"the body is a JSON {type(payload).__name__}, not an object.")
    stream = payload.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise GatewayError(
            400, f'"stream" is {json.dumps(stream)[:40]}, not a boolean; send true or false.', param="stream"
        )
    return payload


async def off_loop(big: bool, function: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.to_thread(function, *args) if big else function(*args)


def model_names(points: Sequence[str], agents: Sequence[str]) -> list[str]:
    """What GET /v1/models lists: the router at its default point and at each point, then each agent."""
    return [ROUTER_MODEL, *(f"{ROUTER_MODEL}:{point}" for point in points), *agents]


def model_entry(name: str, created: int) -> dict[str, Any]:
    owner = ROUTER_MODEL if name.split(":", 1)[0] == ROUTER_MODEL else "pool"
    return {"id": name, "object": "model", "created": created, "owned_by": owner}


# ---------------------------------------------------------------------------------------------
# Metrics and the calls


class Gateway:
    """One per replica: the settings, the metrics, and one HTTP client that every call shares."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.metrics = GatewayMetrics()
        self.http: httpx.AsyncClient | None = None
        logging.getLogger("httpx").setLevel(logging.WARNING)  # else a log line per upstream call
        self.journal: TrafficJournal | None = None
        if settings.journal:
            retention = settings.journal_retention
            self.journal = TrafficJournal(Path(settings.journal), keep_text=settings.journal_text, retention=retention)
        self.journal_failures_counted = 0

    def journaled(self, payload: Mapping[str, Any], routed: RoutingText | None) -> Journaled | None:
        """A request's journal line to fill in (None without a journal), with its new request id."""
        if self.journal is None:
            return None
        text, cut = (None, False) if routed is None else (routed.text, routed.cut)
        model, stream = str(payload.get("model")), payload.get("stream") is True
        return Journaled(self.journal.new_request_id(), model, text, cut, stream)

    def record(self, journaled: Journaled | None, status: int, usage: CallUsage | None, total_s: float | None) -> None:
        """Journal a request once, however it ended; the journal's write failures reach the metrics."""
        if journaled is None or journaled.written or self.journal is None:
            return
        journaled.written = True
        self.journal.record_call(journaled.entry(status, usage, total_s), journaled.text, journaled.text_cut)
        self.count_journal_failures()

    def count_journal_failures(self) -> None:
        """The journal counts what its writer thread could not write; the counter follows it."""
        if self.journal is not None and self.journal.write_failures > self.journal_failures_counted:
            self.metrics.journal_failures.inc(self.journal.write_failures - self.journal_failures_counted)
            self.journal_failures_counted = self.journal.write_failures

    def key_problem(self, environ: Mapping[str, str] = os.environ) -> str | None:
        """Why this process cannot call the upstreams: a key variable the driver had and it lacks."""
        upstreams = self.settings.upstreams.upstreams.values()
        missing = sorted({up.api_key_env for up in upstreams if up.api_key_env and not environ.get(up.api_key_env)})
        if not missing:
            return None
        return (
            f"the gateway's process has no {', '.join(missing)} (api_key_env of the pool file); set it where the "
            "service runs (on a Ray cluster, on every node)."
        )

    def client(self) -> httpx.AsyncClient:
        # Made on the first call, in the event loop that the requests run in.
        if self.http is None:
            timeout_s = self.settings.timeout_s
            self.http = httpx.AsyncClient(
                timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, CONNECT_TIMEOUT_S)),
                # No cap on connections: the replica's request slots bound them already.
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=KEEPALIVE_CONNECTIONS),
            )
        return self.http

    async def close(self) -> None:
        """Close the upstream connections, then the journal (its queued lines written and synced)."""
        try:
            if self.http is not None:
                http, self.http = self.http, None
                await http.aclose()
        finally:
            if self.journal is not None:
                await asyncio.to_thread(self.journal.close)

    async def forward(
        self, payload: dict[str, Any], plan: Plan, big: bool, journaled: Journaled | None = None
    ) -> Response:
        """The first answer of the plan's agents that is neither a failure nor a 429/5xx: a JSON answer
        whole, a stream as it comes (UpstreamStream). The last agent's 429 is passed on, with its
        Retry-After; when every agent fails, a 502. `journaled`: the request's journal line, written
        here (a stream's once it ends)."""
        stream = payload.get("stream") is True
        failures: list[str] = []
        for position, upstream in enumerate(plan.attempts):
            if journaled is not None:
                journaled.agent = upstream.agent
                journaled.retried_from = plan.attempts[0].agent if position else None
            body = await off_loop(big, encode_body, payload, upstream.model)
            started = time.perf_counter()
            try:
                reply, content, first_byte_s = await call_upstream(
                    self.client(), upstream, body, stream, self.settings.max_response_bytes
                )
            except httpx.HTTPError as err:
                failures.append(self.failed(upstream, *failure_reason(err, self.settings.timeout_s)))
                continue
            except ResponseTooLarge as err:  # not retried: the call was answered, and billed
                self.failed(upstream, "too_large", str(err))
                self.metrics.answered(plan.kind, upstream.agent, 502)
                self.record(journaled, 502, None, time.perf_counter() - started)
                raise GatewayError(502, f"agent '{upstream.agent}' {err}.", code="upstream_error") from None
            status = reply.status_code
            if retryable_status(status):
                words = self.failed(upstream, str(status), f"answered {status}")
                if not (status == 429 and position == len(plan.attempts) - 1):
                    failures.append(words)
                    continue
            redactor = self.redactor()
            headers = {**relayed_headers(reply, redactor), **plan.headers(upstream)}
            if journaled is not None:
                headers["x-benchgen-request-id"] = journaled.request_id
                journaled.first_byte_s = first_byte_s
            self.metrics.answered(plan.kind, upstream.agent, status)
            if content is None:
                return UpstreamStream(reply, upstream, headers, self, started, StreamRedactor(redactor), journaled)
            usage = body_usage(content) if reply.is_success else None
            total_s = time.perf_counter() - started
            counted = self.metrics.finished(upstream, usage, total_s, stream=False)
            self.record(journaled, status, counted, total_s)
            masked = await off_loop(len(content) > LARGE_BODY_BYTES, redactor.redact, content)
            return Response(masked, status_code=status, headers={**headers, **cost_headers(counted)})
        self.metrics.answered(plan.kind, plan.attempts[0].agent, 502)
        self.record(journaled, 502, None, None)
        raise GatewayError(502, f"no upstream answered: {'; '.join(failures)}.", code="upstream_error")

    def redactor(self) -> KeyRedactor:
        """Every key of the pool, as this process's environment holds them, to mask in what is relayed: an
        upstream that echoes a key back, routed or not, in its body, headers or stream, hands it to no client."""
        upstreams = self.settings.upstreams.upstreams.values()
        return key_redactor(tuple(sorted({key for upstream in upstreams if (key := upstream.api_key())})))

    def failed(self, upstream: Upstream, reason: str, words: str) -> str:
        self.metrics.failures.inc(1, tags={"agent": upstream.agent, "reason": reason})
        logger.warning("gateway: agent %s at %s failed: %s", upstream.agent, upstream.base_url, words)
        return f"agent '{upstream.agent}': {words}"


class UpstreamStream(StreamingResponse):
    """An upstream's stream relayed chunk by chunk. However the relay ends (the stream is done, the upstream
    fails, the client goes away and Ray Serve cancels the request), the upstream call is closed, its usage
    counted."""

    def __init__(
        self,
        reply: httpx.Response,
        upstream: Upstream,
        headers: dict[str, str],
        gateway: Gateway,
        started: float,
        redactor: StreamRedactor,
        journaled: Journaled | None = None,
    ) -> None:
        self.reply, self.upstream, self.gateway, self.journaled = reply, upstream, gateway, journaled
        self.redactor = redactor
        self.metrics, self.timeout_s = gateway.metrics, gateway.settings.timeout_s
        self.started = started
        self.usage = StreamUsage()
        self.counted: CallUsage | None = None  # the stream's usage as counted, once it ends
        super().__init__(self.relay(), status_code=reply.status_code, headers=headers)

    async def relay(self) -> AsyncIterator[bytes]:
        """The upstream's bytes as they come, masked (only a tail that may begin a key waits for the next chunk),
        the event loop given back every RELAY_TURN_S."""
        try:
            turn_began = time.perf_counter()
            async for chunk in self.reply.aiter_bytes():
                self.usage.feed(chunk)
                if masked := self.redactor.feed(chunk):
                    yield masked
                if time.perf_counter() - turn_began > RELAY_TURN_S:
                    await asyncio.sleep(0)
                    turn_began = time.perf_counter()
        except httpx.HTTPError as err:
            # The status is sent: the failure can only be told in the stream, as OpenAI's clients read it.
            _, words = failure_reason(err, self.timeout_s)
            logger.warning("gateway: agent %s failed mid-stream: %s", self.upstream.agent, words)
            error = openai_error(502, f"agent '{self.upstream.agent}' failed mid-stream: {words}.", "upstream_error")
            yield self.redactor.finish() + f"data: {json.dumps(error)}\n\n".encode()
        else:
            if tail := self.redactor.finish():
                yield tail

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except (TaskCancelledError, ClientDisconnect):
            # The client went away mid-stream (Ray Serve cancels the request): no one is left to answer.
            logger.debug("gateway: a client left the stream of agent %s", self.upstream.agent)
        finally:
            with anyio.CancelScope(shield=True):  # the request may be cancelled: the upstream is closed anyway
                await self.reply.aclose()
            self.usage.finish()
            total_s = time.perf_counter() - self.started
            self.counted = self.metrics.finished(self.upstream, self.usage.usage, total_s, stream=True)
            self.gateway.record(self.journaled, self.reply.status_code, self.counted, total_s)
