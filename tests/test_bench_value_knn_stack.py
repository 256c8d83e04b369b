"""bench/value/knn_stack.py: the `knn-stack` router beating the plain probability head where the weak agent's
questions are not linearly apart in the embedding (an XOR of two directions)."""

from __future__ import annotations

import numpy as np

from benchgen_router.bench.value import ValueConfig, run_value_benchmark
from helpers import mean_apgr, weak_and_strong


def test_stacked_neighbours_beat_the_plain_head_on_an_xor():
    rng = np.random.default_rng(6)
    signs = rng.choice([-1.0, 1.0], size=(400, 2))
    embeddings = np.hstack([signs + rng.normal(0, 0.15, (400, 2)), np.ones((400, 1))]).astype(np.float32)
    matrix = weak_and_strong(np.where(signs[:, 0] == signs[:, 1], 0.95, 0.15), seed=7)
    config = ValueConfig(folds=3, repeats=1, group_folds=0, routers=("probability", "knn-stack"), progress=False)
    result = run_value_benchmark(matrix, config, lambda p: embeddings)
    assert mean_apgr(result, "knn-stack") > mean_apgr(result, "probability") + 0.15
