"""The router behind an integration: loaded once per process, scored off the caller's event loop, and the
queries of concurrent requests merged into shared forward passes.

A gateway (LiteLLM's Router or Proxy) calls a plugin once per request on its event loop. A forward pass on
that loop would stall every other request it serves, so the engine scores on one worker thread of its own,
and the service's batch merger (serving.replica.BatchMerger) gathers the queries that arrive while a pass
runs into the next pass: an idle gateway's request is scored alone at once, a busy one's share passes.

    engine = engine_for("path/to/router")                # one per router and settings, per process
    result = await engine.route("What is 2 + 2?", tradeoff="budget=0.3")   # pick_agent's result
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from benchgen_router.errors import InputError, first_line
from benchgen_router.routing import EMPTY_QUERY, Router, get_router
from benchgen_router.serving.replica import DEFAULT_MAX_BATCH_SIZE, BatchMerger, route_items

logger = logging.getLogger("benchgen_router.integrations")

# A router that failed to load is tried again after this long: a Hub outage or a folder being copied
# passes, and meanwhile every request gets the same one-line reason without a load attempt each.
RELOAD_AFTER_S = 60.0


class RoutingFailed(Exception):
    """Why one request was not routed, in one line that never holds the request's text."""


@dataclass(frozen=True)
class RouterSource:
    """Which router an engine loads: a folder or Hub id (None: the default router) and its loading options."""

    model: str | None = None
    device: str | None = None
    dtype: str | None = None
    revision: str | None = None
    backbone: str | None = None


@dataclass(frozen=True)
class Query:
    text: str
    operating_point: str | None = None
    tradeoff: str | None = None


class RouterEngine:
    """One router's forward passes, run one at a time on the engine's worker thread; `route` is safe from any
    event loop and any thread. `passes` and `queries` count what was scored (merged passes: fewer passes
    than queries)."""

    def __init__(self, source: RouterSource, max_batch: int = DEFAULT_MAX_BATCH_SIZE) -> None:
        self.source = source
        self.max_batch = max_batch
        self.passes = 0
        self.queries = 0
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        # One merger per event loop: a merger's futures and its draining task belong to the loop that made
        # them (an SDK caller may run several loops, one after another or in threads).
        self._mergers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, BatchMerger] = weakref.WeakKeyDictionary()
        self._load_problem: tuple[str, float] | None = None

    async def route(self, text: str, operating_point: str | None = None, tradeoff: str | None = None) -> dict:
        """pick_agent's result for `text` at that point or trade-off (None: the router's default), or
        RoutingFailed saying why not (the router did not load, a setting it refuses, an empty query)."""
        [outcome] = await self._merger().submit([Query(text, operating_point, tradeoff)])
        if isinstance(outcome, RoutingFailed):
            raise outcome
        return outcome

    def _merger(self) -> BatchMerger:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="benchgen-router")
            merger = self._mergers.get(loop)
            if merger is None:
                merger = self._mergers[loop] = BatchMerger(self._score, self._executor, self.max_batch)
            return merger

    def loaded(self) -> tuple[Any, Any]:
        """(model, tokenizer), loaded on first use (pick_agent's cache: once per process, under its lock), or
        RoutingFailed while a failed load is recent."""
        with self._lock:
            problem = self._load_problem
        if problem is not None and time.monotonic() - problem[1] < RELOAD_AFTER_S:
            raise RoutingFailed(problem[0])
        source = self.source
        try:
            options = {"device": source.device, "dtype": source.dtype, "backbone": source.backbone}
            pair = get_router(source.model, revision=source.revision, **options)
        except InputError as err:
            reason = f"the router did not load: {err}"
        except Exception as err:  # a bug or a broken install: one line here, the traceback for --verbose readers
            logger.debug("loading the router failed", exc_info=True)
            reason = f"the router did not load ({type(err).__name__}: {first_line(err)})"
        else:
            with self._lock:
                self._load_problem = None
            return pair
        with self._lock:
            self._load_problem = (reason, time.monotonic())
        raise RoutingFailed(reason)

    def _score(self, queries: list[Query]) -> list[dict | RoutingFailed]:
        """The worker thread's pass over merged queries: each distinct point and trade-off checked once, so
        that one request's bad setting fails that request alone; the rest scored together."""
        model, tokenizer = self.loaded()
        router = Router(model, tokenizer)
        settings: dict[tuple[str | None, str | None], str | RoutingFailed | None] = {}
        for point, rule in dict.fromkeys((query.operating_point, query.tradeoff) for query in queries):
            try:
                settings[point, rule] = router.check_point(point)
                router.check_tradeoff(rule)
            except InputError as err:
                settings[point, rule] = RoutingFailed(f"the router refused: {err}")
        outcomes: list[dict | RoutingFailed | None] = []
        slots, items = [], []
        for position, query in enumerate(queries):
            setting = settings[query.operating_point, query.tradeoff]
            outcomes.append(setting if isinstance(setting, RoutingFailed) else None)
            if not isinstance(setting, RoutingFailed):
                slots.append(position)
                items.append((query.text, setting, query.tradeoff))
        for position, result in zip(slots, route_items(model, tokenizer, items) if items else [], strict=True):
            outcomes[position] = RoutingFailed(f"no text to route on: it {EMPTY_QUERY}") if result is None else result
        with self._lock:
            self.passes += 1
            self.queries += len(queries)
        return outcomes  # type: ignore[return-value]  # every slot is filled


_ENGINES: dict[RouterSource, RouterEngine] = {}
_ENGINES_LOCK = threading.Lock()


def engine_for(source: RouterSource) -> RouterEngine:
    """The process's engine for `source`: plugins over the same router share its worker thread and batches."""
    with _ENGINES_LOCK:
        engine = _ENGINES.get(source)
        if engine is None:
            engine = _ENGINES[source] = RouterEngine(source)
        return engine
