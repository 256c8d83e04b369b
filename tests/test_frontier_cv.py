"""frontier.cv and frontier.grid: the grid's searches run in lockstep give exactly the heads of the
searches run one trade-off at a time, in the CV, in the heads trained over a grid, and with the
small-data remedies (seed ensembles, shrinkage)."""

from __future__ import annotations

import numpy as np
import pytest

from benchgen_router import frontier as fr
from benchgen_router.costs import CostData
from benchgen_router.frontier.grid import run_searches

FAST = {"generations": 10, "seed": 3}
GRID = [fr.Tradeoff(0.0, 0.0), fr.Tradeoff(1.0, 0.0), fr.Tradeoff(0.0, 0.01), fr.Tradeoff(2.0, 0.005)]


def noisy(rows: int = 60, dim: int = 5, seed: int = 0) -> tuple[np.ndarray, CostData]:
    """Three agents with random 0/1 rewards, costs and latencies: no head is obvious, so the searches
    wander and any difference between two ways of running them would show."""
    rng = np.random.default_rng(seed)
    rewards = (rng.random((rows, 3)) < [0.5, 0.6, 0.7]).astype(float)
    cost = rng.uniform(1e-5, 3e-4, size=(rows, 3))
    latency = rng.uniform(0.5, 12.0, size=(rows, 3))
    data = CostData(["a", "b", "c"], [f"t{i}" for i in range(rows)], rewards, cost, latency, np.ones((rows, 3), int))
    return rng.normal(size=(rows, dim)), data


@pytest.mark.parametrize("options", [FAST, {**FAST, "ensemble_seeds": [1, 2]}, {**FAST, "shrink": 0.3}])
def test_searches_of_a_grid_together_are_each_the_search_alone(options):
    embeddings, data = noisy()
    utilities = [tradeoff.utility(data) for tradeoff in GRID]
    together = run_searches(embeddings, utilities, options)
    for utility, (theta, runs) in zip(utilities, together, strict=True):
        alone_theta, alone_runs = fr.run_search(embeddings, utility, options)
        assert np.array_equal(theta, alone_theta)
        assert [run.history for run in runs] == [run.history for run in alone_runs]


def test_the_cv_with_the_grid_in_lockstep_routes_as_one_search_per_trade_off():
    embeddings, data = noisy(rows=48)
    one_at_a_time, _ = fr.make_searcher(FAST)  # a searcher of one trade-off at a time, as callers may pass
    kwargs = {"folds": 3, "repeats": 2, "search_kwargs": FAST, "knn_ks": ()}
    lockstep = fr.cross_validate_frontier(embeddings, data, GRID, **kwargs)
    separate = fr.cross_validate_frontier(embeddings, data, GRID, searcher=one_at_a_time, **kwargs)
    for tradeoff in GRID:
        name = f"router {tradeoff.name}"
        assert np.array_equal(lockstep.choices[name], separate.choices[name])
    assert len({lockstep.point(f"router {t.name}").reward for t in GRID}) > 1  # the points differ


def test_heads_over_a_grid_are_the_single_searches():
    embeddings, data = noisy(rows=40)
    heads = fr.train_heads_over_grid(embeddings, data, GRID, FAST)
    for tradeoff, head in zip(GRID, heads, strict=True):
        assert head.name == tradeoff.name
        assert np.array_equal(head.theta, fr.run_search(embeddings, tradeoff.utility(data), FAST)[0])


def test_knn_points_are_each_trade_offs_own_vote_per_fold():
    """The neighbours are found once per fold for every trade-off: each kNN point still routes as
    knn_picks on that fold's rows and that trade-off's utility."""
    embeddings, data = noisy(rows=45)
    result = fr.cross_validate_frontier(
        embeddings, data, GRID, folds=3, repeats=2, seed=4, search_kwargs=FAST, knn_ks=(1, 4)
    )
    assignment = fr.fold_assignments(45, 3, 2, seed=4)
    for k in (1, 4):
        for tradeoff in GRID:
            expected = np.zeros((2, 45), dtype=int)
            utility = tradeoff.utility(data)
            for repeat in range(2):
                for fold in range(3):
                    test = assignment[repeat] == fold
                    expected[repeat, test] = fr.knn_picks(embeddings[~test], utility[~test], embeddings[test], k)
            assert np.array_equal(result.choices[f"knn{k} {tradeoff.name}"], np.eye(3)[expected])
