"""bench/value/layers.py: the combinations of per-layer means, the choice made on the training rows, and the
`layers` router beating the plain probability head where an earlier layer holds what the last one lost."""

from __future__ import annotations

import numpy as np
import pytest

from benchgen_router.bench.value import ValueConfig, run_value_benchmark
from benchgen_router.bench.value.features import LAYER_MEANS
from benchgen_router.bench.value.layers import fit_layers, representation
from benchgen_router.bench.value.routers import Fold
from benchgen_router.errors import InputError
from helpers import mean_apgr, weak_and_strong


def test_each_combination_of_the_layer_means():
    means = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)  # 2 rows, input + 2 layers, D = 2
    assert np.array_equal(representation(means, "last"), means[:, 2])
    assert np.array_equal(representation(means, "mean"), (means[:, 1] + means[:, 2]) / 2)
    assert np.array_equal(representation(means, "middle+last"), np.hstack([means[:, 1], means[:, 2]]))
    assert representation(means, "all").tolist() == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]
    with pytest.raises(ValueError, match="unknown representation"):
        representation(means, "first")


def signal_in_the_input_layer(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(weak agent's chance per row, layer means): only the input embeddings' mean tells the weak agent's
    questions (one group in two); the layers above are noise."""
    rng = np.random.default_rng(seed)
    group = np.arange(rows) % 2
    means = rng.normal(size=(rows, 3, 6)).astype(np.float32)
    means[:, 0, 0] += 2.5 * group
    return np.where(group == 1, 0.95, 0.15), means


def test_the_layers_router_finds_the_layer_that_tells_and_beats_the_plain_head():
    weak, means = signal_in_the_input_layer(300, seed=1)
    matrix = weak_and_strong(weak, seed=2)
    config = ValueConfig(folds=3, repeats=1, group_folds=0, routers=("probability", "layers"), progress=False)
    result = run_value_benchmark(matrix, config, lambda p: means[:, -1], {LAYER_MEANS: means})
    assert mean_apgr(result, "layers") > mean_apgr(result, "probability") + 0.15
    train = Fold(
        means[:200, -1], ["g"] * 200, matrix.rewards[:200], matrix.cost_per_1k[:200], (), {LAYER_MEANS: means[:200]}
    )
    test = Fold(
        means[200:, -1], ["g"] * 100, matrix.rewards[200:], matrix.cost_per_1k[200:], (), {LAYER_MEANS: means[200:]}
    )
    fitted = fit_layers(train, test, {"seed": 0})
    assert fitted.details["representation"] == "all"  # the only one holding the input layer
    losses = fitted.details["selection_losses"]
    assert losses["all"] < losses["last"] and fitted.probabilities.shape == (100, 2)


def test_a_run_without_the_layer_means_is_one_line():
    weak, means = signal_in_the_input_layer(60, seed=3)
    config = ValueConfig(folds=2, repeats=1, group_folds=0, routers=("layers",), progress=False)
    with pytest.raises(InputError, match="router 'layers' reads the per-row feature 'layer_means'"):
        run_value_benchmark(weak_and_strong(weak), config, lambda p: means[:, -1])
