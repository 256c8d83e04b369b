"""bench/value/features.py: what each router reads, computed once for a run (the layer means through the
embedding cache, the statistics through the backbone's tokenizer), and the widened head."""

from __future__ import annotations

import numpy as np

from benchgen_router.bench.value import ValueConfig
from benchgen_router.bench.value.features import (
    LAYER_MEANS,
    QUERY_STATISTICS,
    compute_features,
    needed_features,
)
from benchgen_router.bench.value.query_stats import STATISTICS
from helpers import make_queries


def test_each_feature_once_for_the_routers_that_read_it():
    assert needed_features(("probability", "knn-stack", "cmaes")) == []
    assert needed_features(("stats", "layers", "stats")) == [QUERY_STATISTICS, LAYER_MEANS]


def test_features_are_computed_for_the_routers_and_the_layer_means_cached(backbone_dir, tmp_path):
    prompts = make_queries(12, seed=8)
    config = ValueConfig(backbone=str(backbone_dir), cache_dir=tmp_path, progress=False)
    assert compute_features(("probability", "knn"), prompts, config) == {}
    features = compute_features(("layers", "stats"), prompts, config)
    assert features[LAYER_MEANS].shape == (12, 3, 32)  # the tiny backbone: input embeddings and 2 layers of 32
    assert features[QUERY_STATISTICS].shape == (12, len(STATISTICS)) and np.isfinite(features[QUERY_STATISTICS]).all()
    assert len(list(tmp_path.glob("*.npy"))) == 1  # the layer means, cached
    again = compute_features(("layers",), prompts, config)
    assert np.array_equal(again[LAYER_MEANS], features[LAYER_MEANS])
