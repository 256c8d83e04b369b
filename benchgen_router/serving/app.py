"""The HTTP API (routes and statuses in docs/service.md; the OpenAI-compatible gateway's in
docs/gateway.md): the service's one deployment, its routes, and the one place where errors become
JSON answers. Its schemas are serving/schemas.py's, its request checks serving/request_checks.py's,
feedback and the journal's health serving/feedback.py's.

Each replica is the HTTP ingress and holds the router: reading a body is a coroutine on its event
loop (a stalled upload holds one cheap slot, never the model), and the model runs on its one worker
thread, which merges the queries of every request waiting (serving/replica.py).
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations (Request) as types.
import asyncio
import functools
import logging
import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from ray import serve as ray_serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from benchgen_router.errors import InputError, RouterError, first_line
from benchgen_router.serving.call_plan import Journaled, Plan, routed_plan
from benchgen_router.serving.feedback import (
    FEEDBACK_MAX_BYTES,
    JournalMetrics,
    journal_health,
    journal_of,
    take_feedback,
)
from benchgen_router.serving.gateway import (
    LARGE_BODY_BYTES,
    LARGE_TEXT_BYTES,
    Gateway,
    GatewayError,
    GatewaySettings,
    chosen_tradeoff,
    model_entry,
    model_names,
    off_loop,
    openai_error,
    parse_chat_body,
    parse_model,
    routing_text,
)
from benchgen_router.serving.logs import quiet_repeated_warnings
from benchgen_router.serving.replica import (
    BatchMerger,
    ServedRouter,
    check_scorable,
    load_served_router,
    request_point,
    request_tradeoff,
    route_items,
    set_torch_threads,
)
from benchgen_router.serving.request_checks import (
    DEFAULT_MAX_QUERIES,
    DEFAULT_MAX_REQUEST_BYTES,
    RequestError,
    parse_route_body,
    passthrough_text,
    read_body,
    while_connected,
)
from benchgen_router.serving.schemas import (
    ERROR_RESPONSES,
    ErrorResponse,
    HealthProblem,
    PoolResponse,
    RouteRequest,
    RouteResponse,
)

logger = logging.getLogger("benchgen_router.serving")

SERVICE_NAME = "Router"
# A client that sends headers and then stalls holds one request slot; its body must arrive within
# this many seconds, or it gets a 408 and the slot is freed.
BODY_TIMEOUT_S = 10.0
# Requests one replica holds at once (reading, checking, or waiting for the model). Each costs a
# coroutine and at most one body, so the limit is high: stalled uploads fill it only by the
# thousand, and only for BODY_TIMEOUT_S.
MAX_ONGOING_REQUESTS = 2048
# Queries a replica lets wait for the model; beyond, a request is answered 503 at once rather than
# queued for seconds (at 5-10 ms a query on one core, 1024 are 5-10 s of work).
DEFAULT_MAX_WAITING_QUERIES = 1024
# How long a request waits for the router to be loaded before a 503; a probe answers at once.
READY_WAIT_S = 1.0
# What a 503 tells a client (and HAProxy) about when to come back.
RETRY_HEADERS = {"Retry-After": "1"}
# What a request whose client left is logged with (nginx's "client closed request"); no one reads it.
CLIENT_GONE_STATUS = 499
ROUTED_COUNTER = "benchgen_router_routed_queries"
# The gateway's routes: their errors are in OpenAI's shape, which its clients parse, even when no
# route matched (an unknown model name that no path can hold) or the method is wrong.
GATEWAY_PATHS = ("/v1/chat/", "/v1/models", "/v1/feedback")
REJECTED_COUNTER = "benchgen_router_rejected_requests"


# A refusal by the library (the router has no such operating point, a query it cannot score): the
# body is JSON of the right shape, but its content cannot be routed.
LIBRARY_REFUSAL_STATUS = 422


def http_error(err: BaseException) -> tuple[int, str] | None:
    """(status, one line) for a failure the service answers on purpose; None for a bug (a 500)."""
    if isinstance(err, RequestError | GatewayError):
        return err.status, str(err)
    if isinstance(err, RouterError):
        return LIBRARY_REFUSAL_STATUS, first_line(err)
    return None


api = FastAPI(
    title="BenchGen router",
    version="1",
    description="Pick which agent of an LLM pool should answer each query.",
)


def error_response(
    request: Request | None, status: int, message: str, err: BaseException | None = None
) -> JSONResponse:
    """The one-line answer; on the gateway's routes, OpenAI's error shape, which its clients parse."""
    headers = RETRY_HEADERS if status == 503 else None
    if request is not None and (
        getattr(request.state, "openai_errors", False) or request.scope["path"].startswith(GATEWAY_PATHS)
    ):
        body = openai_error(status, message, getattr(err, "code", None), getattr(err, "param", None))
        return JSONResponse(body, status_code=status, headers=headers)
    return JSONResponse({"error": message}, status_code=status, headers=headers)


@api.exception_handler(StarletteHTTPException)
async def _http_problem(request: Request, err: StarletteHTTPException) -> JSONResponse:
    path = request.scope["path"]  # as sent: request.url drops the CR LF a client may have put in it
    if err.status_code == 404 and path.startswith("/v1/models/"):  # a name the route's pattern cannot hold (CRLF)
        name = path.removeprefix("/v1/models/")
        message = f"the model {name!r} does not exist here; see GET /v1/models."
        return error_response(request, 404, message, GatewayError(404, message, code="model_not_found"))
    hints = {404: f"no such endpoint: {path!r}; see /docs", 405: f"{request.method} is not allowed here"}
    return error_response(request, err.status_code, hints.get(err.status_code, str(err.detail)))


@api.exception_handler(RequestValidationError)
async def _invalid_request(request: Request, err: RequestValidationError) -> JSONResponse:
    errors = err.errors()
    where = ".".join(str(part) for part in errors[0].get("loc", ())) if errors else "request"
    message = errors[0].get("msg", "invalid") if errors else "invalid"
    return JSONResponse({"error": f"{where}: {message}"}, status_code=422)


@api.exception_handler(Exception)
async def _unexpected(request: Request, err: Exception) -> JSONResponse:
    logger.exception("request failed")
    return error_response(request, 500, f"internal error ({type(err).__name__}: {first_line(err)})")


# Every error of the package is answered here, through http_error. By class, not under Exception:
# Starlette re-raises what its catch-all answers, and logs it as a crash.
@api.exception_handler(RouterError)
async def _router_error(request: Request, err: Exception) -> JSONResponse:
    answer = http_error(err)
    if answer is None:
        return await _unexpected(request, err)
    status, message = answer
    return error_response(request, status, message, err)


@ray_serve.deployment(name=SERVICE_NAME)
@ray_serve.ingress(api)
class RouterService:
    """The service's one deployment: each replica reads and checks its requests, scores them with the
    router it holds, and with a pool of upstreams is the OpenAI-compatible gateway in front of them."""

    def __init__(
        self,
        model: str | None,
        revision: str | None,
        backbone: str | None,
        pool: list[dict[str, Any]] | None,
        threads: int,
        max_batch_size: int,
        batch_wait_s: float,
        operating_point: str | None = None,
        max_queries: int = DEFAULT_MAX_QUERIES,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        gateway: GatewaySettings | None = None,
        max_waiting_queries: int = DEFAULT_MAX_WAITING_QUERIES,
    ) -> None:
        from ray.serve.metrics import Counter as ServeCounter

        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the tokenizer runs in two threads
        quiet_repeated_warnings()  # a replica at capacity says so for each request it hands back
        self.gateway = Gateway(gateway) if gateway is not None else None
        self.created = int(time.time())  # the "created" of the models GET /v1/models lists
        self.max_queries = max_queries
        self.max_request_bytes = max_request_bytes
        # The model runs in one worker thread, so the event loop keeps reading requests (and gathering
        # the next batch) while a batch is scored. It loads the router first, so that the replica
        # answers /healthz (a 503) while it loads.
        self.executor = ThreadPoolExecutor(
            1, thread_name_prefix="router", initializer=set_torch_threads, initargs=[threads]
        )
        self.loading = self.executor.submit(load_served_router, model, revision, backbone, pool, operating_point)
        self.loaded: ServedRouter | None = None
        self.merger: BatchMerger | None = None
        self.max_batch_size, self.batch_wait_s = max_batch_size, batch_wait_s
        self.max_waiting_queries = max_waiting_queries
        self.routed = ServeCounter(ROUTED_COUNTER, description="Queries routed, by picked agent.", tag_keys=("agent",))
        self.rejected = ServeCounter(REJECTED_COUNTER, description="Requests refused, by status.", tag_keys=("status",))
        self.journal_metrics = JournalMetrics() if self.gateway is not None and self.gateway.journal else None

    async def __del__(self) -> None:
        # Ray Serve's ingress wrapper awaits this when the replica stops, after the app's lifespan shutdown.
        if self.gateway is not None:
            await self.gateway.close()
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def ready(self) -> ServedRouter:
        """The loaded router; a 503 while it loads (after waiting up to READY_WAIT_S), or when it cannot serve."""
        if self.loaded is None:
            try:
                loaded = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(self.loading)), READY_WAIT_S)
            except TimeoutError:
                raise RequestError(503, "the router is still loading; retry in a few seconds.") from None
            if self.gateway is not None and loaded.problem is None:
                loaded.problem = self.gateway.key_problem()
            if loaded.problem is None:
                scorer = functools.partial(route_items, loaded.router, loaded.tokenizer)
                self.merger = BatchMerger(scorer, self.executor, self.max_batch_size, self.batch_wait_s)
            self.loaded = loaded
        if self.loaded.problem:
            raise RequestError(503, self.loaded.problem)
        return self.loaded

    async def scored(
        self, loaded: ServedRouter, queries: list[str], asked_point: Any, asked_tradeoff: Any = None
    ) -> list[dict[str, Any]]:
        """pick_agent's result for each query, merged with the other requests' queries (at any point and
        trade-off) into few model runs."""
        point = loaded.default_point if asked_point is None else request_point(loaded.router, asked_point)
        try:
            tradeoff = request_tradeoff(loaded.router, asked_tradeoff)
        except InputError as refused:  # a rule is chosen by the client, so a bad one is a bad request
            raise RequestError(400, first_line(refused)) from None
        assert self.merger is not None  # made by ready()
        if self.merger.queued + len(queries) > self.max_waiting_queries:
            raise RequestError(
                503,
                f"the router has {self.merger.queued} queries waiting, its limit is {self.max_waiting_queries}; "
                "retry shortly.",
            )
        outcomes = await self.merger.submit([(query, point, tradeoff) for query in queries])
        check_scorable(outcomes)
        return outcomes

    def update_journal_metrics(self) -> None:
        if self.journal_metrics is not None:
            assert self.gateway is not None  # a journal is the gateway's
            self.journal_metrics.update(self.gateway)

    def count_refusal(self, err: Exception) -> None:
        refused = http_error(err)
        if refused is not None:
            self.rejected.inc(1, tags={"status": str(refused[0])})

    @api.post(
        "/v1/route",
        response_model=None,
        responses={200: {"model": RouteResponse, "description": "One result per query."}, **ERROR_RESPONSES},
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": RouteRequest.model_json_schema()}},
            }
        },
        summary="Pick the agent for each query",
    )
    async def route(self, request: Request) -> JSONResponse:
        try:
            loaded = await self.ready()
            body = await read_body(request, self.max_request_bytes, BODY_TIMEOUT_S)
            queries, asked_point, asked_tradeoff = parse_route_body(body, self.max_queries)
            results = await self.scored(loaded, queries, asked_point, asked_tradeoff)
        except Exception as err:  # counted here, answered by the error handler
            self.count_refusal(err)
            raise
        for agent, count in Counter(result["picked_agent"] for result in results).items():
            self.routed.inc(count, tags={"agent": agent})
        return JSONResponse({"results": results, "router": loaded.identity})

    @api.get(
        "/v1/pool",
        response_model=PoolResponse,
        response_model_exclude_none=True,
        responses={503: {"model": ErrorResponse}},
        summary="The router's agents in pool order, and its operating points",
    )
    async def pool_agents(self) -> dict[str, Any]:
        loaded = await self.ready()
        return {"agents": loaded.pool, "operating_points": loaded.points, "router": loaded.identity}

    @api.api_route(
        "/healthz",
        methods=["GET", "HEAD"],
        summary="200 once the router is loaded (with the traffic journal's state), a JSON 503 until then",
        responses={503: {"model": HealthProblem}},
    )
    async def healthz(self) -> Any:
        try:
            loaded = await self.ready()
        except RequestError as err:
            state = "loading" if self.loaded is None else "failed"
            return JSONResponse({"error": str(err), "status": state}, status_code=503, headers=RETRY_HEADERS)
        health: dict[str, Any] = {"status": "ok", "router": loaded.identity}
        if self.gateway is not None and self.gateway.journal is not None:
            # Still a 200 when the journal cannot write: answers do not need it, and a 503 would take the
            # replica out of service for what costs no answer.
            self.update_journal_metrics()
            health["journal"] = journal_health(self.gateway.journal)
        return health

    # -----------------------------------------------------------------------------------------
    # The OpenAI-compatible gateway (docs/gateway.md)

    def gateway_on(self, request: Request) -> Gateway:
        request.state.openai_errors = True  # the error handler answers in OpenAI's shape
        if self.gateway is None:
            raise GatewayError(
                404,
                "this service's pool file names no upstreams, so it has no OpenAI-compatible gateway; give its "
                "agents a base_url (see docs/gateway.md) and restart it with that --pool.",
                code="gateway_not_configured",
            )
        return self.gateway

    @api.post(
        "/v1/chat/completions",
        response_model=None,
        summary="OpenAI chat completions: routed (model benchgen-router[:point or :rule]) or passed to the agent named",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "required": ["model", "messages"],
                            "properties": {
                                "model": {"type": "string", "examples": ["benchgen-router"]},
                                "messages": {"type": "array", "items": {"type": "object"}},
                                "stream": {"type": "boolean"},
                            },
                        }
                    }
                },
            }
        },
    )
    async def chat_completions(self, request: Request) -> Response:
        try:
            return await self.chat_counted(request)
        except Exception as err:  # counted here, answered by the error handler
            self.count_refusal(err)
            raise
        finally:
            self.update_journal_metrics()

    async def chat_counted(self, request: Request) -> Response:
        gateway = self.gateway_on(request)
        loaded = await self.ready()
        body = await read_body(request, gateway.settings.max_request_bytes, BODY_TIMEOUT_S)
        big, long_text = len(body) > LARGE_BODY_BYTES, len(body) > LARGE_TEXT_BYTES
        payload = await off_loop(big, parse_chat_body, body)
        target = parse_model(payload.get("model"), gateway.settings.upstreams, loaded.point_names)
        route_on = gateway.settings.route_on
        if target.upstream is not None:
            plan = Plan(attempts=(target.upstream,), routed=False)
            # The text the router would score is looked for only for the journal line: nothing scores it.
            routed = await off_loop(long_text, passthrough_text, payload, route_on) if gateway.journal else None
            return await self.relayed(request, gateway, payload, plan, big, gateway.journaled(payload, routed))
        tradeoff = chosen_tradeoff(target, payload)
        try:
            request_tradeoff(loaded.router, tradeoff)
        except InputError as refused:
            where = "model" if target.tradeoff is not None else "tradeoff"
            raise GatewayError(400, first_line(refused), param=where) from None
        routed = await off_loop(long_text, routing_text, payload.get("messages"), route_on)
        try:
            (result,) = await self.scored(loaded, [routed.text], target.point, tradeoff)
        except RouterError as refusal:  # text the router's tokenizer reduces to nothing
            if isinstance(refusal, RequestError):
                raise
            raise GatewayError(
                400,
                "the user text the router scores is nothing once tokenized (only invisible or unknown "
                "characters); send a message with words.",
                param="messages",
            ) from None
        self.routed.inc(1, tags={"agent": result["picked_agent"]})
        router_fallback = loaded.fallbacks.get(result.get("operating_point"))
        plan = routed_plan(result, gateway.settings.upstreams, gateway.settings.fallback_agent, router_fallback)
        journaled = gateway.journaled(payload, routed)
        if journaled is not None:
            journaled.decision = result
        return await self.relayed(request, gateway, payload, plan, big, journaled)

    async def relayed(
        self,
        request: Request,
        gateway: Gateway,
        payload: dict[str, Any],
        plan: Plan,
        big: bool,
        journaled: Journaled | None,
    ) -> Response:
        """The upstream's answer; its call cancelled as soon as the client leaves (a stream's relay stops the
        same way, in UpstreamStream). Journaled once, however it ends."""
        answer = await while_connected(request, gateway.forward(payload, plan, big, journaled))
        if answer is None:
            logger.info(
                "gateway: a client left before its answer; the call to %s was cancelled", plan.attempts[0].agent
            )
            gateway.record(journaled, CLIENT_GONE_STATUS, None, None)
            return Response(status_code=CLIENT_GONE_STATUS)
        return answer

    @api.post(
        "/v1/feedback",
        response_model=None,
        summary="A score from 0 to 1 for a journaled gateway answer, by its x-benchgen-request-id",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "required": ["request_id", "score"],
                            "properties": {
                                "request_id": {"type": "string"},
                                "score": {"type": "number", "minimum": 0, "maximum": 1},
                                "comment": {"type": "string"},
                            },
                        }
                    }
                },
            }
        },
    )
    async def feedback(self, request: Request) -> JSONResponse:
        try:
            gateway = self.gateway_on(request)
            journal = journal_of(gateway)
            body = await read_body(request, FEEDBACK_MAX_BYTES, BODY_TIMEOUT_S)
            request_id, score = take_feedback(journal, body)
        except Exception as err:  # counted here, answered by the error handler
            self.count_refusal(err)
            raise
        finally:
            self.update_journal_metrics()
        return JSONResponse({"object": "feedback", "request_id": request_id, "score": score})

    @api.get("/v1/models", summary="OpenAI's model list: the router, at each operating point, and each agent")
    async def models(self, request: Request) -> dict[str, Any]:
        self.gateway_on(request)
        loaded = await self.ready()
        return {"object": "list", "data": [model_entry(name, self.created) for name in self.model_names(loaded)]}

    @api.get("/v1/models/{model:path}", summary="One model of GET /v1/models (an agent also by its slug)")
    async def model(self, request: Request, model: str) -> dict[str, Any]:
        gateway = self.gateway_on(request)
        loaded = await self.ready()
        if model in self.model_names(loaded) or gateway.settings.upstreams.resolve(model) is not None:
            return model_entry(model, self.created)
        raise GatewayError(404, f"the model {model!r} does not exist here; see GET /v1/models.", code="model_not_found")

    def model_names(self, loaded: ServedRouter) -> list[str]:
        return model_names(loaded.point_names, [agent["id"] for agent in loaded.pool])
