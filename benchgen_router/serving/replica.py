"""The replicas that hold the router: each loads it once and scores the queries of every request
the ingress hands over, merged into as few model runs as possible.

Each result is exactly what `pick_agent` returns for the query. Picks never depend on batching;
the scores agree to float32 rounding (about 1e-5: a query's sums are accumulated in an order that
depends on its batch). A request at an operating point gets that point's head; requests at
different points share a batch, and so one run of the backbone (routing.results_for applies only
the small heads per point).
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

from benchgen_router.errors import InputError, first_line
from benchgen_router.loading import load_router
from benchgen_router.routing import EMPTY_QUERY, route_results

REPLICA_NAME = "Router"
# One torch thread per CPU a replica is given. More threads than free cores is much slower: on a
# busy 2-core machine one query took 992 ms in-process with torch's default of 2 threads against
# 27 ms with 1 (bench/service.py; the threads spin waiting for cores other processes hold).
DEFAULT_REPLICA_CPUS = 1


def route_items(router: Any, tokenizer: Any, items: Sequence[tuple[str, str | None]]) -> list[dict[str, Any] | None]:
    """route_results() of (text, operating point) pairs: the replicas' merged batches, whose requests
    may each ask for a different point (checked beforehand). None: the text tokenizes to nothing."""
    return route_results(router, tokenizer, [text for text, _ in items], operating_points=[point for _, point in items])


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
    """Runs the model on the queries of every request waiting, merged into runs of at most
    `max_queries` queries, one run at a time in `executor`.

    On a CPU one run takes tens to hundreds of milliseconds, and requests arrive one by one while
    it runs. Taking everything that queued meanwhile gives each run as many queries as have
    arrived, at no cost in latency when the service is idle (measured on 2 cores, one replica,
    32 clients: runs of 1 query and 37 q/s when each request ran alone; merged, runs of 10 to 29
    and 47 q/s). `wait_s`: how long an idle merger waits for more before its first run."""

    def __init__(self, run: Any, executor: ThreadPoolExecutor, max_queries: int, wait_s: float = 0.0) -> None:
        self.run = run
        self.executor = executor
        self.max_queries = max_queries
        self.wait_s = wait_s
        self.waiting: list[tuple[list[Any], asyncio.Future]] = []
        self.drainer: asyncio.Task | None = None  # referenced: the event loop keeps tasks weakly

    async def submit(self, items: list[Any]) -> list[Any]:
        """The run's outcome for each item, in order. A request larger than a run is split."""
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


def point_problem(config: Any, value: Any) -> str | None:
    """Why a request's "operating_point" (not None) is not one of the router's, in one line."""
    points = getattr(config, "operating_points", None) or {}
    if points and not isinstance(value, str):
        return f'"operating_point" is {type(value).__name__}, not a name; send one of {", ".join(sorted(points))}.'
    try:
        config.check_operating_point(value)
    except ValueError as err:
        return first_line(err)
    return None


@ray_serve.deployment(name=REPLICA_NAME)
class RouterReplica:
    """One replica: loads the router once; each `route` call (one request's queries) is merged
    with the others waiting into one model run."""

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
        self.identity: dict[str, str | None] = {"name": "default" if model is None else str(model), "revision": None}
        try:
            self.router, self.tokenizer = load_router(model, revision=revision, backbone=backbone)
        except InputError as err:
            # Reported to the driver (describe()), which stops the service with this line.
            self.problem = str(err)
            return
        self.identity = router_identity(self.router, model, revision)
        try:
            # Resolved once: requests without a point get this one (None for a router with one head).
            self.default_point = self.router.config.check_operating_point(operating_point)
        except ValueError as err:
            self.problem = first_line(err)
            return
        self.points = operating_points_of(self.router.config, self.default_point)
        self.pool, self.problem = pool_for_router(self.router.config.agent_order, pool)
        self.merger = BatchMerger(
            functools.partial(route_items, self.router, self.tokenizer), self.executor, max_batch_size, batch_wait_s
        )

    async def describe(self) -> dict[str, Any]:
        """What the ingress needs to answer without asking again: why this replica cannot serve
        (or None), the router's identity, its pool and operating points."""
        return {"problem": self.problem, "identity": self.identity, "pool": self.pool, "points": self.points}

    async def route(self, queries: list[str], asked_point: Any) -> dict[str, Any]:
        """{"results": pick_agent's result per query}, or {"status", "error"} for a request the
        router cannot route (plain data: it crosses processes)."""
        point = self.default_point
        if asked_point is not None:
            problem = point_problem(self.router.config, asked_point)
            if problem:
                return {"status": 422, "error": problem}
            point = asked_point
        outcomes = await self.merger.submit([(query, point) for query in queries])
        empty = [str(position) for position, outcome in enumerate(outcomes) if outcome is None]
        if empty:
            return {"status": 422, "error": f"query {', '.join(empty)} {EMPTY_QUERY}; a router cannot score it."}
        return {"results": outcomes}
