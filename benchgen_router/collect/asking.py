"""The asking phase of a run: every pending cell launched under the concurrency limit and the cost cap,
each answer graded and journaled as it ends (an answer to a judged task, then the judge's verdict on it),
and SIGTERM turned into an orderly stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from benchgen_router.collect.chat import Answer, RetryPolicy
from benchgen_router.collect.formats import JUDGE_GRADER, Task
from benchgen_router.collect.grading import Graders
from benchgen_router.collect.journal import Journal
from benchgen_router.collect.judge import Judge, JudgeAsker, judge_answer
from benchgen_router.collect.outputs import call_record, needs_judge
from benchgen_router.errors import Terminated, raise_terminated
from benchgen_router.upstreams import Upstream, UpstreamPool

if TYPE_CHECKING:
    from benchgen_router.collect.run import CollectConfig

logger = logging.getLogger("benchgen_router.collect")

# How one cell is answered: the agent's upstream and the prompt in, its answer out (the default asks
# the upstream over HTTP; a caller may pass its own, e.g. to replay recorded answers).
Asker = Callable[[Upstream, str], Awaitable[Answer]]
STOPPED_AT_COST_CAP = "cost cap"
JUDGE_KEY = "\0judge"  # the judge's place among the agents in the cost cap's reckoning (no agent id is empty)


class Spend:
    """The running spend of the journal's calls, and what an answered call costs on average, per agent
    (agents' costs differ by orders of magnitude, so one pool-wide mean would misjudge them)."""

    def __init__(self, calls: Sequence[Mapping[str, Any]], verdicts: Sequence[Mapping[str, Any]] = ()) -> None:
        self.total = 0.0
        self.answered = 0  # calls that did not fail
        self.largest: dict[str, float] = {}  # per agent, the largest known cost of its answered calls
        self.heard_from: set[str] = set()  # agents with a finished call
        for call in calls:
            self.add(call)
        for verdict in verdicts:
            self.add_verdict(verdict)

    def add(self, call: Mapping[str, Any], key: str | None = None) -> None:
        """A finished call of `key` (default: its agent)."""
        key = call["agent"] if key is None else key
        cost = call["cost_usd"]
        self.total += cost or 0.0
        self.heard_from.add(key)
        if call["error"] is None:
            self.answered += 1
            if cost is not None:
                self.largest[key] = max(cost, self.largest.get(key, 0.0))

    def add_verdict(self, verdict: Mapping[str, Any]) -> None:
        """A judge's verdict: its calls' cost counts under the judge's own key (a judge that is an agent
        of the pool costs per verdict what its prompts cost, not what its answers cost)."""
        self.add({"cost_usd": verdict["cost_usd"], "error": None}, key=JUDGE_KEY)

    def reserve(self, agent: str) -> float | None:
        """What a call to `agent` is reserved under the cap: the largest cost of its calls so far (a mean
        would let every call in flight that costs more than it pass the cap together), else the largest
        of any agent's; None when no cost is known."""
        if agent in self.largest:
            return self.largest[agent]
        return max(self.largest.values()) if self.largest else None


class Asking:
    """The asking phase: launches cells under the semaphore and the cost cap, journals each as it ends
    (an answer to a judged task, then the judge's verdict on it)."""

    def __init__(
        self,
        config: CollectConfig,
        pool: UpstreamPool,
        journal: Journal,
        spend: Spend,
        bar: Any,
        graders: Graders,
        judge: Judge | None = None,
    ) -> None:
        self.config, self.pool, self.journal, self.spend, self.bar = config, pool, journal, spend, bar
        self.graders, self.judge = graders, judge
        self.made = self.failed = self.judged = self.rated = 0
        self.cost_usd = self.judge_cost_usd = 0.0
        self.stopped: str | None = None
        self._unknown_cost_noted = False

    async def one(self, ask: Asker, judge_ask: JudgeAsker | None, task: Task, agent: str, repetition: int) -> None:
        """A cell: the agent asked unless the journal has its answer, then the judge when the task is
        judged and the journal has no verdict on that answer."""
        cell = (task.task_id, agent, repetition)
        if cell not in self.journal.entries:
            await self.answer(ask, task, agent, repetition)
        else:
            self.bar.update()  # the answer was journaled before: this cell only waits for its verdict
        call = self.journal.entries[cell].call
        if needs_judge(task, call) and cell not in self.journal.verdicts:
            if self.judge is None or judge_ask is None:
                raise RuntimeError("a judged task without a judge (read_tasks refuses it)")
            verdict = await judge_answer(judge_ask, self.judge, task.prompt, call["raw_response"], task.answer or None)
            self.journal.append_verdict(cell, verdict)
            self.spend.add_verdict(verdict)
            self.judged += 1
            self.rated += verdict["rating"] is not None
            self.judge_cost_usd += verdict["cost_usd"] or 0.0
            self.cost_usd += verdict["cost_usd"] or 0.0
            if verdict["rating"] is None:
                logger.debug("%s on %s (repetition %d) left ungraded: %s", agent, task.task_id, repetition,
                             verdict["error"])  # fmt: skip
            self.bar.set_postfix_str(f"{self.spend.total:.4f} USD", refresh=False)

    async def answer(self, ask: Asker, task: Task, agent: str, repetition: int) -> None:
        upstream = self.pool.upstreams[agent]
        answer = await ask(upstream, task.prompt)
        record = (upstream, repetition, answer, task, self.graders)
        try:  # graded beside the loop, which goes on serving the other calls (collect/grading.py)
            call = await asyncio.to_thread(call_record, *record)
        except asyncio.CancelledError:  # the run stops: an answered call is journaled all the same
            self.record(task, agent, repetition, call_record(*record))
            raise
        if self.graders.timed_out(task.grader, call["raw_response"], task.answer):
            logger.debug("%s on %s (repetition %d): its grade ran past %g s; graded wrong", agent, task.task_id,
                         repetition, self.graders.time_limit_s)  # fmt: skip
        self.record(task, agent, repetition, call)

    def record(self, task: Task, agent: str, repetition: int, call: dict[str, Any]) -> None:
        self.journal.append(task, call)
        self.spend.add(call)
        self.made += 1
        self.failed += call["error"] is not None
        self.cost_usd += call["cost_usd"] or 0.0
        if call["error"] is not None:
            logger.debug("%s on %s (repetition %d) failed: %s", agent, task.task_id, repetition, call["error"])
        self.bar.set_postfix_str(f"{self.spend.total:.4f} USD", refresh=False)
        self.bar.update()

    def keys(self, task: Task, agent: str, repetition: int) -> list[str]:
        """Who a pending cell may still pay: its agent, unless journaled, and the judge, for a judged task."""
        keys = [] if (task.task_id, agent, repetition) in self.journal.entries else [agent]
        return [*keys, JUDGE_KEY] if task.grader == JUDGE_GRADER else keys

    def over_cap(self, keys: Sequence[str], in_flight: Sequence[str]) -> bool:
        """Whether launching a cell that may pay `keys` could pass the cap: the spend so far plus, for
        that cell and each one in flight, a reservation per agent or judge call (the largest cost so far
        of that agent, or of the judge)."""
        cap = self.config.max_cost_usd
        if cap is None:
            return False
        expected = [self.spend.reserve(name) for name in [*in_flight, *keys]]
        if self.spend.answered and not self.spend.largest and not self._unknown_cost_noted:
            self._unknown_cost_noted = True
            logger.warning("the calls report no cost and the pool has no prices: the cost cap cannot bound them")
        return self.spend.total >= cap or self.spend.total + sum(cost or 0.0 for cost in expected) > cap

    async def run(self, pending: Sequence[tuple[Task, str, int]], ask: Asker, judge_ask: JudgeAsker | None) -> None:
        semaphore = asyncio.Semaphore(self.config.concurrency)
        running: dict[asyncio.Task[None], list[str]] = {}  # the cells in flight and whom they may pay
        errors: list[BaseException] = []

        def finished(job: asyncio.Task[None]) -> None:
            running.pop(job, None)
            semaphore.release()
            if not job.cancelled() and job.exception() is not None:
                errors.append(job.exception())

        def in_flight() -> list[str]:
            return [key for keys in running.values() for key in keys]

        try:
            for task, agent, repetition in pending:
                await semaphore.acquire()
                keys = self.keys(task, agent, repetition)
                # Under a cap, an agent's (or the judge's) first call goes alone: its cost is unknown until it ends.
                while (
                    self.config.max_cost_usd is not None
                    and any(key not in self.spend.heard_from for key in keys)
                    and running
                ):
                    await asyncio.wait(set(running), return_when=asyncio.FIRST_COMPLETED)
                    if errors:
                        break
                if errors:
                    raise errors[0]
                if self.over_cap(keys, in_flight()):
                    semaphore.release()
                    self.stopped = STOPPED_AT_COST_CAP
                    break
                job = asyncio.create_task(self.one(ask, judge_ask, task, agent, repetition))
                running[job] = keys
                job.add_done_callback(finished)
            if running:
                await asyncio.gather(*running)
        finally:
            for job in list(running):
                job.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)


async def ask_all(
    asking: Asking, pending: Sequence[tuple[Task, str, int]], ask: Asker | None, judge_ask: JudgeAsker | None
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        if ask is None or (asking.judge is not None and judge_ask is None):
            import httpx

            from benchgen_router.collect import chat as http

            config = asking.config
            limits = httpx.Limits(max_connections=config.concurrency, max_keepalive_connections=config.concurrency)
            client = await stack.enter_async_context(
                httpx.AsyncClient(timeout=httpx.Timeout(config.timeout_s), limits=limits)
            )
            policy = RetryPolicy(config.retries, config.backoff_s)

            async def ask_http(upstream: Upstream, prompt: str) -> Answer:
                return await http.ask(client, upstream, prompt, max_tokens=config.max_tokens, policy=policy)

            async def ask_judge_http(upstream: Upstream, messages: Sequence[Mapping[str, str]]) -> Answer:
                # Greedy, as MT-Bench asks its judge: the same answer gets the same verdict.
                return await http.ask(client, upstream, messages, temperature=0.0, policy=policy)

            ask = ask_http if ask is None else ask
            judge_ask = ask_judge_http if judge_ask is None else judge_ask
        with _sigterm_cancels(asyncio.current_task()) as terminated:
            try:
                await asking.run(pending, ask, judge_ask)
            except asyncio.CancelledError:
                if terminated:
                    raise Terminated from None
                raise


@contextlib.contextmanager
def _sigterm_cancels(main: asyncio.Task[Any] | None) -> Iterator[list[bool]]:
    """Where SIGTERM raises Terminated (the command line's handler), make it cancel the asking instead
    while the loop runs: raised by the handler wherever the main thread is, Terminated could surface
    inside httpx's task groups, wrapped in an exception group, and skip the orderly stop. Yields a list
    that holds True once SIGTERM came."""
    terminated: list[bool] = []
    handler = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    if handler is not raise_terminated or main is None:
        yield terminated
        return
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: (terminated.append(True), main.cancel()))
    try:
        yield terminated
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        signal.signal(signal.SIGTERM, handler)
