"""benchgen_router.frontier.gap: RouteLLM's threshold sweep, APGR and CPT recomputed literally as
routellm/evals/benchmarks.py and evaluate.py compute them (pandas.qcut, np.interp, trapz, in percent)
on a hand-made table, and the pool generalisation reducing to them on two agents."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd
import pytest

from benchgen_router.errors import InputError
from benchgen_router.frontier import gap as gp

# 20 queries: the router's strong-win score, and whether each model answered correctly.
SCORES = np.array(
    [
        0.91,
        0.15,
        0.62,
        0.33,
        0.77,
        0.05,
        0.48,
        0.86,
        0.21,
        0.54,
        0.69,
        0.12,
        0.40,
        0.97,
        0.28,
        0.58,
        0.81,
        0.09,
        0.36,
        0.73,
    ]
)
STRONG = np.array([1, 1, 1, 0, 1, 1, 1, 1, 1, 0, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1], dtype=float)
WEAK = np.array([0, 1, 1, 0, 0, 1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 0, 0, 1, 1, 1], dtype=float)


def routellm_literal(scores, strong, weak, num_results=10):
    """routellm/evals at lm-sys/RouteLLM 0b64fdaf, written out: MMLU.evaluate's sweep, then
    generate_results' pct_call_metric and apgr_metric (np.trapz is np.trapezoid in numpy 2)."""
    data = pd.DataFrame({"strong": strong.astype(bool), "weak": weak.astype(bool), "strong_win_rates": scores})
    _, thresholds = pd.qcut(scores, num_results, retbins=True)
    rows = []
    for i, threshold in enumerate(thresholds):
        selection = (
            data["strong_win_rates"] >= threshold if i != len(thresholds) - 1 else data["strong_win_rates"] > threshold
        )
        results = np.where(selection, data["strong"], data["weak"])
        models = np.where(selection, "strong", "weak")
        counts = Counter(models)
        rows.append(
            {"strong_percentage": counts["strong"] / len(results) * 100, "accuracy": sum(results) / len(results) * 100}
        )
    frame = pd.DataFrame(rows).sort_values(by=["strong_percentage"])
    weak_accuracy = len(data[data["weak"] == True]) / len(data) * 100  # noqa: E712 (as RouteLLM writes it)
    strong_accuracy = len(data[data["strong"] == True]) / len(data) * 100  # noqa: E712
    cpts = [
        np.interp(
            pct * (strong_accuracy - weak_accuracy) + weak_accuracy, frame["accuracy"], frame["strong_percentage"]
        )
        for pct in (0.2, 0.5, 0.8)
    ]
    auc = np.trapezoid(frame["accuracy"], frame["strong_percentage"] / 100)
    weak_auc = np.trapezoid(np.full(len(frame), weak_accuracy), frame["strong_percentage"] / 100)
    strong_auc = np.trapezoid(np.full(len(frame), strong_accuracy), frame["strong_percentage"] / 100)
    return frame, cpts, (auc - weak_auc) / (strong_auc - weak_auc)


def routellm_optimal(strong, weak, strong_percent):
    """benchmarks.MMLU.get_optimal_accuracy, written out on arrays."""
    total = len(weak)
    weak_correct = int((weak == 1).sum())
    bonus = min(total * strong_percent, int(((weak == 0) & (strong == 1)).sum()))
    return (weak_correct + bonus) / total * 100


def test_threshold_sweep_apgr_and_cpt_match_routellm_literally():
    frame, cpts, apgr = routellm_literal(SCORES, STRONG, WEAK)
    shares, accuracies = gp.threshold_sweep(SCORES, STRONG, WEAK)
    np.testing.assert_allclose(shares * 100, frame["strong_percentage"].to_numpy())
    np.testing.assert_allclose(accuracies * 100, frame["accuracy"].to_numpy())
    assert shares[0] == 0 and shares[-1] == 1  # the sweep runs from always weak to always strong
    weak, strong = WEAK.mean(), STRONG.mean()
    assert gp.apgr(shares, accuracies, weak, strong) == pytest.approx(apgr, abs=1e-12)
    for fraction, expected in zip((0.2, 0.5, 0.8), cpts, strict=True):
        assert gp.cpt(shares, accuracies, weak, strong, fraction) * 100 == pytest.approx(expected, abs=1e-9)
    # a router that is better than random on this table: the figures can fail
    assert apgr > 0.5


def test_a_router_that_knows_the_answers_and_one_that_is_backwards():
    gain = STRONG - WEAK
    _, _, best = routellm_literal(gain + 0.01 * SCORES, STRONG, WEAK)
    _, _, worst = routellm_literal(-gain + 0.01 * SCORES, STRONG, WEAK)
    shares, accuracies = gp.threshold_sweep(gain + 0.01 * SCORES, STRONG, WEAK)
    assert gp.apgr(shares, accuracies, WEAK.mean(), STRONG.mean()) == pytest.approx(best)
    assert best > 1 > 0 > worst  # routing beats both agents; backwards loses to the weak one


def test_pool_generalisation_reduces_to_routellm_on_two_agents():
    rewards = np.stack([WEAK, STRONG], axis=1)
    cost = np.tile([0.25, 3.0], (len(rewards), 1))  # any two prices: the normalised cost is the strong share
    pool = gp.PoolGap.of(rewards, cost, ["weak", "strong"])
    assert (pool.cheapest, pool.best) == (0, 1)
    thresholds = gp.routellm_thresholds(SCORES)
    picks = [
        (np.greater_equal(SCORES, t) if i != len(thresholds) - 1 else np.greater(SCORES, t)).astype(int)
        for i, t in enumerate(thresholds)
    ]
    curve = pool.curve_of_picks("router", picks, rewards, cost, endpoints=False)
    figures = pool.figures(curve)
    _, cpts, apgr = routellm_literal(SCORES, STRONG, WEAK)
    assert figures.area == pytest.approx(apgr, abs=1e-12)
    assert figures.recover[0.5] * 100 == pytest.approx(cpts[1], abs=1e-9)
    assert figures.recover[0.8] * 100 == pytest.approx(cpts[2], abs=1e-9)
    assert figures.recover_cost[0.5] == pytest.approx(0.25 + cpts[1] / 100 * 2.75)
    # the same from the score sweep with RouteLLM's cost (strong calls)
    two = gp.two_agent_gap(rewards, ["weak", "strong"], strong=1)
    assert two.figures(gp.score_curve("router", SCORES, rewards, 1, 10)).area == pytest.approx(apgr, abs=1e-12)
    # random: the straight line
    random = pool.figures(pool.random())
    assert random.area == pytest.approx(0.5)
    assert random.recover == pytest.approx({0.5: 0.5, 0.8: 0.8})


def test_oracle_is_routellm_optimal_at_every_share():
    rewards = np.stack([WEAK, STRONG], axis=1)
    cost = np.tile([1.0, 5.0], (len(rewards), 1))
    pool = gp.PoolGap.of(rewards, cost, ["weak", "strong"])
    oracle = gp.oracle_curve(pool, rewards, cost)
    for share in np.linspace(0, 1, 41):
        expected = routellm_optimal(STRONG, WEAK, share) / 100
        assert np.interp(share, oracle.cost, oracle.quality) == pytest.approx(expected, abs=1e-12)
        assert gp.oracle_accuracy(STRONG, WEAK, share) == pytest.approx(expected, abs=1e-12)
    # its APGR by the same trapz over a fine share grid
    grid = np.linspace(0, 1, 2001)
    literal = np.array([routellm_optimal(STRONG, WEAK, s) for s in grid]) / 100
    expected_apgr = (np.trapezoid(literal, grid) - WEAK.mean()) / (STRONG.mean() - WEAK.mean())
    assert pool.figures(oracle).area == pytest.approx(expected_apgr, abs=1e-4)


def test_three_agents_window_and_oracle():
    # cheap: right on rows 0-1; mid: right on 0-2 at cost 2; best: right on 0-3 at cost 10
    rewards = np.array([[1, 1, 1], [1, 1, 1], [0, 1, 1], [0, 0, 1]], dtype=float)
    cost = np.tile([1.0, 2.0, 10.0], (4, 1))
    pool = gp.PoolGap.of(rewards, cost, ["cheap", "mid", "best"])
    assert (pool.cheapest, pool.best, pool.gap) == (0, 2, 0.5)
    # always mid: normalised cost 1/9, quality 0.75 (half the gap): its curve with the endpoints
    curve = pool.curve_of_picks("mid", [np.ones(4, dtype=int)], rewards, cost)
    figures = pool.figures(curve)
    np.testing.assert_allclose(curve.cost, [0, 1 / 9, 1])
    assert figures.recover[0.5] == pytest.approx(1 / 9)
    area = (0.5 * (0.5 + 0.75) * (1 / 9) + 0.5 * (0.75 + 1.0) * (8 / 9) - 0.5) / 0.5
    assert figures.area == pytest.approx(area)
    # oracle: row 2 to mid (+1 for +1 cost), row 3 to best (+1 for +9): steps by ratio, then flat
    oracle = gp.oracle_curve(pool, rewards, cost)
    np.testing.assert_allclose(pool.normalise(np.array([1.0, 1.25, 3.5, 10.0])), oracle.cost)
    np.testing.assert_allclose(oracle.quality, [0.5, 0.75, 1.0, 1.0])
    # a curve that runs past the best agent's cost is cut at 1 by interpolation
    past = gp.GapCurve("past", np.array([0.0, 2.0]), np.array([0.5, 1.0]))
    assert pool.figures(past).covered == (0.0, 1.0)
    assert pool.figures(past).area == pytest.approx(0.25)


def test_bad_tables_are_refused_in_one_line():
    with pytest.raises(InputError, match="no cost range"):
        gp.PoolGap.of(np.array([[0.0, 1.0]]), np.array([[1.0, 1.0]]), ["a", "b"])
    with pytest.raises(InputError, match="no quality gap"):
        gp.PoolGap.of(np.array([[1.0, 0.0]]), np.array([[1.0, 2.0]]), ["a", "b"])
    with pytest.raises(InputError, match="finite"):
        gp.routellm_thresholds(np.array([0.1, np.nan]))
