"""collect(): ask every agent of a pool every task `repetitions` times and write the pilot's two files."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import math
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchgen_router.collect.chat import Answer, RetryPolicy
from benchgen_router.collect.formats import (
    JUDGE_GRADER,
    Task,
    calls_row,
    dump_row,
    pool_digest,
    read_tasks,
    rewards_row,
    tally,
)
from benchgen_router.collect.journal import Cell, Entry, Journal, JournalLock, JournalWriteFailed
from benchgen_router.collect.judge import Judge, JudgeAsker, judge_answer, resolve_judge, reward
from benchgen_router.errors import InputError, Terminated, raise_terminated, setting_error
from benchgen_router.files import atomic_output, check_output_path
from benchgen_router.graders import grade
from benchgen_router.upstreams import Upstream, UpstreamPool, read_upstream_pool

logger = logging.getLogger("benchgen_router.collect")

# How one cell is answered: the agent's upstream and the prompt in, its answer out (the default asks
# the upstream over HTTP; a caller may pass its own, e.g. to replay recorded answers).
Asker = Callable[[Upstream, str], Awaitable[Answer]]
STOPPED_AT_COST_CAP = "cost cap"
JUDGE_KEY = "\0judge"  # the judge's place among the agents in the cost cap's reckoning (no agent id is empty)


@dataclass(frozen=True)
class CollectConfig:
    """What to measure and where to write it; the defaults are the command line's."""

    tasks: Path
    pool: Path
    output: Path  # the calls file (rewards.v1-pilot.jsonl format); the journal is <output>.journal
    rewards_output: Path | None = None  # the rewards file (rewards.jsonl format); default <stem>.rewards.jsonl
    repetitions: int = 3
    limit: int | None = None  # the first `limit` tasks only
    concurrency: int = 4
    max_cost_usd: float | None = None
    resume: bool = False
    timeout_s: float = 600.0
    max_tokens: int | None = None  # sent upstream when set
    retries: int = 3
    backoff_s: float = 1.0
    pool_version: str | None = None  # default: a digest of the pool's agents and models
    math_equivalence: str = "value"  # graders.MATH_EQUIVALENCES: "string" grades math as the pilot did
    progress: bool = False
    judge: str | None = None  # the agent that rates answers of tasks without a reference (collect/judge.py)
    judge_pool: Path | None = None  # a pool file of the judge's own (its one agent, or `judge` in it)

    @property
    def rewards_path(self) -> Path:
        if self.rewards_output is not None:
            return Path(self.rewards_output)
        output = Path(self.output)
        stem = output.name.removesuffix(".jsonl")
        return output.with_name(f"{stem}.rewards.jsonl")

    @property
    def journal_path(self) -> Path:
        output = Path(self.output)
        return output.with_name(output.name + ".journal")


@dataclass(frozen=True)
class CollectResult:
    output: Path
    rewards_output: Path
    journal: Path
    tasks: int  # tasks asked about
    tasks_written: int  # tasks with every cell answered: the rows of both files
    cells: int  # tasks x agents x repetitions
    made: int  # calls this run made
    reused: int  # cells answered in the journal before this run
    failed: int  # calls of this run that failed after their retries (recorded with their error)
    cost_usd: float  # what this run's calls cost (calls of unknown cost count 0)
    total_cost_usd: float  # what every journaled call cost: the figure max_cost_usd caps
    seconds: float  # time spent asking
    stopped: str | None = None  # why cells were left unasked (STOPPED_AT_COST_CAP), None when none were
    judged: int = 0  # answers this run had the judge rate (each one or two judge calls)
    judge_cost_usd: float = 0.0  # what this run's judge calls cost (part of cost_usd)
    ungraded: int = 0  # judged answers in the written files that the judge gave no rating
    tasks_rated: int = 0  # rows of the rewards file: written tasks where every agent has a graded answer

    @property
    def calls_per_s(self) -> float:
        return self.made / self.seconds if self.seconds > 0 else 0.0


def check_config(config: CollectConfig) -> None:
    """Refuse settings no run can use, naming the setting (its flag on the command line)."""

    def whole(value: Any, minimum: int) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= minimum

    def amount(value: Any, positive: bool) -> bool:
        return (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(value)
            and (value > 0 if positive else value >= 0)
        )

    checks = [
        (whole(config.repetitions, 1), "{repetitions} must be an integer >= 1"),
        (config.limit is None or whole(config.limit, 1), "{limit} must be an integer >= 1"),
        (whole(config.concurrency, 1), "{concurrency} must be an integer >= 1"),
        (config.max_cost_usd is None or amount(config.max_cost_usd, False), "{max_cost_usd} must be a number >= 0"),
        (amount(config.timeout_s, True), "{timeout_s} must be a number of seconds > 0"),
        (config.max_tokens is None or whole(config.max_tokens, 1), "{max_tokens} must be an integer >= 1"),
        (whole(config.retries, 0), "{retries} must be an integer >= 0"),
        (amount(config.backoff_s, False), "{backoff_s} must be a number of seconds >= 0"),
        (config.pool_version is None or bool(str(config.pool_version).strip()), "{pool_version} must not be empty"),
    ]
    for ok, message in checks:
        if not ok:
            raise setting_error(message + ".")


def call_record(
    upstream: Upstream, repetition: int, answer: Answer, task: Task, math_equivalence: str = "value"
) -> dict[str, Any]:
    """A call in the pilot's format. A failed call reports no usage: it is recorded with 0 tokens and
    0 USD (nothing was billed that anyone could know of), no response, and as a wrong answer."""
    failed = answer.error is not None
    raw = None if failed else answer.content or ""
    if task.grader == JUDGE_GRADER:  # rated by the judge once journaled: no grader's verdict here
        extracted, correct = None, None
    else:
        graded = grade(task.grader, raw, task.answer, math_equivalence)
        extracted, correct = graded.extracted, graded.correct
    usage = answer.usage or {}

    def tokens(key: str) -> int | None:
        value = usage.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None

    return {
        "agent": upstream.agent,
        "completion_tokens": 0 if failed else tokens("completion_tokens"),
        "correct": correct,
        "cost_usd": 0.0 if failed else upstream.cost_usd(answer.usage),
        "empty": not failed and not raw.strip(),
        "error": answer.error,
        "extracted": extracted,
        "generation_id": answer.generation_id,
        "latency_ms": answer.latency_ms,
        "prompt_tokens": 0 if failed else tokens("prompt_tokens"),
        "raw_response": raw,
        "repetition": repetition,
        "role": None,
    }


def needs_judge(task: Task, call: Mapping[str, Any]) -> bool:
    """Whether the judge rates this call: an answer to a judged task. A failed call and an empty answer
    are wrong answers (reward 0), as for every grader, and cost no judge call."""
    return task.grader == JUDGE_GRADER and call["error"] is None and bool((call["raw_response"] or "").strip())


def _current(
    entry: Entry, task: Task, math_equivalence: str, verdicts: Mapping[Cell, Mapping[str, Any]]
) -> Mapping[str, Any]:
    """A journaled call graded against the task as it is now and the run's grading: a corrected
    answer key or another math equivalence applies on resume without asking again. A judged call
    carries `reward` (the judge's rating / 10, None when ungraded; 0 for a failed or empty call) and
    `judge` (the verdict, with what the judge's calls cost; None when the judge was not asked)."""
    call = entry.call
    if task.grader == JUDGE_GRADER:
        verdict = verdicts.get(entry.cell) if needs_judge(task, call) else None
        value = reward(verdict["rating"]) if verdict is not None else 0.0
        return {**call, "extracted": None, "correct": None, "reward": value, "judge": verdict}
    if call["error"] is not None:
        return call
    graded = grade(task.grader, call["raw_response"], task.answer, math_equivalence)
    return {**call, "extracted": graded.extracted, "correct": graded.correct}


def _complete(task: Task, cell: Cell, entries: Mapping[Cell, Entry], verdicts: Mapping[Cell, Any]) -> bool:
    entry = entries.get(cell)
    return entry is not None and (cell in verdicts or not needs_judge(task, entry.call))


@dataclass(frozen=True)
class Written:
    tasks: int  # rows of the calls file
    rated: int  # rows of the rewards file (every agent with a graded answer)
    ungraded: int  # judged answers without a rating in the calls file


def write_outputs(
    config: CollectConfig,
    tasks: Sequence[Task],
    agents: Sequence[str],
    pool_version: str,
    entries: Mapping[Cell, Entry],
    verdicts: Mapping[Cell, Mapping[str, Any]] | None = None,
) -> Written:
    """Both files, atomically, from the journal's entries: the tasks whose every cell is answered (and
    every answer of a judged task rated or left ungraded by the judge), in the tasks file's order. The
    rewards file leaves out a judged task where some agent has no graded answer: its reward is unknown,
    and counting its ungraded answers as wrong would be false."""
    verdicts = {} if verdicts is None else verdicts
    rows = []
    for task in tasks:
        cells = [(task.task_id, agent, r) for agent in agents for r in range(config.repetitions)]
        if all(_complete(task, cell, entries, verdicts) for cell in cells):
            calls = [_current(entries[cell], task, config.math_equivalence, verdicts) for cell in cells]
            rows.append((calls_row(task.task_id, agents, calls, config.repetitions, pool_version), task))
    rated = [(row, task) for row, task in rows if tally(row["agent_order"], row["calls"]).rated]
    inputs = tuple(path for path in (config.tasks, config.pool, config.judge_pool) if path is not None)
    with atomic_output(config.output, inputs=inputs) as handle:
        handle.writelines(dump_row(row) for row, _ in rows)
    with atomic_output(config.rewards_path, inputs=inputs) as handle:
        handle.writelines(dump_row(rewards_row(row, task)) for row, task in rated)
    ungraded = sum(call.get("reward", 0.0) is None for row, _ in rows for call in row["calls"])
    return Written(len(rows), len(rated), ungraded)


def _open_journal(config: CollectConfig, pool_version: str, agents: Sequence[str], models: Sequence[str]) -> Journal:
    path = config.journal_path
    if path.exists():
        if not config.resume:
            raise setting_error(
                f"journal {path} exists (the calls an earlier run answered): pass {{resume}} to continue it, "
                "or another {output}."
            )
        return Journal.reopen(path, pool_version, agents, models)
    for existing in (Path(config.output), config.rewards_path):
        if existing.exists():
            raise setting_error(
                f"{existing} exists and no journal {path} is next to it to resume from; pass another {{output}} "
                "(or remove the file)."
            )
    return Journal.create(path, pool_version, agents, models)


class _Spend:
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


class _Asking:
    """The asking phase: launches cells under the semaphore and the cost cap, journals each as it ends
    (an answer to a judged task, then the judge's verdict on it)."""

    def __init__(
        self,
        config: CollectConfig,
        pool: UpstreamPool,
        journal: Journal,
        spend: _Spend,
        bar: Any,
        judge: Judge | None = None,
    ) -> None:
        self.config, self.pool, self.journal, self.spend, self.bar = config, pool, journal, spend, bar
        self.judge = judge
        self.made = self.failed = self.judged = 0
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
            self.judge_cost_usd += verdict["cost_usd"] or 0.0
            self.cost_usd += verdict["cost_usd"] or 0.0
            if verdict["rating"] is None:
                logger.debug("%s on %s (repetition %d) left ungraded: %s", agent, task.task_id, repetition,
                             verdict["error"])  # fmt: skip
            self.bar.set_postfix_str(f"{self.spend.total:.4f} USD", refresh=False)

    async def answer(self, ask: Asker, task: Task, agent: str, repetition: int) -> None:
        upstream = self.pool.upstreams[agent]
        answer = await ask(upstream, task.prompt)
        record = (upstream, repetition, answer, task, self.config.math_equivalence)
        try:
            if task.grader == "math_expression":  # math-verify's time limits (SIGALRM) hold on the main thread only
                call = call_record(*record)
            else:  # a long answer is graded beside the loop, which goes on serving the other calls
                call = await asyncio.to_thread(call_record, *record)
        except asyncio.CancelledError:  # the run stops: an answered call is journaled all the same
            self.record(task, agent, repetition, call_record(*record))
            raise
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


async def _ask_all(
    asking: _Asking, pending: Sequence[tuple[Task, str, int]], ask: Asker | None, judge_ask: JudgeAsker | None
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


def collect(config: CollectConfig, ask: Asker | None = None, judge_ask: JudgeAsker | None = None) -> CollectResult:
    """Ask every agent of `config.pool` every task of `config.tasks` `repetitions` times (the cells a
    journal already holds are not asked again), then write the calls and rewards files.

    Bad input raises InputError with one line before any call, and so does another run holding the
    journal (JournalInUse). A write that fails after calls were made (a full disk) raises
    JournalWriteFailed: the journal keeps every finished call, and resuming continues. Ctrl-C and
    SIGTERM (as Terminated) stop the run: the files are written with the tasks finished so far and
    the exception goes on.

    With `config.judge` (an agent of the pool) or `config.judge_pool`, the judge rates the answers of
    tasks without a reference (collect/judge.py); `judge_ask` takes another way to ask it (an async
    function of its `Upstream` and the messages), as `ask` does for the agents."""
    check_config(config)
    judged = config.judge is not None or config.judge_pool is not None
    if (ask is None or (judged and judge_ask is None)) and importlib.util.find_spec("httpx") is None:
        raise InputError(
            "collect asks the upstreams with httpx, which is missing: pip install 'benchgen-router[collect]'."
        )
    tasks = read_tasks(str(config.tasks), config.limit, judge=judged)
    pool = read_upstream_pool(config.pool)
    judge = resolve_judge(pool, config.judge, None if config.judge_pool is None else Path(config.judge_pool))
    agents = list(pool.agents)
    models = [pool.upstreams[agent].model for agent in agents]
    pool_version = str(config.pool_version) if config.pool_version is not None else pool_digest(agents, models)
    output, rewards = Path(config.output), config.rewards_path
    if output.resolve() == rewards.resolve():
        raise setting_error(f"{{rewards_output}} {rewards} is {{output}} itself; pass another path.")
    inputs = tuple(Path(path) for path in (config.tasks, config.pool, config.judge_pool) if path is not None)
    for path in (output, rewards):
        check_output_path(path, inputs)
    lock = JournalLock(config.journal_path).acquire()  # a second run on this output asks nothing
    try:
        return _collect_locked(config, tasks, pool, pool_version, agents, models, ask, judge, judge_ask)
    finally:
        lock.release()


def _collect_locked(
    config: CollectConfig,
    tasks: Sequence[Task],
    pool: UpstreamPool,
    pool_version: str,
    agents: Sequence[str],
    models: Sequence[str],
    ask: Asker | None,
    judge: Judge | None = None,
    judge_ask: JudgeAsker | None = None,
) -> CollectResult:
    journal = _open_journal(config, pool_version, agents, models)
    try:
        by_id = {task.task_id: task for task in tasks}
        for entry in journal.entries.values():
            task = by_id.get(entry.task_id)
            if task is not None and task.prompt_sha256 != entry.prompt_sha256:
                raise setting_error(
                    f"task '{task.task_id}' has another prompt than the one journal {journal.path} asked; restore "
                    "it, or pass another {output} to measure the new prompts."
                )
        _check_judge(journal, by_id, judge)
        cells = [(task, agent, r) for task in tasks for r in range(config.repetitions) for agent in agents]
        pending = [
            (task, agent, r)
            for task, agent, r in cells
            if not _complete(task, (task.task_id, agent, r), journal.entries, journal.verdicts)
        ]
        reused = sum((task.task_id, agent, r) in journal.entries for task, agent, r in cells)
        logger.info(
            "collect: %d tasks x %d agents x %d repetitions = %d calls; %d answered in %s, %d to ask or judge",
            len(tasks), len(agents), config.repetitions, len(cells), reused, journal.path, len(pending),
        )  # fmt: skip
        return _collect(config, tasks, pool, pool_version, journal, pending, reused, len(cells), ask, judge, judge_ask)
    finally:
        journal.close()


def _check_judge(journal: Journal, tasks: Mapping[str, Task], judge: Judge | None) -> None:
    """Refuse to mix judges: the verdicts a journal holds on this run's judged tasks must be this judge's."""
    for (task_id, _, _), verdict in journal.verdicts.items():
        task = tasks.get(task_id)
        if task is None or task.grader != JUDGE_GRADER or judge is None:
            continue
        recorded = {"agent": verdict["agent"], "model": verdict["model"]}
        if recorded != judge.identity:
            raise setting_error(
                f"journal {journal.path} holds verdicts of judge {recorded['agent']!r} ({recorded['model']}), not of "
                f"{judge.identity['agent']!r} ({judge.identity['model']}); resume with that judge, or pass another "
                "{output} to rate the answers again."
            )


def _write_failed(path: Any, err: BaseException, made: int) -> JournalWriteFailed:
    """The one line for a write that failed after calls were made: what failed, and that resuming
    continues (nothing journaled is asked again)."""
    why = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
    template = (
        f"cannot write {path} ({why}) after {made} calls this run; the journal keeps every finished call: "
        "free space, then rerun with {resume} to continue without asking them again."
    )
    return JournalWriteFailed(template.format(resume="resume=True"), cli=template.format(resume="--resume"))


def _collect(
    config: CollectConfig,
    tasks: Sequence[Task],
    pool: UpstreamPool,
    pool_version: str,
    journal: Journal,
    pending: Sequence[tuple[Task, str, int]],
    reused: int,
    cells: int,
    ask: Asker | None,
    judge: Judge | None = None,
    judge_ask: JudgeAsker | None = None,
) -> CollectResult:
    from tqdm.auto import tqdm

    spend = _Spend([entry.call for entry in journal.entries.values()], list(journal.verdicts.values()))
    started = time.perf_counter()
    with tqdm(total=len(pending), unit="call", desc="collect", disable=not config.progress, dynamic_ncols=True) as bar:
        bar.set_postfix_str(f"{spend.total:.4f} USD", refresh=False)
        asking = _Asking(config, pool, journal, spend, bar, judge)
        try:
            if pending:
                asyncio.run(_ask_all(asking, pending, ask, judge_ask))
        except OSError as err:  # the journal could not take a finished call (a full disk)
            with contextlib.suppress(OSError, InputError):  # the files too, most likely; the journal is what counts
                write_outputs(config, tasks, pool.agents, pool_version, journal.entries, journal.verdicts)
            raise _write_failed(journal.path, err, asking.made) from None
        except (KeyboardInterrupt, Terminated):
            written = write_outputs(config, tasks, pool.agents, pool_version, journal.entries, journal.verdicts)
            logger.warning(
                "stopped: %d of %d tasks complete, written to %s; the journal %s keeps %d answered calls, "
                "resume it (--resume) to ask only the rest",
                written.tasks, len(tasks), config.output, journal.path, len(journal.entries),
            )  # fmt: skip
            raise
    seconds = time.perf_counter() - started
    try:
        written = write_outputs(config, tasks, pool.agents, pool_version, journal.entries, journal.verdicts)
    except (OSError, InputError) as err:
        raise _write_failed(getattr(err, "filename", None) or config.output, err, asking.made) from None
    return CollectResult(
        output=Path(config.output),
        rewards_output=config.rewards_path,
        journal=journal.path,
        tasks=len(tasks),
        tasks_written=written.tasks,
        cells=cells,
        made=asking.made,
        reused=reused,
        failed=asking.failed,
        cost_usd=asking.cost_usd,
        total_cost_usd=spend.total,
        seconds=seconds,
        stopped=asking.stopped,
        judged=asking.judged,
        judge_cost_usd=asking.judge_cost_usd,
        ungraded=written.ungraded,
        tasks_rated=written.rated,
    )
