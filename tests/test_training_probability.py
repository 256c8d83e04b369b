"""training/probability.py: the probability head's fitting and calibration report."""

from __future__ import annotations

import numpy as np
import pytest

from benchgen_router.training.probability import (
    ProbabilityHead,
    calibration_report,
    fit_probability_head,
)

AGENTS = ["strong", "mid", "cheap"]
COSTS = np.array([5.0, 2.0, 0.5])


def synthetic(n: int, dim: int = 12, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(embeddings, sampled outcomes, true probabilities) of a known logistic model per agent."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dim)).astype(np.float32)
    w = rng.normal(size=(len(AGENTS), dim)) * 0.8
    b = np.array([1.0, 0.0, -0.5])
    p = 1 / (1 + np.exp(-(x.astype(np.float64) @ w.T + b)))
    return x, (rng.random(p.shape) < p).astype(np.float64), p


@pytest.fixture(scope="module")
def fitted() -> tuple[ProbabilityHead, np.ndarray, np.ndarray, np.ndarray]:
    x, y, p = synthetic(1500)
    return fit_probability_head(x[:1000], y[:1000], seed=0), x, y, p


def test_fit_recovers_the_probabilities_and_is_calibrated(fitted) -> None:
    head, x, y, p = fitted
    assert head.weight.shape == (3, 12) and head.bias.shape == (3,) and head.weight.dtype == np.float32
    predicted = head.predict(x[1000:])
    assert predicted.shape == (500, 3)
    assert np.abs(predicted - p[1000:]).mean() < 0.06  # close to the truth it was sampled from
    # predict is the linear layer and a sigmoid, literally
    literal = 1 / (1 + np.exp(-(x[1000:].astype(np.float64) @ head.weight.astype(np.float64).T + head.bias)))
    np.testing.assert_allclose(predicted, literal, rtol=1e-12)
    report = calibration_report(predicted, y[1000:], AGENTS)
    brier = float(((predicted - y[1000:]) ** 2).mean())
    assert report["pooled"]["brier"] == pytest.approx(brier)
    truth = float(((p[1000:] - y[1000:]) ** 2).mean())
    assert brier < truth + 0.02  # nearly as good as the true probabilities
    # ECE recomputed literally from the table's own definition: equal-width bins of the pooled predictions
    flat_p, flat_y = predicted.ravel(), y[1000:].ravel()
    ece = 0.0
    for b in range(10):
        rows = (flat_p >= b / 10) & ((flat_p < (b + 1) / 10) if b < 9 else (flat_p <= 1))
        if rows.any():
            ece += rows.mean() * abs(flat_p[rows].mean() - flat_y[rows].mean())
    assert report["pooled"]["ece"] == pytest.approx(ece)
    assert sum(row["rows"] for row in report["pooled"]["reliability"]) == flat_p.size
    assert report["pooled"]["ece"] < 0.08


def test_soft_labels_and_seeded_determinism() -> None:
    x, _, p = synthetic(400, seed=3)
    first = fit_probability_head(x, p, seed=1)  # rewards in [0, 1] taken as soft labels
    again = fit_probability_head(x, p, seed=1)
    np.testing.assert_array_equal(first.weight, again.weight)
    assert np.abs(first.predict(x) - p).mean() < 0.05
    assert set(first.strengths) <= {1.0, 0.1, 0.01, 1e-3, 1e-4}


def test_bad_inputs_are_one_line() -> None:
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        fit_probability_head(np.zeros((4, 2), np.float32), np.full((4, 1), 2.0))
    with pytest.raises(ValueError, match="share n"):
        fit_probability_head(np.zeros((4, 2), np.float32), np.zeros((3, 1)))
