"""What a replica of the service holds: the router, loaded once, and the merger that scores the
queries of every request waiting in as few model runs as possible (results as pick_agent's:
docs/service.md). The deployment itself, which reads the requests, is serving/app.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from benchgen_router.errors import InputError, RouterTypeError, first_line
from benchgen_router.loading import load_router
from benchgen_router.routing import EMPTY_QUERY, Router, operating_point_of, tradeoff_of

logger = logging.getLogger("benchgen_router.serving")

# One torch thread per CPU a replica is given: threads beyond the free cores spin waiting for cores
# other processes hold (docs/service.md has the measurement).
DEFAULT_REPLICA_CPUS = 1
# Queries per model run at most. On one thread the default router costs 6.7-7.1 ms of CPU per query
# in runs of 32, 6.3-6.8 ms in runs of 64 and 6.0 ms in runs of 256 (docs/routing.md): under load,
# bigger runs route more queries per core; an idle service's runs are as small as what queued.
DEFAULT_MAX_BATCH_SIZE = 64


def route_items(
    router: Any, tokenizer: Any, items: Sequence[tuple[str, str | None] | tuple[str, str | None, str | None]]
) -> list[dict[str, Any] | None]:
    """Router.route() of (text, operating point[, trade-off]) items whose points and trade-offs the
    request's edge has checked (request_point, request_tradeoff), so they are not checked again (a
    pair: the router's default decision); None: the text tokenizes to nothing. A merged batch mixes
    requests at different points and trade-offs: one tokenization, one backbone run per planned batch."""
    return Router(router, tokenizer).route(
        [item[0] for item in items],
        [item[1] for item in items],
        [item[2] if len(item) > 2 else None for item in items],
        checked=True,
    )


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
        self.queued = 0  # items waiting for a run (not those being scored)
        self.drainer: asyncio.Task | None = None  # referenced: the event loop keeps tasks weakly

    async def submit(self, items: list[Any]) -> list[Any]:
        # A request larger than a run is split; the outcomes come back in order.
        loop = asyncio.get_running_loop()
        parts = []
        for start in range(0, len(items), self.max_queries):
            done = loop.create_future()
            self.waiting.append((items[start : start + self.max_queries], done))
            parts.append(done)
        self.queued += len(items)
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
            self.queued -= len(items)
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


def request_tradeoff(router: Any, value: Any) -> str | None:
    """The trade-off rule a request names (None: the router's default decision), or InputError: not a
    string, a spelling no rule has, or a router without a probability head."""
    if value is not None and not isinstance(value, str):
        raise InputError(f'"tradeoff" is {type(value).__name__}, not a rule; send e.g. "budget=0.3".')
    return tradeoff_of(router, value)


def check_scorable(outcomes: Sequence[dict[str, Any] | None]) -> None:
    empty = [str(position) for position, outcome in enumerate(outcomes) if outcome is None]
    if empty:
        raise InputError(f"query {', '.join(empty)} {EMPTY_QUERY}; a router cannot score it.")


@dataclass
class ServedRouter:
    """A replica's router once loaded, and what its routes answer with; `problem`: why it cannot serve."""

    identity: dict[str, str | None]
    problem: str | None = None
    router: Any = None
    tokenizer: Any = None
    default_point: str | None = None  # requests without a point get this one (None: a router with one head)
    pool: list[dict[str, Any]] = field(default_factory=list)
    points: list[dict[str, Any]] | None = None
    point_names: list[str] = field(default_factory=list)
    fallbacks: dict[str | None, str | None] = field(default_factory=dict)  # point -> its fallback agent


def load_served_router(
    model: str | None,
    revision: str | None,
    backbone: str | None,
    pool: list[dict[str, Any]] | None,
    operating_point: str | None,
) -> ServedRouter:
    """Load the router on the replica's worker thread; a router that cannot serve (it does not load, the
    pool file or the operating point does not fit it) is a ServedRouter with its problem in one line."""
    identity: dict[str, str | None] = {"name": "default" if model is None else str(model), "revision": None}
    try:
        router, tokenizer = load_router(model, revision=revision, backbone=backbone)
        default_point = operating_point_of(router, operating_point)
    except InputError as err:
        return ServedRouter(identity, problem=str(err))
    except Exception as err:  # a bug or a broken install: logged whole, served as one line
        logger.exception("loading the router failed")
        return ServedRouter(identity, problem=f"loading the router failed ({type(err).__name__}: {first_line(err)})")
    config = router.config
    points = operating_points_of(config, default_point)
    served_pool, problem = pool_for_router(config.agent_order, pool)
    return ServedRouter(
        identity=router_identity(router, model, revision),
        problem=problem,
        router=router,
        tokenizer=tokenizer,
        default_point=default_point,
        pool=served_pool,
        points=points,
        point_names=[point["name"] for point in points or ()],
        fallbacks={point: config.fallback_agent(point) for point in config.operating_points or [None]},
    )
