"""The outcome matrix a routing-value benchmark runs on: what `benchgen-router import` (or `collect`) wrote."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchgen_router.errors import InputError


@dataclass
class OutcomeMatrix:
    """Row i is task_ids[i] (prompts[i], groups[i]); column j is agents[j]. `rewards` in [0, 1] (1: the
    agent answered correctly); `cost_per_1k` what each call cost, times 1,000 (the cost of 1,000 such
    queries), in `cost_unit`."""

    name: str
    agents: list[str]
    task_ids: list[str]
    prompts: list[str]
    groups: list[str | None]
    rewards: np.ndarray  # (rows, agents) float64
    cost_per_1k: np.ndarray  # (rows, agents) float64
    cost_unit: str = "USD per 1,000 queries"

    def __len__(self) -> int:
        return len(self.task_ids)

    def rows(self, keep: np.ndarray) -> OutcomeMatrix:
        """The rows of an index array, in that order (a sample)."""
        return OutcomeMatrix(
            self.name,
            self.agents,
            [self.task_ids[i] for i in keep],
            [self.prompts[i] for i in keep],
            [self.groups[i] for i in keep],
            self.rewards[keep],
            self.cost_per_1k[keep],
            self.cost_unit,
        )


def read_imported_folder(
    folder: str | os.PathLike,
    pool: str | os.PathLike | None = None,
    name: str | None = None,
    cost_unit: str = "USD per 1,000 queries",
) -> OutcomeMatrix:
    """The matrix of a folder holding tasks.jsonl, rewards.jsonl and calls.jsonl (what `import` and `collect`
    write): rewards joined to prompts on task_id, each call's cost from the calls file (`pool` prices the
    calls that carry tokens but no cost), the group of each task from its `task_group`. `cost_unit` names what
    the calls file's costs count, times 1,000 (an import with `--call-cost-unit calls` counts calls)."""
    from benchgen_router.costs import costs_for_labelled
    from benchgen_router.data import join_rewards, load_rows
    from benchgen_router.importing import CALLS_FILE, REWARDS_FILE, TASKS_FILE

    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"{folder} is not a folder; pass the folder `benchgen-router import` wrote.")
    missing = [file for file in (TASKS_FILE, REWARDS_FILE, CALLS_FILE) if not (folder / file).is_file()]
    if missing:
        raise InputError(
            f"{folder} has no {missing[0]}; pass a folder with {TASKS_FILE}, {REWARDS_FILE} and {CALLS_FILE} "
            "(what `benchgen-router import` writes)."
        )
    task_rows = load_rows(str(folder / TASKS_FILE), "tasks file")
    data = join_rewards(load_rows(str(folder / REWARDS_FILE), "rewards file"), task_rows)
    group_of = {row.get("task_id"): row.get("task_group") for row in task_rows}
    costs = costs_for_labelled(data, folder / CALLS_FILE, pool)
    return OutcomeMatrix(
        name=name or folder.resolve().name,
        agents=list(data.agents),
        task_ids=list(data.task_ids),
        prompts=list(data.prompts),
        groups=[None if group_of.get(task) is None else str(group_of[task]) for task in data.task_ids],
        rewards=np.asarray(data.rewards, dtype=np.float64),
        cost_per_1k=np.asarray(costs.cost_per_1k, dtype=np.float64),
        cost_unit=cost_unit,
    )
