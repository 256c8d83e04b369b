"""bench/value/knn_stack.py: neighbours found without the row itself, their outcomes as log-odds, and the
`knn-stack` router beating the plain probability head where the weak agent's questions are not linearly
apart in the embedding (an XOR of two directions)."""

from __future__ import annotations

import numpy as np
import pytest

from benchgen_router.bench.value import ValueConfig, run_value_benchmark
from benchgen_router.bench.value.knn_stack import leave_one_out_neighbours, neighbour_log_odds
from helpers import mean_apgr, weak_and_strong


def test_a_row_is_never_its_own_neighbour_even_among_equals():
    embeddings = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    found = leave_one_out_neighbours(embeddings, 1)
    assert found.shape == (5, 1)
    assert all(found[row, 0] != row for row in range(5))
    assert found[:4, 0].tolist() == [1, 0, 0, 0] and found[4, 0] == 0  # the closest others, lower index first
    assert sorted(leave_one_out_neighbours(embeddings, 3)[1].tolist()) == [0, 2, 3]


def test_neighbours_outcomes_as_smoothed_log_odds():
    rewards = np.array([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    odds = neighbour_log_odds(np.array([[0, 2], [1, 1]]), rewards)
    # (2 + 1) / (2 + 2) = 3/4 -> log 3; (1 + 1) / 4 = 1/2 -> 0; (0 + 1) / 4 -> log(1/3)
    assert odds == pytest.approx(np.array([[np.log(3), 0.0], [np.log(1 / 3), np.log(1 / 3)]]))


def test_stacked_neighbours_beat_the_plain_head_on_an_xor():
    rng = np.random.default_rng(6)
    signs = rng.choice([-1.0, 1.0], size=(400, 2))
    embeddings = np.hstack([signs + rng.normal(0, 0.15, (400, 2)), np.ones((400, 1))]).astype(np.float32)
    matrix = weak_and_strong(np.where(signs[:, 0] == signs[:, 1], 0.95, 0.15), seed=7)
    config = ValueConfig(folds=3, repeats=1, group_folds=0, routers=("probability", "knn-stack"), progress=False)
    result = run_value_benchmark(matrix, config, lambda p: embeddings)
    assert mean_apgr(result, "knn-stack") > mean_apgr(result, "probability") + 0.15
