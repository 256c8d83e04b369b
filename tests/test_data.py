"""data.py: the reference's data rules: the join on task_id, rows without a prompt skipped, the
held-out split (the test split, or a seeded 20% only for the default name), on the real pilot data."""

from __future__ import annotations

import numpy as np
import pytest

from benchgen_router.data import held_out_mask, join_rewards
from benchgen_router.evaluation.metrics import baselines, evaluate_picks
from helpers import AGENTS, NO_PILOT, PILOT, pilot_data, synthetic_rows

needs_pilot = pytest.mark.skipif(not (PILOT / "rewards.jsonl").exists(), reason=NO_PILOT)


def test_real_pilot_join_split_and_held_out_baselines():
    """The published matrix joins to 46 rows, 35 train / 11 held out. On its 11 test rows the
    baselines are 0.7879 / 0.6364 / 0.8485 (frontier_a best). The figures the pilot README and the
    original card quote (0.6667 / 0.5538 / 0.7692) are those of the raw pilot matrix's 13 test rows,
    checked below, so the two files are told apart here."""
    data = pilot_data("rewards.jsonl")
    test, how = held_out_mask(data, "test", seed=42)
    assert (len(data), int((~test).sum()), int(test.sum())) == (46, 35, 11) and how == "split 'test'"
    assert data.agents == AGENTS
    held_out = evaluate_picks(np.zeros(11, dtype=int), data.rewards[test], AGENTS)
    assert held_out["best_fixed_agent_id"] == "frontier_a"
    assert [round(held_out[k], 4) for k in ("best_fixed_agent", "random_agent", "oracle")] == [0.7879, 0.6364, 0.8485]

    raw = pilot_data("rewards.v1-pilot.jsonl")
    raw_test, _ = held_out_mask(raw, "test", seed=42)
    assert (len(raw), int(raw_test.sum())) == (60, 13)
    figures = baselines(raw.rewards[raw_test])
    assert [round(figures[k], 4) for k in ("best_fixed_agent", "random_agent", "oracle")] == [0.6667, 0.5538, 0.7692]


def test_split_rule_random_20_percent_only_for_the_default_name():
    rewards, tasks = synthetic_rows(20)
    for row in tasks:
        row["split"] = "train"
    data = join_rewards(rewards, tasks)
    mask, how = held_out_mask(data, "test", seed=7)
    assert mask.sum() == 4 and "seeded random" in how
    assert np.array_equal(mask, held_out_mask(data, "test", seed=7)[0])
    assert not np.array_equal(mask, held_out_mask(data, "test", seed=8)[0])
    with pytest.raises(Exception, match="no joined row has split 'heldout'"):
        held_out_mask(data, "heldout", seed=7)


def test_rows_without_a_task_are_skipped_and_split_comes_from_the_task():
    rewards, tasks = synthetic_rows(14)
    tasks = tasks[:12]  # the last two reward rows have no task
    tasks[0]["split"] = "validation"
    data = join_rewards(rewards, tasks)
    assert len(data) == 12 and data.skipped == ["t12", "t13"]
    assert data.splits[0] == "validation" and data.splits[11] == "test"
