"""The replicas that hold the router: each loads it once and merges the queries of every request
waiting into as few model runs as possible (results as pick_agent's: docs/service.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ray import serve as ray_serve

from benchgen_router.errors import InputError, RouterError, RouterTypeError
from benchgen_router.loading import load_router
from benchgen_router.routing import EMPTY_QUERY, operating_point_of, route_results
from benchgen_router.serving.logs import quiet_repeated_warnings

REPLICA_NAME = "Router"
# One torch thread per CPU a replica is given: threads beyond the free cores spin waiting for cores
# other processes hold (docs/service.md has the measurement).
DEFAULT_REPLICA_CPUS = 1


def route_items(router: Any, tokenizer: Any, items: Sequence[tuple[str, str | None]]) -> list[dict[str, Any] | None]:
    """route_results() of (text, operating point) pairs, the points checked beforehand; None: the text
    tokenizes to nothing. A merged batch mixes requests at different points: one backbone run."""
    return route_results(router, tokenizer, [text for text, _ in items], operating_points=[point for _, point in items])


def router_identity(router: Any, model: str | None, revision: str | None) -> dict[str, str | None]:
    """{"name", "revision"}, so that clients can tell which router answered: the revision asked for,
    else the Hub commit, else a digest of the head and pool ("sha256:...")."""
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
    """Runs the model, one run at a time in `executor`, on everything that queued while the last run
    took (up to `max_queries` queries): bigger runs at no cost in latency to an idle service."""

    def __init__(self, run: Any, executor: ThreadPoolExecutor, max_queries: int, wait_s: float = 0.0) -> None:
        self.run = run
        self.executor = executor
        self.max_queries = max_queries
        self.wait_s = wait_s
        self.waiting: list[tuple[list[Any], asyncio.Future]] = []
        self.drainer: asyncio.Task | None = None  # referenced: the event loop keeps tasks weakly

    async def submit(self, items: list[Any]) -> list[Any]:
        # A request larger than a run is split; the outcomes come back in order.
        loop = asyncio.get_running_loop()
        parts = []
        for start in range(0, len(items), self.max_queries):
            done = loop.create_future()
            self.waiting.append((items[start : start + self.max_queries], done))
            parts.append(done)
        if self.drainer is None or self.drainer.done():
            self.drainer = loop.create_task(self.drain())
        return [outcome for part in await asyncio.gather(*parts) for outcome in part]

    async def drain(self) -> None:
        loop = asyncio.get_running_loop()
        if self.wait_s:
            await asyncio.sleep(self.wait_s)
        while self.waiting:
            taken, size = 0, 0
            while taken < len(self.waiting) and size + len(self.waiting[taken][0]) <= self.max_queries:
                size += len(self.waiting[taken][0])
                taken += 1
            batches, self.waiting = self.waiting[:taken], self.waiting[taken:]
            items = [item for group, _ in batches for item in group]
            try:
                outcomes = await loop.run_in_executor(self.executor, self.run, items)
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


def pool_for_router(agent_order: Sequence[str], pool: list[dict[str, Any]] | None) -> tuple[list[dict], str | None]:
    """(the agents in pool order, with the pool file's details; why the pool file does not fit, or None)."""
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
    """The operating points as /v1/pool lists them, in name order; None for a router with one head."""
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


def request_point(router: Any, value: Any) -> str | None:
    """The operating point a request names (not None), or the error naming the router's points."""
    points = getattr(router.config, "operating_points", None) or {}
    if points and not isinstance(value, str):
        raise RouterTypeError(
            f'"operating_point" is {type(value).__name__}, not a name; send one of {", ".join(sorted(points))}.'
        )
    return operating_point_of(router, value)


def check_scorable(outcomes: Sequence[dict[str, Any] | None]) -> None:
    empty = [str(position) for position, outcome in enumerate(outcomes) if outcome is None]
    if empty:
        raise InputError(f"query {', '.join(empty)} {EMPTY_QUERY}; a router cannot score it.")


@ray_serve.deployment(name=REPLICA_NAME)
class RouterReplica:
    """One replica: loads the router once, and merges each request's queries with the others waiting."""

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
    ) -> None:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the tokenizer runs in two threads
        quiet_repeated_warnings()  # a replica at capacity says so for each request it hands back
        set_torch_threads(threads)
        # The model runs in one worker thread, so the event loop keeps taking requests (and
        # gathering the next batch) while a batch is scored.
        self.executor = ThreadPoolExecutor(
            1, thread_name_prefix="router", initializer=set_torch_threads, initargs=[threads]
        )
        self.problem: str | None = None
        self.pool: list[dict[str, Any]] = []
        self.default_point: str | None = None
        self.points: list[dict[str, Any]] | None = None
        self.fallbacks: dict[str | None, str | None] = {}  # point (None: single head) -> its fallback agent
        self.identity: dict[str, str | None] = {"name": "default" if model is None else str(model), "revision": None}
        try:
            self.router, self.tokenizer = load_router(model, revision=revision, backbone=backbone)
            self.identity = router_identity(self.router, model, revision)
            # Resolved once: requests without a point get this one (None for a router with one head).
            self.default_point = operating_point_of(self.router, operating_point)
        except InputError as err:
            # Reported to the driver (describe()), which stops the service with this line.
            self.problem = str(err)
            return
        self.points = operating_points_of(self.router.config, self.default_point)
        config = self.router.config
        self.fallbacks = {point: config.fallback_agent(point) for point in config.operating_points or [None]}
        self.pool, self.problem = pool_for_router(self.router.config.agent_order, pool)
        self.merger = BatchMerger(
            functools.partial(route_items, self.router, self.tokenizer), self.executor, max_batch_size, batch_wait_s
        )

    async def describe(self) -> dict[str, Any]:
        # All the ingress needs to answer /healthz, /v1/pool and the gateway without asking again.
        return {
            "problem": self.problem,
            "identity": self.identity,
            "pool": self.pool,
            "points": self.points,
            "fallbacks": self.fallbacks,
        }

    async def route(self, queries: list[str], asked_point: Any) -> dict[str, Any]:
        # A refusal is returned, not raised: raised, Ray Serve would log a traceback and count a failed
        # request for each bad request. The ingress raises it again, for its error handler.
        try:
            return {"results": await self.scored(queries, asked_point)}
        except RouterError as refusal:
            return {"refused": refusal}

    async def scored(self, queries: list[str], asked_point: Any) -> list[dict[str, Any]]:
        point = self.default_point if asked_point is None else request_point(self.router, asked_point)
        outcomes = await self.merger.submit([(query, point) for query in queries])
        check_scorable(outcomes)
        return outcomes
