"""Fitting and calibration (benchgen_router/ood/fitting.py): the conformal threshold keeps its stated
share, the stored threshold rounds up, and the discriminative guard fits and keeps each calibration set."""

from __future__ import annotations

import math

import numpy as np
import pytest
import test_ood_guard
import torch

from benchgen_router import ood
from benchgen_router.errors import InputError

synthetic = test_ood_guard.synthetic  # the synthetic embeddings (a module fixture)


@pytest.mark.parametrize("keep_share", [0.8, 0.95, 0.99])
def test_calibration_keeps_the_stated_share_on_fresh_data(synthetic, keep_share):
    """Split conformal: with n calibration scores the kept share of fresh data has mean
    k/(n+1), k = ceil((n+1) q), and the variance of a Beta(k, n+1-k) draw (plus the fresh sample's)."""
    calibration_size, fresh_size, repeats = 200, 3000, 30
    fit = synthetic["draw"](600, 10)
    kept = []
    for repeat in range(repeats):
        guard = ood.fit_guard(fit, synthetic["draw"](calibration_size, 100 + repeat), keep_share)
        kept.append(1.0 - guard.flags(synthetic["draw"](fresh_size, 500 + repeat)).mean())
    rank = math.ceil((calibration_size + 1) * keep_share)
    expected = rank / (calibration_size + 1)
    beta_variance = rank * (calibration_size + 1 - rank) / ((calibration_size + 1) ** 2 * (calibration_size + 2))
    spread = math.sqrt(beta_variance + expected * (1 - expected) / fresh_size)
    assert expected >= keep_share
    assert abs(np.mean(kept) - expected) <= 4 * spread / math.sqrt(repeats)
    assert min(kept) >= keep_share - 5 * spread


def test_conformal_threshold_is_the_stated_order_statistic():
    scores = np.random.default_rng(0).permutation(np.arange(1.0, 101.0))  # 1..100
    assert ood.conformal_threshold(scores, 0.95) == 96.0  # ceil(101 * 0.95) = 96th smallest
    assert ood.conformal_threshold(scores, 0.5) == 51.0
    assert ood.conformal_threshold(np.arange(19.0), 0.95) == 18.0  # 19 scores: the largest
    with pytest.raises(InputError, match="give at least 19"):
        ood.conformal_threshold(np.arange(18.0), 0.95)
    with pytest.raises(InputError, match="strictly between 0 and 1"):
        ood.conformal_threshold(scores, 1.0)


def test_stored_threshold_is_the_float32_at_or_above_the_value():
    for value in (588.4775390625, 588.47754, 3.0756759, -2.5e-3, 1.0 / 3.0):
        stored = ood.stored_threshold(value)
        assert stored >= value and float(np.float32(stored)) == stored
        assert float(np.nextafter(np.float32(stored), np.float32(-np.inf))) < value


# ---------------------------------------------------------------------------------------------
# The discriminative guard: inside against outside, on the embedding and its distance


@pytest.fixture(scope="module")
def discriminative(synthetic):
    inside, outside = synthetic["draw"](600, 1), np.concatenate([synthetic["far"][:200], synthetic["subtle"][:200]])
    calibration = {"prompts": (synthetic["draw"](300, 2), 0.95), "questions": (synthetic["draw"](120, 5), 0.8)}
    return ood.fit_discriminative_guard(inside, outside, calibration), calibration


def test_discriminative_guard_flags_what_it_was_shown_and_keeps_each_calibration_set(synthetic, discriminative):
    guard, calibration = discriminative
    assert guard.discriminative and guard.metadata["n_outside"] == "400"
    fresh = synthetic["draw"](3000, 3)
    assert guard.flags(synthetic["far"][200:]).mean() == 1.0 and guard.flags(synthetic["subtle"][200:]).mean() >= 0.95
    assert 1.0 - guard.flags(fresh).mean() >= 0.90
    for name, (rows, share) in calibration.items():  # the largest threshold keeps each set's share, at least
        kept = int((~guard.flags(rows)).sum())
        assert kept >= math.ceil((len(rows) + 1) * share), name
    assert float(np.float32(guard.threshold)) == guard.threshold


def test_discriminative_guard_round_trips_and_matches_the_torch_score(tmp_path, synthetic, discriminative):
    guard, _ = discriminative
    path = ood.save_guard(tmp_path / "guard.safetensors", guard)
    loaded = ood.load_guard(path, embedding_dim=synthetic["dim"])
    assert loaded.discriminative and loaded.distance_weight == guard.distance_weight and loaded.bias == guard.bias
    queries = np.concatenate([synthetic["draw"](200, 9), synthetic["far"]])
    assert np.array_equal(loaded.flags(queries), guard.flags(queries))
    # the model's computation (modeling_router.RouterModel.ood_scores) on the stored float32 tensors
    t = {key: torch.from_numpy(value) for key, value in guard.tensors().items()}
    unit = torch.nn.functional.normalize(torch.from_numpy(queries).float(), dim=-1)
    diff = unit - t["ood_mean"]
    score = unit @ t["ood_weight"] + t["ood_distance_weight"] * ((diff @ t["ood_precision"]) * diff).sum(-1)
    score = score + t["ood_bias"]
    assert np.abs(score.numpy() - guard.scores(queries)).max() <= 1e-3


def test_logistic_regression_separates_and_needs_both_classes():
    rng = np.random.default_rng(0)
    rows = np.vstack([rng.normal(-1, 0.5, (80, 3)), rng.normal(1, 0.5, (20, 3))])
    outside = np.r_[np.zeros(80), np.ones(20)].astype(bool)
    weights, bias = ood.logistic_regression(rows, outside, l2=0.1)
    assert (((rows @ weights + bias) > 0) == outside).mean() >= 0.97
    with pytest.raises(InputError, match="needs both in-distribution and outside"):
        ood.logistic_regression(rows, np.zeros(100, dtype=bool), l2=0.1)
