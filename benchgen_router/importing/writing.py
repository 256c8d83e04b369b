"""Writing imported outcomes as the tasks, rewards and calls files that train, evaluate and the benchmark
read, in the formats collect writes (collect/formats.py). Rewards are per call correct (1) or wrong (0),
the pilot's definition, so that the calls file's `correct` and the rewards file's `mean_reward` agree."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchgen_router.collect.formats import Task, calls_row, dump_row, pool_digest, rewards_row
from benchgen_router.errors import InputError
from benchgen_router.files import Output
from benchgen_router.importing.outcomes import Outcomes
from benchgen_router.importing.pricing import call_costs

# Files written by write_outcomes, in an output folder.
TASKS_FILE, REWARDS_FILE, CALLS_FILE = "tasks.jsonl", "rewards.jsonl", "calls.jsonl"


def task_row(task: Task, source: str | None) -> dict[str, Any]:
    """A task's row of the tasks file train and evaluate join on task_id: its prompt, split and group,
    and where it came from. Imported tasks carry no answer or grader (the sources hold only whether
    each model was right), so `collect` cannot re-ask them."""
    return {
        "prompt": task.prompt,
        "source": {"dataset": task.dataset, "line": source},
        "split": task.split,
        "task_group": task.task_group,
        "task_id": task.task_id,
    }


def _call(
    agent: str,
    correct: bool,
    cost: float,
    latency_ms: float,
    prompt_tokens: float,
    completion_tokens: float,
    response: str | None,
) -> dict[str, Any]:
    """One call in the pilot's call fields (collect/formats.py CALL_FIELDS): one repetition, no error."""
    return {
        "agent": agent,
        "completion_tokens": None if math.isnan(completion_tokens) else int(completion_tokens),
        "correct": correct,
        "cost_usd": float(cost),
        "empty": response is not None and not response.strip(),
        "error": None,
        "extracted": None,
        "generation_id": None,
        "latency_ms": 0.0 if math.isnan(latency_ms) else float(latency_ms),
        "prompt_tokens": None if math.isnan(prompt_tokens) else int(prompt_tokens),
        "raw_response": response,
        "repetition": 0,
        "role": None,
    }


@dataclass
class Written:
    """What write_outcomes wrote, for the summary."""

    tasks: int
    agents: list[str]
    mean_reward: list[float]
    cost_unit: str
    mean_cost: list[float]  # per call, per agent, in cost_unit
    paths: list[Path]
    notes: list[str]


def _rows(outcomes: Outcomes, pool_version: str) -> Iterator[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    cost, _ = call_costs(outcomes)
    for i, task_id in enumerate(outcomes.task_ids):
        # answer and grader are not known for imported tasks; rewards_row reads only the fields it copies.
        task = Task(task_id, outcomes.prompts[i], "", "", task_group=outcomes.groups[i], dataset=outcomes.dataset)
        calls = [
            _call(
                agent,
                bool(outcomes.rewards[i, j]),
                cost[i, j],
                outcomes.latency_ms[i, j],
                outcomes.prompt_tokens[i, j],
                outcomes.completion_tokens[i, j],
                None if outcomes.responses is None else outcomes.responses[i][j],
            )
            for j, agent in enumerate(outcomes.agents)
        ]
        calls_file_row = calls_row(task_id, outcomes.agents, calls, 1, pool_version)
        source = outcomes.sources[i] if outcomes.sources else None
        yield task_row(task, source), rewards_row(calls_file_row, task), calls_file_row


def write_outcomes(outcomes: Outcomes, output_dir: str | os.PathLike, pool_version: str | None = None) -> Written:
    """Write tasks.jsonl, rewards.jsonl and calls.jsonl into output_dir (created if need be), in the
    formats collect writes (collect/formats.py): `train --rewards rewards.jsonl --tasks tasks.jsonl
    --calls calls.jsonl` reads them. Each file is written to a temporary file beside it, and the three
    are moved into place only once all are complete: a bad input leaves the folder as it was."""
    folder = Path(output_dir)
    if folder.exists() and not folder.is_dir():
        raise InputError(f"output folder {folder} is a file; pass a folder path.")
    if len(set(outcomes.task_ids)) != len(outcomes.task_ids):
        raise InputError("task ids repeat; each task must appear once.")
    pool_version = pool_version or pool_digest(outcomes.agents, outcomes.agents)
    cost, unit = call_costs(outcomes)  # refused before any file is made
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError(f"cannot create {folder} ({err.strerror}); pass another folder.") from None
    outputs: list[Output] = []
    done = False
    try:
        outputs.extend(Output(folder / name) for name in (TASKS_FILE, REWARDS_FILE, CALLS_FILE))
        for rows in _rows(outcomes, pool_version):
            for output, row in zip(outputs, rows, strict=True):
                output.handle.write(dump_row(row))
        for output in outputs:
            output.commit()
        done = True
    finally:
        for output in outputs:
            output.discard()  # nothing left once committed; removes the temporary files otherwise
        if not done and created:
            with contextlib.suppress(OSError):
                folder.rmdir()  # a folder this call made and left empty
    notes = list(outcomes.notes)
    if np.isnan(outcomes.cost_usd).all():
        notes.append("no cost or prices known: each call costs 1, so cost counts calls (not USD)")
    if np.isnan(outcomes.latency_ms).all():
        notes.append("no latency known: latency_ms is written as 0")
    return Written(
        tasks=len(outcomes),
        agents=list(outcomes.agents),
        mean_reward=outcomes.rewards.mean(axis=0).tolist(),
        cost_unit=unit,
        mean_cost=cost.mean(axis=0).tolist(),
        paths=[output.path for output in outputs],
        notes=notes,
    )
