"""tradeoffs.py: a probability head's decision rules on arrays, each rule checked against a literal numpy
computation written here from docs/tradeoff.md, and the budget rules' calibration."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_training_probability import AGENTS, COSTS, synthetic

from benchgen_router.tradeoffs import decide, tradeoff_calibration
from benchgen_router.training.probability import ProbabilityHead, fit_probability_head


@pytest.fixture(scope="module")
def fitted() -> tuple[ProbabilityHead, np.ndarray]:
    """A head fitted on 1,000 synthetic rows, and 1,500 rows to decide on."""
    x, y, _ = synthetic(1500)
    return fit_probability_head(x[:1000], y[:1000], seed=0), x


def literal_tolerance(p: np.ndarray, costs: np.ndarray, tolerance: float) -> np.ndarray:
    picks = []
    for row in p:
        near = [j for j in range(len(row)) if row[j] >= row.max() - tolerance]
        picks.append(min(near, key=lambda j: (costs[j], -row[j], j)))
    return np.array(picks)


def literal_lambda(p: np.ndarray, costs: np.ndarray, lam: float) -> np.ndarray:
    return np.array([int(np.argmax([row[j] - lam * costs[j] for j in range(len(row))])) for row in p])


def test_each_rule_against_a_literal_computation(fitted) -> None:
    head, x = fitted
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
    head, x = fitted
    p = head.predict(x[1000:])
    picks = decide(torch.from_numpy(p), torch.from_numpy(COSTS), "lambda=0.05")
    assert isinstance(picks, torch.Tensor)
    np.testing.assert_array_equal(picks.numpy(), literal_lambda(p, COSTS, 0.05))
    for bad in ("budget=1.5", "tolerance=-0.1", "lambda=abc", "speed=1", "budget=0.3@nobody", "", "lambda=inf"):
        with pytest.raises(ValueError, match="tolerance=T") as info:
            decide(p, COSTS, bad, agents=AGENTS)
        assert "\n" not in str(info.value)


def test_a_budget_over_many_agents_with_close_prices_is_met_closely() -> None:
    """29 agents priced 0.02 to 0.6, two of them 1e-5 apart: the lambda grid spans both scales, so a
    `usd-per-1k` budget between the cheapest and the dearest agent is spent closely and never exceeded on the
    calibration sample. (A grid from 1e-5 of its top began at lambda 2, where a price gap of 0.1 already
    outweighs every probability gap, and sent every budget to the cheapest agents.)"""
    rng = np.random.default_rng(3)
    costs = np.sort(rng.uniform(0.02, 0.6, 29))
    costs[5] = costs[4] + 1e-5
    quality = np.linspace(0.2, 0.75, 29)  # dearer agents are better on average
    probabilities = np.clip(quality + rng.normal(0, 0.05, (4000, 29)), 0, 1)
    agents = [f"agent{j}" for j in range(29)]
    calibration = tradeoff_calibration(probabilities, costs, agents)
    top = costs[decide(probabilities, costs, "lambda=0")].mean()
    for budget in np.linspace(costs.min() * 1.5, top * 0.9, 12).tolist():
        spent = costs[decide(probabilities, costs, f"usd-per-1k={budget!r}", calibration, agents)].mean()
        assert 0.9 * budget <= spent <= budget
