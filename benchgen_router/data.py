"""Reward and task data: reading rows, the join on task_id, the held-out split (docs/reference.md, "Training").

Rewards rows are joined with task prompts on task_id, R[i, j] is the mean reward of agent j on task
i, and the held-out rows are those whose task split is the test split.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchgen_router.errors import InputError, first_line, setting_error
from benchgen_router.files import read_jsonl

logger = logging.getLogger("benchgen_router")

DEFAULT_TEST_SPLIT = "test"
MIN_TRAIN_ROWS = 10  # docs/reference.md: refuse to train on fewer than 10 joined rows
FALLBACK_TEST_SHARE = 0.2  # docs/reference.md: if no row is in the test split, a seeded random 20% is held out
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def load_rows(source: str, what: str) -> list[dict[str, Any]]:
    """Rows of a local JSONL file, or of every split of a Hub dataset (needs the `datasets` package).

    A source that exists on disk, ends in .json/.jsonl or starts like a path is a file; otherwise
    an `owner/name` string is taken as a Hub dataset id. Rows of a Hub dataset without a `split`
    field get the name of the dataset split they came from.
    """
    path = Path(source).expanduser()
    if path.is_dir():
        raise InputError(f"{what} '{source}' is a folder; pass a JSONL file or a Hub dataset id.")
    looks_like_path = path.suffix in (".json", ".jsonl") or source.startswith((".", "/", "~"))
    if path.exists() or looks_like_path or not _HUB_ID.match(source):
        return read_jsonl(path, what)
    try:
        import datasets
    except ImportError:
        raise InputError(
            f"{what} '{source}' is not a local file and reading Hub datasets needs the `datasets` package; "
            "pass a local JSONL file (or pip install datasets)."
        ) from None
    try:
        loaded = datasets.load_dataset(source)
    except Exception as err:  # datasets raises many types (network, missing repo, bad format)
        raise InputError(
            f"cannot load {what} dataset '{source}' ({first_line(err)}); pass a local JSONL file."
        ) from None
    rows = []
    for split_name, part in loaded.items():
        for row in part:
            rows.append({"split": split_name, **row})
    return rows


@dataclass
class LabelledData:
    """Reward rows joined with their prompts: row i is task_ids[i], prompts[i], rewards[i]."""

    agents: list[str]
    task_ids: list[str]
    prompts: list[str]
    splits: list[str | None]
    rewards: np.ndarray  # (rows, agents) float64 in [0, 1]
    skipped: list[str] = field(default_factory=list)  # reward task_ids with no task row

    def __len__(self) -> int:
        return len(self.task_ids)

    def subset(self, mask: np.ndarray) -> LabelledData:
        keep = np.flatnonzero(mask)
        return LabelledData(
            self.agents,
            [self.task_ids[i] for i in keep],
            [self.prompts[i] for i in keep],
            [self.splits[i] for i in keep],
            self.rewards[keep],
            self.skipped,
        )


def _check_reward_row(row: dict[str, Any], number: int, agents: list[str] | None) -> tuple[str, list[str], np.ndarray]:
    task_id = row.get("task_id")
    if not isinstance(task_id, str) or not task_id:
        raise InputError(f"rewards row {number} has no task_id; every row needs task_id, agent_order and mean_reward.")
    order = row.get("agent_order")
    if not isinstance(order, list) or not order or not all(isinstance(a, str) and a for a in order):
        raise InputError(f"rewards row {number} ({task_id}): agent_order must be a non-empty list of agent ids.")
    if len(set(order)) != len(order):
        raise InputError(f"rewards row {number} ({task_id}): agent_order repeats an agent id: {order}.")
    if agents is not None and order != agents:
        raise InputError(
            f"rewards row {number} ({task_id}) has agent_order {order} but earlier rows have {agents}; "
            "every row must score the same pool in the same order."
        )
    values = row.get("mean_reward")
    if not isinstance(values, list) or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        raise InputError(f"rewards row {number} ({task_id}): mean_reward must be a list of numbers.")
    if len(values) != len(order):
        raise InputError(
            f"rewards row {number} ({task_id}) has {len(values)} mean_reward values for {len(order)} agents; "
            "the reward vector must have one value per agent_order entry."
        )
    rewards = np.asarray(values, dtype=np.float64)
    if not np.isfinite(rewards).all() or (rewards < 0).any() or (rewards > 1).any():
        raise InputError(f"rewards row {number} ({task_id}) has mean_reward {values}; rewards must lie in [0, 1].")
    return task_id, order, rewards


def join_rewards(
    reward_rows: Sequence[dict[str, Any]], task_rows: Sequence[dict[str, Any]], min_rows: int = MIN_TRAIN_ROWS
) -> LabelledData:
    """Join rewards with task prompts on task_id (docs/reference.md), validating both.

    Reward rows whose task_id has no task row are skipped, as the reference does ("skip rows
    without a prompt"); a task row that exists but carries no prompt text is an error, because it
    means the wrong file or a damaged one. A row's split is its task's split, else the rewards row's.
    """
    if not reward_rows:
        raise InputError("the rewards file has no rows.")
    tasks: dict[str, dict[str, Any]] = {}
    for number, row in enumerate(task_rows, start=1):
        task_id = row.get("task_id")
        if not isinstance(task_id, str) or not task_id:
            raise InputError(f"tasks row {number} has no task_id; pass the task pool JSONL (task_id, prompt, split).")
        if task_id in tasks:
            raise InputError(f"tasks row {number} repeats task_id '{task_id}'; each task must appear once.")
        tasks[task_id] = row

    agents: list[str] | None = None
    seen: set[str] = set()
    task_ids, prompts, splits, rewards, skipped = [], [], [], [], []
    for number, row in enumerate(reward_rows, start=1):
        task_id, order, values = _check_reward_row(row, number, agents)
        agents = order
        if task_id in seen:
            raise InputError(f"rewards row {number} repeats task_id '{task_id}'; each task must appear once.")
        seen.add(task_id)
        task = tasks.get(task_id)
        if task is None:
            skipped.append(task_id)
            continue
        prompt = task.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise InputError(f"task '{task_id}' has no prompt text; pass the task pool with a 'prompt' on every row.")
        split = task.get("split", row.get("split"))
        task_ids.append(task_id)
        prompts.append(prompt)
        splits.append(None if split is None else str(split))
        rewards.append(values)
    if skipped:
        logger.warning(
            "skipped %d reward rows whose task_id is not in the tasks file (e.g. %s)", len(skipped), skipped[0]
        )
    if len(task_ids) < min_rows:
        raise InputError(
            f"only {len(task_ids)} reward rows join a task prompt on task_id (need at least {min_rows}); "
            "pass the tasks file that belongs to these rewards."
        )
    assert agents is not None
    return LabelledData(agents, task_ids, prompts, splits, np.stack(rewards), skipped)


def held_out_mask(data: LabelledData, test_split: str, seed: int) -> tuple[np.ndarray, str]:
    """Boolean mask of held-out rows and a description of how they were chosen.

    Rows whose split is test_split are held out. If none is and test_split is the default 'test',
    a seeded random 20% is held out (docs/reference.md); any other name that no row carries is an error,
    since asking for a split that does not exist is almost always a typo.
    """
    mask = np.array([split == test_split for split in data.splits])
    if not mask.any():
        present = sorted({s for s in data.splits if s is not None})
        if test_split != DEFAULT_TEST_SPLIT:
            raise setting_error(
                f"no joined row has split '{test_split}' (splits present: {present or 'none'}); "
                "pass one of those as {test_split}."
            )
        count = max(1, round(FALLBACK_TEST_SHARE * len(data)))
        mask = np.zeros(len(data), dtype=bool)
        mask[np.random.default_rng(seed).permutation(len(data))[:count]] = True
        return mask, f"no row has split '{test_split}': seeded random {count} rows held out"
    if mask.all():
        raise setting_error(
            f"every joined row has split '{test_split}', leaving nothing to train on; pass another {{test_split}}."
        )
    return mask, f"split '{test_split}'"
