"""bench/value/metrics.py: a router's figures on a held-out fold, checked on hand-worked points."""

from __future__ import annotations

import numpy as np
import pytest

from benchgen_router.bench.value import metrics


def test_figures_of_a_router_against_the_reference():
    """Reference: cost 4, accuracy 0.8. Router points (1, 0.6), (2, 0.85), (3, 0.8): the hull runs
    (1, 0.6) -> (2, 0.85) and is flat after; it reaches 0.8 at 1 + (0.8 - 0.6) / 0.25 = 1.8, a share of
    1.8 / 4 = 0.45; its best accuracy is 0.85; its AIQ over [0, 4] is (0.725 + 0.85 * 2) / 4 = 0.60625."""
    figures = metrics.figures([(1.0, 0.6), (2.0, 0.85), (3.0, 0.8)], (4.0, 0.8), (0.0, 4.0))
    assert figures.share == pytest.approx(0.45)
    assert figures.best == pytest.approx(0.85)
    assert figures.aiq == pytest.approx(0.60625)
    never = metrics.figures([(1.0, 0.6), (2.0, 0.7)], (4.0, 0.8), (0.0, 4.0))
    assert never.share is None and never.best == pytest.approx(0.7)


def test_points_singles_reference_and_oracle():
    rewards = np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 1.0, 1.0], [0.0, 0.0, 1.0]])
    cost = np.tile([1.0, 10.0, 4.0], (4, 1))
    assert metrics.points_of_picks(np.array([0, 1, 2, 2]), rewards, cost) == (4.75, 1.0)
    assert metrics.single_models(rewards, cost) == [(1.0, 0.25), (10.0, 0.75), (4.0, 0.5)]
    assert metrics.best_single_model(rewards, cost) == 1
    # Ties in accuracy: the cheaper one.
    assert metrics.best_single_model(np.array([[1.0, 1.0]]), np.array([[2.0, 1.0]])) == 1
    oracle = metrics.oracle_points(rewards, cost)
    # Knowing the answers: row 0 by agent 0 (1), rows 2 and 3 by agent 2 (4 each), row 1 by agent 1 (10):
    # every row right at (1 + 10 + 4 + 4) / 4 = 4.75; the cheapest start is agent 0 everywhere (1, 0.25).
    assert oracle[0] == pytest.approx((1.0, 0.25))
    assert max(quality for _, quality in oracle) == pytest.approx(1.0)
    assert min(cost for cost, quality in oracle if quality >= 1.0 - 1e-12) == pytest.approx(4.75)
