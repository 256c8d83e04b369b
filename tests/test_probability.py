"""The probability head's fitting, calibration report and decision rules, each rule checked against a
literal numpy computation written here from docs/tradeoff.md."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchgen_router.training.probability import (
    ProbabilityHead,
    calibration_report,
    decide,
    fit_probability_head,
    tradeoff_calibration,
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


def literal_tolerance(p: np.ndarray, costs: np.ndarray, tolerance: float) -> np.ndarray:
    picks = []
    for row in p:
        near = [j for j in range(len(row)) if row[j] >= row.max() - tolerance]
        picks.append(min(near, key=lambda j: (costs[j], -row[j], j)))
    return np.array(picks)


def literal_lambda(p: np.ndarray, costs: np.ndarray, lam: float) -> np.ndarray:
    return np.array([int(np.argmax([row[j] - lam * costs[j] for j in range(len(row))])) for row in p])


def test_each_rule_against_a_literal_computation(fitted) -> None:
    head, x, _, _ = fitted
    sample, traffic = head.predict(x[:1000]), head.predict(x[1000:])
    for tolerance in (0.0, 0.02, 0.1, 1.0):
        expected = literal_tolerance(traffic, COSTS, tolerance)
        np.testing.assert_array_equal(decide(traffic, COSTS, f"tolerance={tolerance}"), expected)
    assert (decide(traffic, COSTS, "tolerance=1") == 2).all()  # everyone within 1: the cheapest
    for lam in (0.0, 0.01, 0.05, 1.0):
        np.testing.assert_array_equal(decide(traffic, COSTS, f"lambda={lam}"), literal_lambda(traffic, COSTS, lam))

    calibration = tradeoff_calibration(sample, COSTS, AGENTS)
    # budget=X: RouteLLM's calibrate_threshold on the sample: the (1 - X) quantile of the agent's margin
    for share, agent in ((0.3, "strong"), (0.1, "mid"), (0.5, "strong")):
        a = AGENTS.index(agent)
        margin = sample[:, a] - np.delete(sample, a, axis=1).max(axis=1)
        mu = max(0.0, float(np.quantile(margin, 1 - share)))
        penalised = traffic.copy()
        penalised[:, a] -= mu
        expected = penalised.argmax(axis=1)
        got = decide(traffic, COSTS, f"budget={share}@{agent}", calibration, AGENTS)
        np.testing.assert_array_equal(got, expected)
        on_sample = decide(sample, COSTS, f"budget={share}@{agent}", calibration, AGENTS)
        assert (on_sample == a).mean() <= share + 1 / len(sample)
    # the default budget agent is the most expensive
    np.testing.assert_array_equal(
        decide(traffic, COSTS, "budget=0.3", calibration, AGENTS),
        decide(traffic, COSTS, "budget=0.3@strong", calibration, AGENTS),
    )
    # usd-per-1k=Y: the smallest lambda of the grid whose cost on the sample is at most Y
    for budget in (1.0, 2.5, 4.0):
        spend = [COSTS[literal_lambda(sample, COSTS, lam)].mean() for lam in calibration["lambdas"]]
        lam = next(lam for lam, cost in zip(calibration["lambdas"], spend, strict=True) if cost <= budget)
        got = decide(traffic, COSTS, f"usd-per-1k={budget}", calibration, AGENTS)
        np.testing.assert_array_equal(got, literal_lambda(traffic, COSTS, lam))
        assert COSTS[decide(sample, COSTS, f"usd-per-1k={budget}", calibration, AGENTS)].mean() <= budget


def test_torch_in_torch_out_and_bad_spellings(fitted) -> None:
    head, x, _, _ = fitted
    p = head.predict(x[1000:])
    picks = decide(torch.from_numpy(p), torch.from_numpy(COSTS), "lambda=0.05")
    assert isinstance(picks, torch.Tensor)
    np.testing.assert_array_equal(picks.numpy(), literal_lambda(p, COSTS, 0.05))
    for bad in ("budget=1.5", "tolerance=-0.1", "lambda=abc", "speed=1", "budget=0.3@nobody", "", "lambda=inf"):
        with pytest.raises(ValueError, match="tolerance=T") as info:
            decide(p, COSTS, bad, agents=AGENTS)
        assert "\n" not in str(info.value)
