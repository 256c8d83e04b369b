"""The guard's statistics and score (benchgen_router/ood/guard.py): what the Mahalanobis score flags,
shrinkage, and the model's torch computation against the numpy one, on synthetic embeddings."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from benchgen_router import ood
from benchgen_router.errors import InputError

KEEP = ood.DEFAULT_KEEP_SHARE


# ---------------------------------------------------------------------------------------------
# Synthetic embeddings: an anisotropic cloud around one direction, and clouds around others


def cloud(rng: np.random.Generator, count: int, centre: np.ndarray, scales: np.ndarray) -> np.ndarray:
    return (centre + rng.normal(size=(count, len(centre))) * scales).astype(np.float32)


@pytest.fixture(scope="module")
def synthetic():
    rng = np.random.default_rng(7)
    dim = 24
    centre = np.zeros(dim)
    centre[0] = 4.0
    scales = np.linspace(0.05, 1.0, dim)  # variances spread over 400x: a plain distance would be misled
    elsewhere = np.zeros(dim)
    elsewhere[1] = 4.0
    return {
        "dim": dim,
        "draw": lambda count, seed: cloud(np.random.default_rng(seed), count, centre, scales),
        # far: another direction; subtle: a shift of 3 standard deviations along the tightest axes only
        "far": cloud(rng, 500, elsewhere, scales),
        "subtle": cloud(rng, 500, centre + np.r_[3 * scales[: dim // 2], np.zeros(dim - dim // 2)], scales),
    }


def test_guard_keeps_in_distribution_and_flags_out_of_distribution(synthetic):
    guard = ood.fit_guard(synthetic["draw"](600, 1), synthetic["draw"](300, 2))
    fresh = synthetic["draw"](4000, 3)
    kept = 1.0 - guard.flags(fresh).mean()
    assert abs(kept - KEEP) <= 4 * math.sqrt(KEEP * (1 - KEEP) * (1 / 4000 + 1 / 300))
    assert guard.flags(synthetic["far"]).mean() == 1.0
    # a shift of 3 standard deviations along the tight axes, small against the loose axes' spread
    assert guard.flags(synthetic["subtle"]).mean() >= 0.95
    assert ood.auroc(guard.scores(fresh), guard.scores(synthetic["subtle"])) >= 0.99
    assert guard.metadata["n_fit"] == "600" and guard.metadata["n_calibration"] == "300"


def test_shrinkage_weights_follow_the_data():
    rng = np.random.default_rng(5)
    isotropic = rng.normal(size=(60, 40))  # true covariance is a multiple of I: shrink (nearly) all the way
    skewed = rng.normal(size=(5000, 10)) * np.geomspace(0.01, 10, 10)  # plenty of rows, far from I: barely
    for method in ood.SHRINKAGE_METHODS:
        covariance, weight = ood.shrunk_covariance(isotropic, method)
        assert weight >= 0.8
        np.linalg.cholesky(covariance)  # fewer rows than twice the dimensions, still positive definite
        assert ood.shrunk_covariance(skewed, method)[1] <= 0.01
    wide = rng.normal(size=(10, 50))  # singular sample covariance
    for method in ood.SHRINKAGE_METHODS:
        np.linalg.cholesky(ood.shrunk_covariance(wide, method)[0])
    with pytest.raises(InputError, match="unknown shrinkage"):
        ood.shrunk_covariance(isotropic, "graphical_lasso")


def test_ledoit_wolf_matches_scikit_learn():
    covariance_module = pytest.importorskip("sklearn.covariance", reason="scikit-learn not installed")
    rows = np.random.default_rng(8).normal(size=(80, 30)) @ np.random.default_rng(9).normal(size=(30, 30))
    ours, weight = ood.shrunk_covariance(rows, "ledoit_wolf")
    theirs, their_weight = covariance_module.ledoit_wolf(rows)
    assert weight == pytest.approx(their_weight, rel=1e-9)
    assert np.abs(ours - theirs).max() <= 1e-9 * np.abs(theirs).max()


def test_torch_snippet_matches_numpy(synthetic):
    """The computation the model's forward runs on stored tensors (the snippet handed to the model
    code) flags exactly what the numpy guard flags, in float32."""
    guard = ood.fit_guard(synthetic["draw"](600, 1), synthetic["draw"](300, 2))
    queries = np.concatenate([synthetic["draw"](300, 4), synthetic["subtle"], synthetic["far"]])
    tensors = {key: torch.from_numpy(value) for key, value in guard.tensors().items()}
    embeddings = torch.from_numpy(queries)
    unit = torch.nn.functional.normalize(embeddings.float(), dim=-1)
    diff = unit - tensors["ood_mean"]
    score = ((diff @ tensors["ood_precision"]) * diff).sum(-1)
    flag = score > tensors["ood_threshold"]
    numpy_scores = guard.scores(queries)
    assert np.abs(score.numpy() - numpy_scores).max() <= 1e-4 * numpy_scores.max()
    near = np.abs(numpy_scores - guard.threshold) <= 1e-4 * guard.threshold  # float32 may differ right at the edge
    assert (flag.numpy() == guard.flags(queries))[~near].all()
