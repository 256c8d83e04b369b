"""collect(): ask every agent of a pool every task `repetitions` times and write the pilot's two files."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import importlib.util
import logging
import math
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchgen_router.collect.asking import Asker, Asking, Spend, ask_all
from benchgen_router.collect.formats import JUDGE_GRADER, Task, pool_digest, read_tasks
from benchgen_router.collect.grading import Graders
from benchgen_router.collect.journal import Journal, JournalLock, JournalWriteFailed
from benchgen_router.collect.judge import Judge, JudgeAsker, resolve_judge
from benchgen_router.collect.outputs import Written, complete, write_outputs
from benchgen_router.errors import InputError, Terminated, setting_error
from benchgen_router.files import check_output_path
from benchgen_router.upstreams import UpstreamPool, read_upstream_pool

logger = logging.getLogger("benchgen_router.collect")


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
    judged: int = 0  # answers this run asked the judge about (each in one or two judge calls)
    rated: int = 0  # of those, the answers the judge gave a rating (the rest are ungraded)
    judge_cost_usd: float = 0.0  # what this run's judge calls cost (part of cost_usd)
    ungraded: int = 0  # judged answers in the written files that the judge gave no rating
    tasks_rated: int = 0  # rows of the rewards file: written tasks where every agent has a graded answer
    grader_timeouts: int = 0  # answers in the written files graded wrong: their grade ran past its time limit

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
    with holding_journal(config):  # a second run on this output asks nothing
        return _collect_locked(config, tasks, pool, pool_version, agents, models, ask, judge, judge_ask)


# The journals this thread (this asyncio task) holds the lock of, by resolved path.
_HELD: contextvars.ContextVar[frozenset[Path]] = contextvars.ContextVar("held_journals", default=frozenset())


@contextlib.contextmanager
def holding_journal(config: CollectConfig) -> Iterator[None]:
    """Hold the lock of `config`'s journal for the block: another run holding it is refused here
    (JournalInUse), so a command that writes files of its own before collect() (the sample of
    collect_from_journal) can take the lock first, and a refused run touches nothing. collect() within
    the block runs under the lock held; another thread's collect() is refused as another process's is."""
    path = Path(config.journal_path).resolve()
    if path in _HELD.get():
        yield
        return
    lock = JournalLock(Path(config.journal_path)).acquire()
    token = _HELD.set(_HELD.get() | {path})
    try:
        yield
    finally:
        _HELD.reset(token)
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
            if not complete(task, (task.task_id, agent, r), journal.entries, journal.verdicts)
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

    spend = Spend([entry.call for entry in journal.entries.values()], list(journal.verdicts.values()))
    # Grading is CPU work: more grading workers than cores would only make each grade slower.
    graders = Graders(config.math_equivalence, workers=max(1, min(config.concurrency, os.cpu_count() or 1)))

    def write() -> Written:
        return write_outputs(config, tasks, pool.agents, pool_version, journal.entries, journal.verdicts, graders)

    started = time.perf_counter()
    bar = tqdm(total=len(pending), unit="call", desc="collect", disable=not config.progress, dynamic_ncols=True)
    try:
        with bar:
            bar.set_postfix_str(f"{spend.total:.4f} USD", refresh=False)
            asking = Asking(config, pool, journal, spend, bar, graders, judge)
            try:
                if pending:
                    asyncio.run(ask_all(asking, pending, ask, judge_ask))
            except OSError as err:  # the journal could not take a finished call (a full disk)
                with contextlib.suppress(OSError, InputError):  # the files too, most likely; the journal counts
                    write()
                raise _write_failed(journal.path, err, asking.made) from None
            except (KeyboardInterrupt, Terminated):
                written = write()
                logger.warning(
                    "stopped: %d of %d tasks complete, written to %s; the journal %s keeps %d answered calls, "
                    "resume it (--resume) to ask only the rest",
                    written.tasks, len(tasks), config.output, journal.path, len(journal.entries),
                )  # fmt: skip
                raise
        seconds = time.perf_counter() - started
        try:
            written = write()
        except (OSError, InputError) as err:
            raise _write_failed(getattr(err, "filename", None) or config.output, err, asking.made) from None
    finally:
        graders.close()
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
        rated=asking.rated,
        judge_cost_usd=asking.judge_cost_usd,
        ungraded=written.ungraded,
        tasks_rated=written.rated,
        grader_timeouts=written.grader_timeouts,
    )
