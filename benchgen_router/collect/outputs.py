"""The records of a run and the two files computed from them: a call as the calls file records it, graded
against its task; and the calls and rewards files, written from the journal's entries alone, so that a
resumed run and an uninterrupted one write the same rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from benchgen_router.collect.chat import Answer
from benchgen_router.collect.formats import JUDGE_GRADER, Task, calls_row, dump_row, rewards_row, tally
from benchgen_router.collect.grading import Graders
from benchgen_router.collect.journal import Cell, Entry
from benchgen_router.collect.judge import reward
from benchgen_router.files import atomic_output
from benchgen_router.upstreams import Upstream

if TYPE_CHECKING:
    from benchgen_router.collect.run import CollectConfig


def call_record(upstream: Upstream, repetition: int, answer: Answer, task: Task, graders: Graders) -> dict[str, Any]:
    """A call in the pilot's format, graded by `graders`. A failed call reports no usage: it is recorded
    with 0 tokens and 0 USD (nothing was billed that anyone could know of), no response, and as a wrong
    answer."""
    failed = answer.error is not None
    raw = None if failed else answer.content or ""
    if task.grader == JUDGE_GRADER:  # rated by the judge once journaled: no grader's verdict here
        extracted, correct = None, None
    else:
        graded = graders.grade(task.grader, raw, task.answer)
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


def current_call(
    entry: Entry, task: Task, graders: Graders, verdicts: Mapping[Cell, Mapping[str, Any]]
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
    graded = graders.grade(task.grader, call["raw_response"], task.answer)
    return {**call, "extracted": graded.extracted, "correct": graded.correct}


def complete(task: Task, cell: Cell, entries: Mapping[Cell, Entry], verdicts: Mapping[Cell, Any]) -> bool:
    entry = entries.get(cell)
    return entry is not None and (cell in verdicts or not needs_judge(task, entry.call))


@dataclass(frozen=True)
class Written:
    tasks: int  # rows of the calls file
    rated: int  # rows of the rewards file (every agent with a graded answer)
    ungraded: int  # judged answers without a rating in the calls file
    grader_timeouts: int  # answers in the calls file graded wrong because their grade ran past its time limit


def write_outputs(
    config: CollectConfig,
    tasks: Sequence[Task],
    agents: Sequence[str],
    pool_version: str,
    entries: Mapping[Cell, Entry],
    verdicts: Mapping[Cell, Mapping[str, Any]],
    graders: Graders,
) -> Written:
    """Both files, atomically, from the journal's entries: the tasks whose every cell is answered (and
    every answer of a judged task rated or left ungraded by the judge), in the tasks file's order. The
    rewards file leaves out a judged task where some agent has no graded answer: its reward is unknown,
    and counting its ungraded answers as wrong would be false."""
    rows = []
    for task in tasks:
        cells = [(task.task_id, agent, r) for agent in agents for r in range(config.repetitions)]
        if all(complete(task, cell, entries, verdicts) for cell in cells):
            calls = [current_call(entries[cell], task, graders, verdicts) for cell in cells]
            rows.append((calls_row(task.task_id, agents, calls, config.repetitions, pool_version), task))
    rated = [(row, task) for row, task in rows if tally(row["agent_order"], row["calls"]).rated]
    inputs = tuple(path for path in (config.tasks, config.pool, config.judge_pool) if path is not None)
    with atomic_output(config.output, inputs=inputs) as handle:
        handle.writelines(dump_row(row) for row, _ in rows)
    with atomic_output(config.rewards_path, inputs=inputs) as handle:
        handle.writelines(dump_row(rewards_row(row, task)) for row, task in rated)
    ungraded = sum(call.get("reward", 0.0) is None for row, _ in rows for call in row["calls"])
    timeouts = sum(
        graders.timed_out(task.grader, call["raw_response"], task.answer) for row, task in rows for call in row["calls"]
    )
    return Written(len(rows), len(rated), ungraded, timeouts)
