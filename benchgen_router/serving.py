"""The router as an HTTP service (Ray Serve) and bulk routing of files (Ray Data).

Service (`serve()`): each replica loads the router once and answers

    POST /v1/route  {"queries": ["...", ...]}  ->  {"results": [...], "router": {"name", "revision"}}
    GET  /v1/pool                              ->  the agents in pool order (slug and prices with a pool file),
                                                   and the router's operating points when it has several heads
    GET  /healthz                              ->  200 once the router is loaded
    GET  /openapi.json, /docs                  ->  the API's OpenAPI schema and its browsable form

Each result is exactly what `pick_agent` returns for the query, in request order. Queries of
concurrent requests are gathered with Ray Serve's dynamic batching (`@serve.batch`), and the
batches that close while the model is busy are merged (BatchMerger), so each `run_router` call
scores every query that is waiting, up to `max_batch_size`. Picks never depend on batching; the scores agree to float32
rounding (about 1e-5: a query's sums are accumulated in an order that depends on its batch).

A router trained at several quality/cost/latency trade-offs (operating points) answers a request
at its "operating_point" ({"queries": [...], "operating_point": "quality"}), else at the service's
default (`serve(operating_point=)`, else the router's own); each result then names its point. The
backbone runs once per merged batch whatever points its requests ask for: only the small heads
are applied per point (routing.results_for).

Bad requests get a 4xx answer with one line, {"error": "..."}, and never fail other requests:
400 for a body that is not a JSON object, 413 for more than `max_queries` queries or
`max_request_bytes` bytes per request (defaults 256 and 1 MiB), 422 for a missing or empty
`queries` list, an item that is not text, a query the router cannot score (blank, or only
characters its tokenizer drops such as U+200B or a byte-order mark), or an `operating_point` that
is not one of the router's (or given to a router with one head).

Metrics (Prometheus text at the Ray node's metrics port, `http://HOST:PORT/metrics`): Ray Serve's
own (requests, latencies, batch sizes, replica health) plus `ray_benchgen_router_routed_queries_total`
(tag `agent`: queries routed to each agent) and `ray_benchgen_router_rejected_requests_total`
(tag `status`).

The same deployment runs on a Ray cluster (`address=`): the replicas import this package, so it
must be installed on every node; the router is loaded on each replica from `model` (a Hub id, or a
folder every node can read). A pool file is read here, on the driver, and sent to the replicas.

Bulk routing (`route_file_with_ray()`): the records the local engine (`benchgen-router route --input`) writes,
the router run by a pool of Ray actors that each load it once. See its docstring.
"""

import asyncio
import contextlib
import copy
import functools
import hashlib
import json
import logging
import math
import os
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import ray
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from ray import serve as ray_serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from benchgen_router.costs import read_pool_file
from benchgen_router.errors import UsageError, first_line
from benchgen_router.files import (
    Query,
    atomic_output,
    choose_id_field,
    choose_text_field,
    input_format,
    open_input,
    read_queries,
    text_problem,
)
from benchgen_router.loading import load_router
from benchgen_router.routing import operating_point_of, results_for, route_queries

logger = logging.getLogger("benchgen_router.serving")

APP_NAME = "benchgen-router"
DEPLOYMENT_NAME = "Router"
DEFAULT_MAX_QUERIES = 256
DEFAULT_MAX_REQUEST_BYTES = 1 << 20
# A client that sends headers and then stalls holds one of a replica's request slots; its body must
# arrive within this many seconds, or it gets a 408 and the slot is freed.
BODY_TIMEOUT_S = 10.0
# One torch thread per CPU a replica is given. More threads than free cores is much slower: on a
# busy 2-core machine one query took 992 ms in-process with torch's default of 2 threads against
# 27 ms with 1 (bench/service.py; the threads spin waiting for cores other processes hold).
DEFAULT_REPLICA_CPUS = 1
ROUTED_COUNTER = "benchgen_router_routed_queries"
REJECTED_COUNTER = "benchgen_router_rejected_requests"


# ---------------------------------------------------------------------------------------------
# Request checks (shared by the service and bulk routing)


def token_problems(tokenizer: Any, config: Any, texts: Sequence[str]) -> list[str | None]:
    """For each text, why the router cannot score it, or None. A text whose tokens are only the
    tokenizer's own special ones ([CLS] [SEP] for BERT, nothing for Qwen) carries nothing to route
    on: zero-width spaces, byte-order marks and lone control characters tokenize to nothing, and
    the model refuses such a query (ValueError), so they are found here, before the model runs."""
    if not texts:
        return []
    special = getattr(config, "special_tokens_per_query", 0)
    encoded = tokenizer(list(texts), add_special_tokens=True)["input_ids"]
    return [
        "has no tokens this router can read (only invisible or control characters)" if len(ids) <= special else None
        for ids in encoded
    ]


def route_texts(
    router: Any, tokenizer: Any, texts: Sequence[str], points: Sequence[str | None] | None = None
) -> list[dict[str, Any] | str]:
    """pick_agent's result for each text, from one model run, each at its operating point (`points`,
    one per text, checked beforehand; None: all at the router's default). A text the model still
    refuses (ValueError: it checks for empty queries itself) gets its one-line reason instead of a
    result, found by routing the batch's texts one at a time, so it never fails the others."""
    try:
        return results_for(router, route_queries(router, tokenizer, texts, operating_points=points))
    except ValueError:
        outcomes: list[dict[str, Any] | str] = []
        for position, text in enumerate(texts):
            try:
                point = None if points is None else points[position]
                outcomes.append(
                    results_for(router, route_queries(router, tokenizer, [text], operating_points=point))[0]
                )
            except ValueError as err:
                outcomes.append(first_line(err))
        return outcomes


def route_items(router: Any, tokenizer: Any, items: Sequence[tuple[str, str | None]]) -> list[dict[str, Any] | str]:
    """route_texts() of (text, operating point) pairs: the service's batches, whose requests may
    each ask for a different point."""
    return route_texts(router, tokenizer, [text for text, _ in items], [point for _, point in items])


def router_identity(router: Any, model: str | None, revision: str | None) -> dict[str, str | None]:
    """{"name", "revision"} of a loaded router: the name it was asked for ("default" for the
    bundled one); the revision asked for, else the Hub commit it was loaded at, else a digest of
    its head and pool ("sha256:..."), so clients can tell which router answered them."""
    resolved = revision or getattr(router.config, "_commit_hash", None)
    if resolved is None:
        digest = hashlib.sha256(json.dumps(list(router.config.agent_order)).encode())
        for name, tensor in sorted(router.head.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().float().cpu().numpy().tobytes())
        resolved = f"sha256:{digest.hexdigest()[:16]}"
    return {"name": "default" if model is None else str(model), "revision": resolved}


def set_torch_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):  # only settable before the first inter-op work
        torch.set_num_interop_threads(1)


class BatchMerger:
    """Runs the model on every batch Ray Serve hands over, merging the batches that arrive while
    the model is busy into its next run (up to `max_queries` queries).

    Ray Serve's batcher closes a batch `batch_wait_timeout_s` after its first query whether or not
    the model is free. On a CPU, where one batch takes tens to hundreds of milliseconds, requests
    then arrive one by one, each batch holds about one query and the batches queue up: the model
    runs unbatched (measured on 2 cores, one replica, 32 clients: batches of 1 query and 37 q/s;
    merged, batches of 10 to 29 and 47 q/s). Merging what queued while the model ran gives each
    run as many queries as have arrived, at no cost in latency when the service is idle."""

    def __init__(self, run: Any, executor: ThreadPoolExecutor, max_queries: int) -> None:
        self.run = run
        self.executor = executor
        self.max_queries = max_queries
        self.waiting: list[tuple[list[Any], asyncio.Future]] = []
        self.draining = False
        self.drainer: asyncio.Task | None = None  # referenced: the event loop keeps tasks weakly

    async def submit(self, items: list[Any]) -> list[Any]:
        done = asyncio.get_running_loop().create_future()
        self.waiting.append((items, done))
        if not self.draining:
            self.draining = True
            self.drainer = asyncio.get_running_loop().create_task(self.drain())
        return await done

    async def drain(self) -> None:
        try:
            while self.waiting:
                taken, size = 0, 0
                while taken < len(self.waiting) and (
                    taken == 0 or size + len(self.waiting[taken][0]) <= self.max_queries
                ):
                    size += len(self.waiting[taken][0])
                    taken += 1
                batches, self.waiting = self.waiting[:taken], self.waiting[taken:]
                items = [item for group, _ in batches for item in group]
                try:
                    outcomes = await asyncio.get_running_loop().run_in_executor(self.executor, self.run, items)
                except Exception as err:  # handed to each waiting request
                    for _, done in batches:
                        if not done.done():
                            done.set_exception(err)
                    continue
                start = 0
                for group, done in batches:
                    if not done.done():  # a request that was cancelled (client gone) is dropped
                        done.set_result(outcomes[start : start + len(group)])
                    start += len(group)
        finally:
            self.draining = False


# ---------------------------------------------------------------------------------------------
# Pool file (read by costs.read_pool_file, on the driver) and operating points


def pool_for_router(agent_order: Sequence[str], pool: list[dict[str, Any]] | None) -> tuple[list[dict], str | None]:
    """(the agents in the router's pool order, with the pool file's details when given; the
    reason the pool file does not fit this router, or None)."""
    if pool is None:
        return [{"id": agent} for agent in agent_order], None
    by_id = {agent["id"]: agent for agent in pool}
    if set(by_id) != set(agent_order):
        return [], (
            f"the pool file lists agents {sorted(by_id)} but the router scores {list(agent_order)}; "
            "pass the pool file made for this router."
        )
    return [by_id[agent] for agent in agent_order], None


def operating_points_of(config: Any, default: str | None) -> list[dict[str, Any]] | None:
    """The router's operating points in name order, as /v1/pool lists them ({"name", "cost_weight",
    "latency_weight", "default"}: `default` marks the one requests without a point get); None for a
    router with one head."""
    points = getattr(config, "operating_points", None) or {}
    if not points:
        return None
    return [
        {
            "name": name,
            "cost_weight": settings["cost_weight"],
            "latency_weight": settings["latency_weight"],
            "default": name == default,
        }
        for name, settings in sorted(points.items())
    ]


def requested_point(config: Any, value: Any, default: str | None) -> str | None:
    """The operating point a /v1/route body asks for: `value` is its "operating_point" (None when
    absent or null: the service's `default`). RequestProblem (422) with config.check_operating_point's
    line naming the router's points when it is not one of them, or the router has one head."""
    if value is None:
        return default
    points = getattr(config, "operating_points", None) or {}
    if points and not isinstance(value, str):
        raise RequestProblem(
            422, f'"operating_point" is {type(value).__name__}, not a name; send one of {", ".join(sorted(points))}.'
        )
    try:
        return config.check_operating_point(value)
    except ValueError as err:
        raise RequestProblem(422, first_line(err)) from None


# ---------------------------------------------------------------------------------------------
# HTTP API


class RouteRequest(BaseModel):
    queries: list[str] = Field(
        min_length=1,
        description=f"Queries to route, at most {DEFAULT_MAX_QUERIES} per request by default "
        f"(and {DEFAULT_MAX_REQUEST_BYTES} bytes of body); each must hold text the router can read.",
        examples=[["What is the derivative of x^3 + 2x?"]],
    )
    operating_point: str | None = Field(
        None,
        description="For a router trained at several quality/cost/latency trade-offs: the operating point "
        "(head) that routes these queries, one of the names GET /v1/pool lists under operating_points. "
        "Absent or null: the service's default (marked there). A router with one head refuses it (422).",
        examples=["quality"],
    )


class RouteResult(BaseModel):
    picked_agent: str = Field(description="The agent that should answer (argmax of the logits).")
    agent_index: int = Field(description="Its position in the pool.")
    probabilities: dict[str, float] = Field(description="Softmax of the logits, by agent id, pool order.")
    logits: dict[str, float] = Field(description="The head's raw score of each agent, pool order.")
    operating_point: str | None = Field(
        None, description="Routers with operating points: the point whose head scored this query."
    )
    out_of_distribution: bool | None = Field(
        None, description="Routers with a guard: the query is unlike the training distribution."
    )
    ood_score: float | None = Field(None, description="Routers with a guard: the guard's score (higher: further out).")
    head_pick: str | None = Field(
        None, description="Flagged queries: the head's own choice (picked_agent is then the fallback agent)."
    )


class RouterInfo(BaseModel):
    name: str = Field(description="The router asked for ('default' for the bundled one).")
    revision: str | None = Field(description="Its revision: the one asked for, the Hub commit, or a weights digest.")


class RouteResponse(BaseModel):
    results: list[RouteResult] = Field(description="One result per query, in request order.")
    router: RouterInfo


class PoolAgent(BaseModel):
    id: str
    slug: str | None = Field(None, description="The model this agent resolves to (with a pool file).")
    price_per_1m_prompt_usd: float | None = Field(None, description="With a pool file.")
    price_per_1m_output_usd: float | None = Field(None, description="With a pool file.")


class OperatingPoint(BaseModel):
    name: str = Field(description="What a request sends as operating_point.")
    cost_weight: float = Field(description="Reward given up per USD per 1,000 queries saved, in training.")
    latency_weight: float = Field(description="Reward given up per second per query saved, in training.")
    default: bool = Field(description="The point requests without operating_point are routed at.")


class PoolResponse(BaseModel):
    agents: list[PoolAgent] = Field(description="The router's agents, in pool (logit) order.")
    operating_points: list[OperatingPoint] | None = Field(
        None, description="Routers trained at several trade-offs: their operating points, by name."
    )
    router: RouterInfo


class ErrorResponse(BaseModel):
    error: str = Field(description="One line naming the problem and the fix.")


class RequestProblem(Exception):
    """A request the service refuses: answered with `status` and {"error": message}."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


api = FastAPI(
    title="BenchGen router",
    version="1",
    description="Pick which agent of an LLM pool should answer each query.",
)
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": description}
    for status, description in (
        (400, "The body is not a JSON object."),
        (413, "More queries or bytes than the service's per-request limits."),
        (422, "No queries, a query that is not text or that the router cannot score, or an unknown operating point."),
    )
}


@api.exception_handler(RequestProblem)
async def _request_problem(request: Request, problem: RequestProblem) -> JSONResponse:
    return JSONResponse({"error": problem.message}, status_code=problem.status)


@api.exception_handler(StarletteHTTPException)
async def _http_problem(request: Request, err: StarletteHTTPException) -> JSONResponse:
    hints = {404: f"no such endpoint: {request.url.path}; see /docs", 405: f"{request.method} is not allowed here"}
    return JSONResponse({"error": hints.get(err.status_code, str(err.detail))}, status_code=err.status_code)


@api.exception_handler(RequestValidationError)
async def _invalid_request(request: Request, err: RequestValidationError) -> JSONResponse:
    errors = err.errors()
    where = ".".join(str(part) for part in errors[0].get("loc", ())) if errors else "request"
    message = errors[0].get("msg", "invalid") if errors else "invalid"
    return JSONResponse({"error": f"{where}: {message}"}, status_code=422)


@api.exception_handler(Exception)
async def _unexpected(request: Request, err: Exception) -> JSONResponse:
    logger.exception("request failed")
    return JSONResponse({"error": f"internal error ({type(err).__name__}: {first_line(err)})"}, status_code=500)


async def read_body(request: Request, max_request_bytes: int, timeout_s: float = BODY_TIMEOUT_S) -> bytes:
    """The request body, counted as it arrives: a body over the limit is refused at the chunk that
    crosses it (a chunked upload never sits in memory whole), and one that has not arrived within
    `timeout_s` is a 408 (a stalled client releases its slot)."""
    chunks: list[bytes] = []
    size = 0

    async def collect() -> None:
        nonlocal size
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_request_bytes:
                raise RequestProblem(
                    413, f"request body is over this service's limit of {max_request_bytes} bytes; split it."
                )
            chunks.append(chunk)

    try:
        await asyncio.wait_for(collect(), timeout_s)
    except TimeoutError:
        raise RequestProblem(408, f"request body not received within {timeout_s:g} s; send it whole.") from None
    return b"".join(chunks)


def parse_route_body(body: bytes, max_queries: int, max_request_bytes: int) -> tuple[list[str], Any]:
    """(the queries of a /v1/route body, its "operating_point" as sent or None: requested_point()
    checks it against the router), or RequestProblem naming what is wrong with the body."""
    if len(body) > max_request_bytes:
        raise RequestProblem(
            413, f"request body is {len(body)} bytes, over this service's limit of {max_request_bytes}; split it."
        )
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as err:  # JSONDecodeError, bad UTF-8, absurd nesting
        reason = "nested too deeply" if isinstance(err, RecursionError) else first_line(err)
        raise RequestProblem(400, f'body is not valid JSON ({reason}); send {{"queries": ["..."]}}.') from None
    if not isinstance(payload, dict):
        raise RequestProblem(400, f'body is a JSON {type(payload).__name__}, not an object; send {{"queries": [...]}}.')
    if "queries" not in payload:
        raise RequestProblem(422, 'body has no "queries" field; send {"queries": ["..."]}.')
    queries = payload["queries"]
    if isinstance(queries, str):
        raise RequestProblem(422, '"queries" is a string, not a list; send {"queries": ["..."]}.')
    if not isinstance(queries, list):
        raise RequestProblem(422, f'"queries" is {type(queries).__name__}, not a list of strings.')
    if not queries:
        raise RequestProblem(422, '"queries" is empty; send at least one query.')
    if len(queries) > max_queries:
        raise RequestProblem(
            413, f"{len(queries)} queries in one request, over this service's limit of {max_queries}; split it."
        )
    for position, query in enumerate(queries):
        problem = text_problem(query, f"query {position}")
        if problem:
            raise RequestProblem(422, f"{problem}; a router cannot score it.")
    return queries, payload.get("operating_point")


@ray_serve.deployment(name=DEPLOYMENT_NAME)
@ray_serve.ingress(api)
class RouterDeployment:
    """One replica: loads the router once; /v1/route requests are checked one by one, then their
    queries are batched across requests, each with the operating point its request asks for, and
    scored by one run_router call per batch."""

    def __init__(
        self,
        model: str | None,
        revision: str | None,
        backbone: str | None,
        pool: list[dict[str, Any]] | None,
        threads: int,
        max_batch_size: int,
        batch_wait_s: float,
        max_queries: int,
        max_request_bytes: int,
        operating_point: str | None = None,
    ) -> None:
        from ray.serve.metrics import Counter as ServeCounter

        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the tokenizer runs in two threads
        set_torch_threads(threads)
        self.max_queries = max_queries
        self.max_request_bytes = max_request_bytes
        # The model runs in one worker thread, so the event loop keeps accepting and checking
        # requests (and gathering the next batch) while a batch is scored.
        self.executor = ThreadPoolExecutor(
            1, thread_name_prefix="router", initializer=set_torch_threads, initargs=[threads]
        )
        self.startup_problem: str | None = None
        self.pool: list[dict[str, Any]] = []
        self.default_point: str | None = None
        self.points: list[dict[str, Any]] | None = None
        self.identity: dict[str, str | None] = {"name": "default" if model is None else str(model), "revision": None}
        try:
            self.router, self.tokenizer = load_router(model, revision=revision, backbone=backbone)
        except UsageError as err:
            # Reported to the driver (startup_problem()), which stops the service with this line.
            self.startup_problem = str(err)
            return
        # Its own tokenizer for request checks: a fast tokenizer used from two threads at once
        # can fail ("Already borrowed") when one of them changes its truncation settings.
        self.check_tokenizer = copy.deepcopy(self.tokenizer)
        self.identity = router_identity(self.router, model, revision)
        try:
            # Resolved once: requests without a point get this one (None for a router with one head).
            self.default_point = self.router.config.check_operating_point(operating_point)
        except ValueError as err:
            self.startup_problem = first_line(err)
            return
        self.points = operating_points_of(self.router.config, self.default_point)
        self.pool, self.startup_problem = pool_for_router(self.router.config.agent_order, pool)
        self.route_batch.set_max_batch_size(max_batch_size)
        self.route_batch.set_batch_wait_timeout_s(batch_wait_s)
        self.merger = BatchMerger(
            functools.partial(route_items, self.router, self.tokenizer), self.executor, max_batch_size
        )
        self.routed = ServeCounter(ROUTED_COUNTER, description="Queries routed, by picked agent.", tag_keys=("agent",))
        self.rejected = ServeCounter(REJECTED_COUNTER, description="Requests refused, by status.", tag_keys=("status",))

    def get_startup_problem(self) -> str | None:
        """Why this replica cannot serve (the router did not load, it has no such operating point,
        or the pool file does not fit)."""
        return self.startup_problem

    # Batches are handed to the merger as soon as Ray Serve closes them (many may be open at once),
    # which runs the model on them one merged batch at a time. An item is (query, operating point):
    # requests at different points share a batch, and so one run of the backbone.
    @ray_serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005, max_concurrent_batches=1024)
    async def route_batch(self, items: list[tuple[str, str | None]]) -> list[dict[str, Any] | str]:
        return await self.merger.submit(items)

    def refuse(self, status: int, message: str) -> RequestProblem:
        self.rejected.inc(1, tags={"status": str(status)})
        return RequestProblem(status, message)

    def check_ready(self) -> None:
        if self.startup_problem:
            raise RequestProblem(503, self.startup_problem)

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
        self.check_ready()
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_request_bytes:
            raise self.refuse(
                413,
                f"request body is {declared} bytes, over this service's limit of {self.max_request_bytes}; split it.",
            )
        try:
            body = await read_body(request, self.max_request_bytes)
            queries, asked = parse_route_body(body, self.max_queries, self.max_request_bytes)
            point = requested_point(self.router.config, asked, self.default_point)
        except RequestProblem as problem:
            raise self.refuse(problem.status, problem.message) from None
        for position, problem in enumerate(token_problems(self.check_tokenizer, self.router.config, queries)):
            if problem:
                raise self.refuse(422, f"query {position} {problem}; a router cannot score it.")
        outcomes = await asyncio.gather(*(self.route_batch((query, point)) for query in queries))
        for position, outcome in enumerate(outcomes):
            if isinstance(outcome, str):
                raise self.refuse(422, f"query {position} cannot be routed ({outcome}).")
        for agent, count in Counter(result["picked_agent"] for result in outcomes).items():
            self.routed.inc(count, tags={"agent": agent})
        return JSONResponse({"results": outcomes, "router": self.identity})

    @api.get(
        "/v1/pool",
        response_model=PoolResponse,
        response_model_exclude_none=True,
        summary="The router's agents in pool order, and its operating points",
    )
    async def pool_agents(self) -> dict[str, Any]:
        self.check_ready()
        return {"agents": self.pool, "operating_points": self.points, "router": self.identity}

    @api.api_route(
        "/healthz",
        methods=["GET", "HEAD"],
        summary="200 once the router is loaded",
        responses={503: {"model": ErrorResponse}},
    )
    async def healthz(self) -> dict[str, Any]:
        self.check_ready()
        return {"status": "ok", "router": self.identity}


# ---------------------------------------------------------------------------------------------
# Starting and stopping the service


@dataclass
class RunningService:
    """A started service (serve(..., blocking=False)); close() stops it, and the Ray it started."""

    url: str
    metrics_url: str | None
    owns_ray: bool  # a local Ray started for the service: stopped with it
    connected: bool  # this process connected to Ray for the service: disconnected at the end
    closed: bool = field(default=False, init=False)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            shutdown_service(self.owns_ray, self.connected)

    def __enter__(self) -> "RunningService":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def shutdown_service(owns_ray: bool, connected: bool) -> None:
    """Stop the service. On the local Ray started for it: Serve, then Ray itself (its raylet, GCS
    and workers exit). On a Ray someone else runs (a cluster, or this process's own): only this
    application, leaving other Serve applications alone; then disconnect if we connected."""
    if not ray.is_initialized():
        return
    try:
        if owns_ray:
            ray_serve.shutdown()
        else:
            ray_serve.delete(APP_NAME)
    except Exception as err:  # a dead cluster must not keep us from disconnecting
        logger.warning("stopping Ray Serve failed (%s); disconnecting anyway", first_line(err))
    if connected:
        ray.shutdown()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def check_port_free(host: str, port: int, what: str) -> None:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            raise UsageError(f"cannot listen on {host}:{port} for {what} ({err.strerror}); pass a free port.") from None


def check_cpus(what: str, wanted: int, declared: int | None = None) -> None:
    """Refuse, in one line, to start a local Ray for more CPUs than this machine has: each replica or
    actor loads its own router, so oversubscribing only multiplies the memory for no throughput."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    available = declared or cores
    if wanted > available:
        raise UsageError(
            f"{what} need {wanted} CPUs but this machine has {available}; pass fewer {what}, or --address of a "
            "Ray cluster that has the CPUs."
        )


RAY_CONNECT_TIMEOUT_S = 10.0


def check_reachable(address: str) -> None:
    """One line, in bounded time, for a HOST:PORT (or ray://HOST:PORT) nothing listens on: ray.init
    itself retries such an address for minutes. Other forms ("auto") are left to Ray."""
    import socket

    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=RAY_CONNECT_TIMEOUT_S).close()
    except OSError as err:
        raise UsageError(
            f"no Ray cluster answers at {address} ({err.strerror or type(err).__name__}); start one "
            "(`ray start --head`) or pass the address it printed."
        ) from None


def start_ray(address: str | None, num_cpus: int, metrics_port: int | None = None) -> tuple[bool, bool]:
    """Join `address`, or start a private local Ray (address "local": never someone else's) with
    `num_cpus` CPUs and no dashboard; nothing when this process is already connected.
    Returns (owns the Ray: started it here, connected here)."""
    if ray.is_initialized():
        return False, False
    if address:
        check_reachable(address)
        ray.init(address=address)
        return False, True
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, _metrics_export_port=metrics_port)
    return True, True


def check_router_point(model: str | None, revision: str | None, operating_point: str | None) -> None:
    """UsageError naming the router's operating points when it lacks `operating_point`, from its
    config.json alone: checked here, before Ray starts, since every replica or actor would only
    find out after loading the whole router. A config.json this machine cannot read (a folder only
    the cluster's nodes have) is left to the replicas and actors, which check the name again."""
    if operating_point is None:
        return
    if not isinstance(operating_point, str):
        raise UsageError(f"operating_point must be a name (a str) or None, got {type(operating_point).__name__}.")
    from benchgen_router.loading import declared_config
    from benchgen_router.model_code import RouterConfig, default_router_dir

    try:
        declared = declared_config(str(default_router_dir() if model is None else model), revision)
    except UsageError:
        return
    try:
        config = RouterConfig(
            operating_points=declared.get("operating_points"), operating_point=declared.get("operating_point")
        )
        config.check_operating_point(operating_point)
    except ValueError as err:
        raise UsageError(first_line(err)) from None


def check_positive(name: str, value: float, integer: bool = True) -> None:
    if (integer and (not isinstance(value, int) or value < 1)) or value < 0:
        kind = "a positive integer" if integer else "a number >= 0"
        raise UsageError(f"{name} must be {kind}, got {value!r}.")


def serve(
    model: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    replicas: int = 1,
    max_batch_size: int = 32,
    batch_wait_ms: float = 0.0,
    pool_file: str | os.PathLike | None = None,
    address: str | None = None,
    threads: int | None = None,
    max_queries: int = DEFAULT_MAX_QUERIES,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    blocking: bool = True,
    *,
    revision: str | None = None,
    backbone: str | None = None,
    ray_cpus: int | None = None,
    metrics_port: int | None = None,
    access_log: bool = False,
    operating_point: str | None = None,
) -> RunningService | None:
    """Serve the router over HTTP on host:port with Ray Serve; see the module docstring for the API.

    `model`: a router folder or Hub id (None: the bundled default router, no network needed).
    `replicas` replicas, each given `threads` CPUs (default 1) and as many torch threads.
    `max_batch_size` / `batch_wait_ms`: Ray Serve's dynamic batching (queries per run_router call;
    how long a batch waits for more once it has one: 0 by default, since the batches that close
    while the model runs are merged anyway, and a wait only delays requests to an idle service).
    `max_queries` / `max_request_bytes`: the per-request limits. `address`: join that Ray
    cluster; else this process's Ray if it has one, else a local Ray is started with `ray_cpus`
    CPUs (default: this machine's cores, at least replicas x threads) and Prometheus metrics on
    `metrics_port` (default: a free port, logged).
    `access_log`: Ray Serve's per-request log lines (off: they cost throughput).
    `operating_point`: for a router with several heads, the point requests without one are routed
    at (default: the router's own); checked against its config.json before Ray starts, and again
    by each replica.

    blocking=True serves until Ctrl-C or SIGTERM, then shuts down cleanly (the application; Serve
    and Ray too when they were started here) and returns None; blocking=False returns a
    RunningService to close(). Raises UsageError (one line) for bad settings, a busy port, a router
    that cannot be loaded, an operating point it does not have, or a pool file that does not fit it.
    """
    cpus = DEFAULT_REPLICA_CPUS if threads is None else threads
    for name, value in (
        ("replicas", replicas),
        ("max_batch_size", max_batch_size),
        ("threads", cpus),
        ("max_queries", max_queries),
        ("max_request_bytes", max_request_bytes),
    ):
        check_positive(name, value)
    check_positive("batch_wait_ms", batch_wait_ms, integer=False)
    check_router_point(model, revision, operating_point)
    if ray_cpus is not None:
        check_positive("ray_cpus", ray_cpus)
    pool = read_pool_file(pool_file) if pool_file is not None else None
    local = not address and not ray.is_initialized()
    if local:
        check_cpus("replicas", replicas * cpus, ray_cpus)
        check_port_free(host, port, "the service")
        metrics_port = metrics_port or free_port()
        check_port_free("127.0.0.1", metrics_port, "metrics")

    owns_ray = connected = False
    service: RunningService | None = None
    interrupted = threading.Event()
    previous_handler = None

    def stop() -> None:
        if service is not None:
            service.close()
        else:
            shutdown_service(owns_ray, connected)

    def on_sigterm(signum: int, frame: Any) -> None:
        if not interrupted.is_set():  # a second SIGTERM must not cut the shutdown short
            interrupted.set()
            raise KeyboardInterrupt

    try:
        owns_ray, connected = start_ray(
            address, ray_cpus or max(os.cpu_count() or 1, replicas * cpus), metrics_port if local else None
        )
        if blocking and threading.current_thread() is threading.main_thread():
            # After ray.init, which sets its own handler: SIGTERM (a service manager stopping
            # us) takes the same clean path as Ctrl-C.
            previous_handler = signal.signal(signal.SIGTERM, on_sigterm)
        ray_serve.start(http_options={"host": host, "port": port})
        application = RouterDeployment.options(
            num_replicas=replicas,
            ray_actor_options={"num_cpus": cpus},
            # Enough requests in flight per replica to fill the next batch while one is scored.
            max_ongoing_requests=max(2 * max_batch_size, 8),
            graceful_shutdown_wait_loop_s=0.5,
            graceful_shutdown_timeout_s=5,
            health_check_period_s=2,
            max_constructor_retry_count=3,
            logging_config={"enable_access_log": access_log},
        ).bind(
            model,
            revision,
            backbone,
            pool,
            cpus,
            max_batch_size,
            batch_wait_ms / 1000,
            max_queries,
            max_request_bytes,
            operating_point,
        )
        handle = ray_serve.run(application, name=APP_NAME, route_prefix="/")
        service = RunningService(
            url=f"http://{host}:{port}",
            metrics_url=f"http://127.0.0.1:{metrics_port}/metrics" if owns_ray else None,
            owns_ray=owns_ray,
            connected=connected,
        )
        problem = handle.get_startup_problem.remote().result()
        if problem:
            raise UsageError(problem)
        logger.info(
            "serving %s on %s (API at %s/docs%s); %d replica%s, %d CPU%s each",
            "the default router" if model is None else model,
            service.url,
            service.url,
            f", metrics at {service.metrics_url}" if service.metrics_url else "",
            replicas,
            "s" * (replicas != 1),
            cpus,
            "s" * (cpus != 1),
        )
        if not blocking:
            return service
        logger.info("press Ctrl-C to stop")
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        if not blocking:
            stop()
            raise
        logger.info("stopping (%s)", "SIGTERM" if interrupted.is_set() else "interrupted")
        return None
    except BaseException:
        if not blocking:
            stop()
        raise
    finally:
        if blocking:
            stop()
        if previous_handler is not None:
            signal.signal(signal.SIGTERM, previous_handler)


# ---------------------------------------------------------------------------------------------
# Bulk routing with Ray Data


@dataclass
class BulkResult:
    """What route_file_with_ray did: queries routed, lines skipped (line, reason), picks per agent."""

    routed: int
    skipped: list[tuple[int, str]]
    picks: Counter
    seconds: float


class BulkRouter:
    """A Ray Data actor: loads the router once, then routes batches of rows at one operating point.

    In: "text" (and "line", "id" passed through). Out: "result" (the result dict as JSON, empty
    when skipped) and "problem" (why the row was skipped, empty when routed)."""

    def __init__(
        self,
        model: str | None,
        revision: str | None,
        backbone: str | None,
        threads: int,
        text_name: str,
        operating_point: str | None = None,
    ) -> None:
        set_torch_threads(threads)
        self.router, self.tokenizer = load_router(model, revision=revision, backbone=backbone)
        self.text_name = text_name
        self.operating_point = operating_point_of(self.router, operating_point)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        texts = list(batch.pop("text"))
        problems = [text_problem(text, self.text_name) for text in texts]
        readable = [i for i, problem in enumerate(problems) if problem is None]
        for i, problem in zip(
            readable, token_problems(self.tokenizer, self.router.config, [texts[i] for i in readable]), strict=True
        ):
            if problem:
                problems[i] = f"{self.text_name} {problem}"
        routable = [i for i, problem in enumerate(problems) if problem is None]
        results = [""] * len(texts)
        outcomes = route_texts(
            self.router, self.tokenizer, [texts[i] for i in routable], [self.operating_point] * len(routable)
        )
        for i, outcome in zip(routable, outcomes, strict=True):
            if isinstance(outcome, str):
                problems[i] = outcome
            else:
                results[i] = json.dumps(outcome)
        batch["result"] = np.array(results, dtype=object)
        batch["problem"] = np.array([problem or "" for problem in problems], dtype=object)
        return batch


def bulk_format(path: str, fmt: str | None) -> str:
    if fmt:
        return fmt
    return "parquet" if Path(path).suffix.lower() == ".parquet" or Path(path).is_dir() else ""


def json_value(value: Any) -> Any:
    """An id as read from Arrow/numpy, as a plain JSON-able value."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


@contextlib.contextmanager
def ray_for_bulk(address: str | None, num_cpus: int, progress: bool) -> Iterator[Any]:
    """Ray Data's context for one run (rows kept in order, progress shown or not) on this process's
    Ray, a cluster's, or a local Ray started and stopped here."""
    _, connected = start_ray(address, num_cpus)
    from ray import data  # Ray Data needs pandas: imported only for bulk routing

    context = data.DataContext.get_current()
    previous_order = context.execution_options.preserve_order
    previous = {name: getattr(context, name) for name in ("enable_progress_bars", "print_on_execution_start")}
    context.execution_options.preserve_order = True
    for name in previous:
        setattr(context, name, progress)
    try:
        yield data
    finally:
        context.execution_options.preserve_order = previous_order
        for name, value in previous.items():
            setattr(context, name, value)
        if connected:
            ray.shutdown()


def route_file_with_ray(
    input: str | os.PathLike,
    output: str | os.PathLike,
    model: str | None = None,
    text_field: str | None = None,
    id_field: str | None = None,
    fmt: str | None = None,
    *,
    actors: int = 1,
    threads: int = 1,
    batch_size: int = 64,
    address: str | None = None,
    revision: str | None = None,
    backbone: str | None = None,
    progress: bool = False,
    operating_point: str | None = None,
) -> BulkResult:
    """Route every query of a file with Ray Data; write what `benchgen-router route --input FILE --output OUT`
    writes: one JSON line per routed query, {"line": n, "id": ... (when the input has one),
    **pick_agent's result}, in input order (Ray Data's preserve_order), each carrying its line.

    Input: JSON lines, CSV/TSV and plain text are read as the local engine reads them (the same
    line numbers, text field / id choice and bad-line reasons: its reader runs here, on the
    driver); Parquet (`.parquet`, a folder of them, or fmt="parquet") is read by
    ray.data.read_parquet, "line" being the row's number (1-based, in file order). The router runs
    in `actors` Ray actors of `threads` CPUs each, `batch_size` rows per call, each actor loading
    it once. Bad lines are logged ("FILE line N: reason; skipped") and skipped, and so are queries
    the router cannot read (only invisible characters). The output is written to a temporary
    file and renamed at the end. Joins `address` or this process's Ray, else starts a local one
    and stops it afterwards; `progress` shows Ray Data's progress. `operating_point`: for a router
    with several heads, the one that routes (default: the router's own), checked before Ray starts.
    """
    for name, value in (("actors", actors), ("threads", threads), ("batch_size", batch_size)):
        check_positive(name, value)
    if not address and not ray.is_initialized():
        check_cpus("actors", actors * threads)
    check_router_point(model, revision, operating_point)
    source = str(input)
    started = time.perf_counter()
    picks: Counter = Counter()
    skipped: list[tuple[int, str]] = []
    parquet = bulk_format(source, fmt) == "parquet"
    with atomic_output(output, inputs=[input]) as handle:  # refuses a bad output path before any work
        rows: list[dict[str, Any]] = []
        ids: dict[int, Any] = {}  # kept here: ids of mixed types do not fit one Arrow column
        if parquet:
            if not Path(source).exists():
                raise UsageError(f"input file not found: {source}")
        else:
            with open_input(source) as stream:
                lines = list(read_queries(stream, input_format(source, fmt), text_field, id_field, source))
            if not lines:
                raise UsageError(f"{source} holds no lines; nothing to route.")
            for item in lines:
                if isinstance(item, Query):
                    rows.append({"line": item.line, "text": item.text})
                    if item.id is not None:
                        ids[item.line] = item.id
                else:
                    skipped.append((item.line, item.reason))
        if parquet or rows:
            with ray_for_bulk(address, max(os.cpu_count() or 1, actors * threads), progress) as data:
                available = ray.cluster_resources().get("CPU", 0)
                if available < threads:
                    raise UsageError(
                        f"this Ray has {available:g} CPUs and each actor asks for {threads}; lower threads."
                    )
                if parquet:
                    dataset, text_name, id_name = parquet_dataset(data, source, text_field, id_field)
                else:
                    # A few blocks per actor, so that every actor has work and results stream back.
                    blocks = max(1, min(math.ceil(len(rows) / batch_size), 4 * actors))
                    dataset, text_name, id_name = data.from_items(rows, override_num_blocks=blocks), "the query", None
                routed = dataset.map_batches(
                    BulkRouter,
                    batch_size=batch_size,
                    batch_format="numpy",
                    # Parquet is read by Ray tasks that need CPUs too: a pool that starts with
                    # one actor and grows leaves them room (a fixed pool holding every CPU
                    # would wait forever for rows the reads cannot produce).
                    concurrency=(1, actors) if parquet else actors,
                    num_cpus=threads,
                    fn_constructor_kwargs={
                        "model": model,
                        "revision": revision,
                        "backbone": backbone,
                        "threads": threads,
                        "text_name": text_name,
                        "operating_point": operating_point,
                    },
                )
                for line, row_id, result, problem in routed_rows(routed, id_name):
                    if problem:
                        skipped.append((line, problem))
                        continue
                    identifier = json_value(row_id) if parquet else ids.get(line)
                    record = {
                        "line": line,
                        **({"id": identifier} if identifier is not None else {}),
                        **json.loads(result),
                    }
                    picks[record["picked_agent"]] += 1
                    handle.write(json.dumps(record, default=str) + "\n")
    skipped.sort()
    for line, reason in skipped:
        logger.warning("%s line %d: %s; skipped", source, line, reason)
    return BulkResult(routed=sum(picks.values()), skipped=skipped, picks=picks, seconds=time.perf_counter() - started)


def routed_rows(routed: Any, id_name: str | None) -> Iterator[tuple[int, Any, str, str]]:
    """(line, id, result JSON, problem) per row, in input order. Rows without a "line" column
    (Parquet) are numbered here, from 1, as they stream back in order."""
    numbered = 0
    for batch in routed.iter_batches(batch_format="numpy", batch_size=None):
        count = len(batch["result"])
        lines = batch["line"].tolist() if "line" in batch else range(numbered + 1, numbered + 1 + count)
        numbered += count
        row_ids = batch[id_name].tolist() if id_name else [None] * count
        yield from zip(lines, row_ids, batch["result"], batch["problem"], strict=True)


def parquet_dataset(
    data: Any, source: str, text_field: str | None, id_field: str | None
) -> tuple[Any, str, str | None]:
    """(dataset with the query as "text" and the id column, how reasons name the query, the id column)."""
    try:
        dataset = data.read_parquet(source)
        names = list(dataset.schema().names)
    except (OSError, ValueError) as err:
        raise UsageError(f"cannot read Parquet input {source} ({first_line(err)}).") from None
    text_column = choose_text_field(names, text_field, source)
    id_column = choose_id_field(names, id_field, source)
    if id_column == text_column:
        id_column = None
    dataset = dataset.select_columns([text_column] + ([id_column] if id_column else []))
    return dataset.rename_columns({text_column: "text"}), f"'{text_column}'", id_column


__all__ = [
    "DEFAULT_MAX_QUERIES",
    "DEFAULT_MAX_REQUEST_BYTES",
    "BulkResult",
    "RouterDeployment",
    "RunningService",
    "api",
    "read_pool_file",
    "route_file_with_ray",
    "serve",
    "token_problems",
]
