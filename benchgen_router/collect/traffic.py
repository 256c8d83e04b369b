"""Tasks from the gateway's traffic journal: the prompts users sent, measured on the pool with the judge.

    from benchgen_router.collect.traffic import JournalSource, collect_from_journal
    sample, result = collect_from_journal(config, JournalSource(Path("journal/"), sample=200, seed=0))

- The journal (`serve --journal DIR`, serving/journal.py) is read with its reader: an unfinished last line
  (a crash, or a file a live gateway is writing) is skipped with one warning, and feedback is joined to
  its call by request id across every process's files (feedback sent to another replica included).
- Only calls journaled with their text (`serve --journal-text`) can be asked again; one prompt is kept
  per distinct text (its salted hash), however often users sent it. A text the gateway cut (it routes on
  and journals at most 65,536 characters: `text_truncated`) is not the prompt the user sent, so it is
  skipped and counted, as are damaged lines and repeated request ids (serving/journal_reading.py).
- The sample is stratified by the agent that answered each prompt (its latest call): the agents take
  equal shares, each a seeded random draw of its prompts, and an agent with fewer prompts than its share
  leaves the rest to the others. Traffic as served mirrors the current router's own picks: mostly the
  prompts it sends to its favourite agent. A sample of it as served (or of its newest prompts, which
  adds the hour's topics) teaches a new head little about the prompts where the current router chose
  otherwise, which are the ones it must learn to tell apart. A random draw within each agent, rather
  than the newest, spreads the sample over the whole journal.
- The tasks have no reference answer, so the judge rates every agent's answers (grader "judge"); each
  carries its users' feedback scores per agent that served it, which the rewards file turns into the
  `feedback_reward` column beside the judge's `mean_reward` (collect/formats.py).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchgen_router.collect.formats import JUDGE_GRADER, dump_row, read_tasks
from benchgen_router.collect.judge import JudgeAsker
from benchgen_router.collect.run import Asker, CollectConfig, CollectResult, collect, holding_journal
from benchgen_router.errors import InputError, setting_error
from benchgen_router.files import atomic_output
from benchgen_router.serving.journal import TEXT_MAX_CHARS
from benchgen_router.serving.journal_reading import JournalReading, read_journal
from benchgen_router.upstreams import read_upstream_pool

logger = logging.getLogger("benchgen_router.collect")

TASK_PREFIX = "journal-"
DATASET = "traffic journal"  # the tasks' source.dataset, copied into the rewards file


@dataclass(frozen=True)
class JournalSource:
    """Where the prompts come from: a journal folder, how many distinct prompts to take, the draw's seed."""

    folder: Path
    sample: int
    seed: int = 0


@dataclass
class TrafficPrompt:
    """One distinct prompt of the journal: its text, the agent that answered its latest call, and the
    users' feedback on its answers (per agent that served one: each answer's latest score)."""

    text_sha256: str
    text: str
    answered_by: str | None = None
    last_seen: str = ""
    calls: int = 0
    feedback: dict[str, list[float]] = field(default_factory=dict)

    def task_row(self) -> dict[str, Any]:
        return {
            "task_id": TASK_PREFIX + self.text_sha256[:16],
            "prompt": self.text,
            "grader": JUDGE_GRADER,
            "source": {"dataset": DATASET},
            "feedback": self.feedback,
            "journal": {"answered_by": self.answered_by, "calls": self.calls, "last_seen": self.last_seen},
        }


@dataclass(frozen=True)
class JournalSample:
    """What was taken from the journal (or, on resume, reused from the tasks file)."""

    tasks: Path
    calls: int  # journaled calls read
    without_text: int  # of which journaled without their text (not usable)
    truncated: int  # of which with a text the gateway cut (not the prompt sent: skipped)
    prompts: int  # distinct prompts with text
    sampled: int  # tasks written (or reused)
    by_agent: Mapping[str, int]  # sampled prompts per answering agent
    with_feedback: int  # sampled prompts with at least one feedback score
    damaged_lines: int = 0  # journal lines skipped: damaged, or text that is not valid UTF-8
    repeated_calls: int = 0  # call lines skipped: their request id is an earlier line's
    conflicting_ids: int = 0  # of those ids, the ones repeated with another text (named in the log)
    reused: bool = False  # the tasks file of an earlier run, kept for --resume (the journal is not read)


def _score(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0.0 <= value <= 1.0


@dataclass
class TrafficPrompts:
    """The journal's distinct prompts with text, oldest first by their latest call, and what was read."""

    prompts: list[TrafficPrompt]
    reading: JournalReading
    without_text: int  # calls journaled without their text
    truncated: int  # calls whose text the gateway cut


def cut_by_the_gateway(call: Mapping[str, Any], text: str) -> bool:
    """The line's mark says whether the gateway cut its text. A line journaled before the mark existed has none:
    a text as long as the gateway routes on may have been cut there, and is taken as cut."""
    if "text_truncated" in call:
        return call["text_truncated"] is True
    return len(text) >= TEXT_MAX_CHARS


def traffic_prompts(folder: Path) -> TrafficPrompts:
    """The journal's distinct prompts with their whole text, and the counts of the calls left out."""
    reading = read_journal(folder)
    prompts: dict[str, TrafficPrompt] = {}
    without_text = truncated = 0
    for call in reading.calls:
        text, digest = call.get("text"), call.get("text_sha256")
        if not isinstance(text, str) or not text.strip() or not isinstance(digest, str):
            without_text += 1
            continue
        if cut_by_the_gateway(call, text):
            truncated += 1
            continue
        prompt = prompts.pop(digest, None) or TrafficPrompt(digest, text)
        prompts[digest] = prompt  # re-inserted: the dict stays in order of each prompt's latest call
        agent = call.get("agent")
        prompt.answered_by = agent if isinstance(agent, str) else None
        prompt.last_seen = str(call.get("time", ""))
        prompt.calls += 1
        scores = [item["score"] for item in call.get("feedback", ()) if _score(item.get("score"))]
        if scores and isinstance(agent, str):  # a user who scored an answer twice meant the later score
            prompt.feedback.setdefault(agent, []).append(float(scores[-1]))
    return TrafficPrompts(list(prompts.values()), reading, without_text, truncated)


def stratified_sample(prompts: Sequence[TrafficPrompt], size: int, seed: int) -> list[TrafficPrompt]:
    """`size` prompts, equal shares per answering agent (round robin over the agents in name order),
    each agent's drawn at random with `seed`; an agent that runs out leaves its turns to the others."""
    rng = random.Random(seed)
    groups: dict[str, list[TrafficPrompt]] = {}
    for prompt in prompts:
        groups.setdefault(prompt.answered_by or "", []).append(prompt)
    queues = [rng.sample(groups[agent], len(groups[agent])) for agent in sorted(groups)]
    chosen: list[TrafficPrompt] = []
    while len(chosen) < size and any(queues):
        for queue in queues:
            if queue and len(chosen) < size:
                chosen.append(queue.pop())
    return chosen


def write_journal_tasks(source: JournalSource, tasks: Path) -> JournalSample:
    """Sample `source` and write the prompts as judged tasks to `tasks`, atomically."""
    found = traffic_prompts(Path(source.folder))
    prompts, calls = found.prompts, len(found.reading.calls)
    if not prompts and found.truncated:
        raise InputError(
            f"journal {source.folder} holds no whole prompt: of its {calls} calls, {found.truncated} have a text the "
            f"gateway cut at {TEXT_MAX_CHARS:,} characters and {found.without_text} none; collect asks prompts as sent."
        )
    if not prompts:
        raise InputError(
            f"journal {source.folder} holds no prompt text: {found.without_text} of its {calls} calls were journaled "
            "without it (by default the gateway stores a salted hash only); serve with --journal-text to store "
            "the text of new calls, then collect from them."
        )
    chosen = stratified_sample(prompts, source.sample, source.seed)
    if len(chosen) < source.sample:
        logger.warning(
            "warning: journal %s holds %d distinct prompts with text, fewer than --sample %d; taking them all",
            source.folder,
            len(prompts),
            source.sample,
        )
    with atomic_output(tasks) as handle:
        handle.writelines(dump_row(prompt.task_row()) for prompt in chosen)
    by_agent: dict[str, int] = {}
    for prompt in chosen:
        by_agent[prompt.answered_by or "?"] = by_agent.get(prompt.answered_by or "?", 0) + 1
    return JournalSample(
        tasks=tasks,
        calls=calls,
        without_text=found.without_text,
        truncated=found.truncated,
        prompts=len(prompts),
        sampled=len(chosen),
        by_agent=dict(sorted(by_agent.items())),
        with_feedback=sum(bool(prompt.feedback) for prompt in chosen),
        damaged_lines=found.reading.damaged_lines,
        repeated_calls=found.reading.repeated_calls,
        conflicting_ids=len(found.reading.conflicting_ids),
    )


def _reused_sample(tasks: Path) -> JournalSample:
    rows = read_tasks(str(tasks), judge=True)
    return JournalSample(
        tasks=tasks,
        calls=0,
        without_text=0,
        truncated=0,
        prompts=len(rows),
        sampled=len(rows),
        by_agent={},
        with_feedback=sum(bool(task.feedback) for task in rows),
        reused=True,
    )


def _check(config: CollectConfig, source: JournalSource) -> None:
    flags = {"folder": "--from-journal", "sample": "--sample", "tasks": "--tasks"}
    if config.judge is None and config.judge_pool is None:
        raise setting_error(
            "prompts from {folder} have no reference answer: pass {judge} or {judge_pool} to have a judge rate "
            "the answers.",
            flags,
        )
    sample = source.sample
    if not isinstance(sample, int) or isinstance(sample, bool) or sample < 1:
        raise setting_error("{sample} must be an integer >= 1.", flags)
    if not isinstance(source.seed, int) or isinstance(source.seed, bool):
        raise setting_error("{seed} must be an integer.", flags)
    tasks = Path(config.tasks).resolve()
    written = (Path(config.output), config.rewards_path, config.journal_path)
    if any(tasks == Path(path).resolve() for path in written):
        raise setting_error(f"{{tasks}} {config.tasks} is one of the files collect writes; pass another path.", flags)
    if Path(config.tasks).exists() and not config.resume:
        raise setting_error(
            f"{{tasks}} {config.tasks} exists (prompts sampled by an earlier run, or a tasks file of yours); pass "
            "{resume} to continue that run with the same prompts, or another {tasks}.",
            flags,
        )


def _warn_foreign_agents(config: CollectConfig) -> None:
    """Feedback on agents the pool lacks (the journal was served by another pool) cannot be used."""
    agents = set(read_upstream_pool(config.pool).agents)
    rows = read_tasks(str(config.tasks), judge=True)
    foreign = sorted({agent for task in rows for agent, _ in task.feedback or () if agent not in agents})
    if foreign:
        logger.warning(
            "warning: feedback on %s is left out: the pool %s has no such agent", ", ".join(foreign), config.pool
        )


def collect_from_journal(
    config: CollectConfig, source: JournalSource, ask: Asker | None = None, judge_ask: JudgeAsker | None = None
) -> tuple[JournalSample, CollectResult]:
    """Sample `source`'s prompts into the tasks file `config.tasks`, then measure the pool on them with
    the judge (collect()). With `config.resume` and that tasks file present, its prompts are kept (the
    journal is not sampled again). Bad input is one line, and a tasks file this call wrote is removed
    when collect refuses to start, so the same call can be made again. The output's journal lock is taken
    before the journal is read: a call refused because another run holds the output (JournalInUse)
    writes, removes and probes nothing."""
    read_upstream_pool(config.pool)  # a pool problem is reported before the journal is read
    _check(config, source)
    with holding_journal(config):
        tasks = Path(config.tasks)
        if tasks.exists():
            sample = _reused_sample(tasks)
            logger.info("collect: %d prompts sampled from the journal before, in %s, kept for --resume",
                        sample.sampled, tasks)  # fmt: skip
        else:
            sample = write_journal_tasks(source, tasks)
        try:
            _warn_foreign_agents(config)
            return sample, collect(config, ask, judge_ask)
        except InputError:  # nothing was asked: leave no sampled tasks file behind to block the next run
            if not sample.reused:
                tasks.unlink(missing_ok=True)
            raise
