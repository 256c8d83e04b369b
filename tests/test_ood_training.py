"""The trainer's guard (benchgen_router/ood/training.py): seeded disjoint fit and calibration parts,
the fallback agent, and the manifest's record, on synthetic embeddings."""

from __future__ import annotations

import numpy as np
import pytest
import test_ood_guard

from benchgen_router import ood

synthetic = test_ood_guard.synthetic  # the synthetic embeddings (a module fixture)

AGENTS = ["a", "b", "c"]
REWARDS = np.array([[0.0, 1.0, 0.5], [0.0, 1.0, 0.5]])  # "b" is the best fixed agent


@pytest.mark.parametrize("keep_share", [0.8, 0.9, 0.95])
def test_min_prompts_to_calibrate_leaves_a_calibration_part_that_calibrates(keep_share):
    count = ood.min_prompts_to_calibrate(keep_share)
    share = ood.DEFAULT_CALIBRATION_SHARE
    _, calibration = ood.split_indices(count, (1.0 - share, share), ood.DEFAULT_SPLIT_SEED)
    ood.conformal_threshold(np.arange(float(len(calibration))), keep_share)  # raises when too few
    assert ood.min_prompts_to_calibrate(0.95) == 65


def test_train_guard_fits_and_calibrates_on_the_seeded_split(synthetic):
    embeddings = synthetic["draw"](400, 1)
    trained = ood.train_guard(embeddings, REWARDS, AGENTS)
    fit_rows, calibration_rows = ood.split_indices(400, (0.7, 0.3), ood.DEFAULT_SPLIT_SEED)
    expected = ood.fit_guard(embeddings[fit_rows], embeddings[calibration_rows])
    assert trained.guard.threshold == expected.threshold and np.array_equal(trained.guard.mean, expected.mean)
    assert trained.fallback_agent == "b" == trained.guard.metadata["fallback_agent"]
    record = trained.record
    assert (record["n_prompts"], record["n_fit"], record["n_calibration"]) == (400, 280, 120)
    assert record["file"] == ood.GUARD_FILE and record["fallback_rule"] == "best fixed agent on the training rows"
    assert record["calibration_kept_share"] >= ood.DEFAULT_KEEP_SHARE
    chosen = ood.train_guard(embeddings, REWARDS, AGENTS, fallback=2)
    assert chosen.fallback_agent == "c" and chosen.record["fallback_rule"].startswith("highest mean utility")


def test_train_discriminative_guard_holds_out_every_view_of_a_calibration_prompt(synthetic):
    prompts = synthetic["draw"](100, 1)
    views, owners = synthetic["draw"](200, 2), np.repeat(np.arange(100), 2)  # two views per prompt
    inside, outside = synthetic["draw"](60, 3), synthetic["far"]
    trained = ood.train_discriminative_guard(prompts, views, owners, inside, outside, REWARDS, AGENTS)
    record = trained.record
    assert record["n_fit"] == 70 * 2 + 30 and trained.guard.metadata["n_fit"] == "170"
    assert (record["n_calibration"], record["n_plain_calibration"], record["n_outside"]) == (30, 30, 500)
    assert record["calibration_kept_share"] >= ood.DEFAULT_KEEP_SHARE
    assert record["plain_calibration_kept_share"] >= ood.DEFAULT_PLAIN_KEEP_SHARE
    assert trained.guard.discriminative and trained.fallback_agent == "b"
