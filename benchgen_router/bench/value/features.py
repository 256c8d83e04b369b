"""Per-row features that some routers read beside the embedding, computed once per run (not per fold), and
the probability head those routers fit over the embedding widened by them.

- `layer_means` (rows, layers + 1, D): every hidden state's masked mean (embeddings.embed_layer_means),
  read by the `layers` router;
- `query_statistics` (rows, S): the query's own statistics (query_stats.query_statistics), read by `stats`.

`knn-stack` needs no precomputed feature: its neighbours' outcomes depend on each fold's training rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from benchgen_router.bench.value.routers import Fitted, Fold
from benchgen_router.errors import InputError

LAYER_MEANS = "layer_means"
QUERY_STATISTICS = "query_statistics"
NEEDS = {"layers": (LAYER_MEANS,), "stats": (QUERY_STATISTICS,)}


def needed_features(routers: Sequence[str]) -> list[str]:
    """The features the chosen routers read, each once, in the routers' order."""
    return list(dict.fromkeys(feature for router in routers for feature in NEEDS.get(router, ())))


def compute_features(routers: Sequence[str], prompts: Sequence[str], config: Any) -> dict[str, np.ndarray]:
    """What the chosen routers read, rows in the prompts' order: `config` a ValueConfig (its backbone, embedding
    cache and progress setting; the layer means are cached as the embeddings are)."""
    from benchgen_router.embeddings import default_cache_dir, embed_layer_means
    from benchgen_router.loading import effective_truncation_length, load_backbone_config, load_backbone_tokenizer
    from benchgen_router.model_code import DEFAULT_TRUNCATION_LENGTH

    features = {}
    for name in needed_features(routers):
        if name == LAYER_MEANS:
            cache = config.cache_dir or default_cache_dir()
            layers = embed_layer_means(prompts, config.backbone, cache_dir=cache, progress=config.progress)
            features[name] = layers.vectors
        elif name == QUERY_STATISTICS:
            from benchgen_router.bench.value.query_stats import query_statistics

            tokenizer = load_backbone_tokenizer(config.backbone)
            limit = effective_truncation_length(load_backbone_config(config.backbone), DEFAULT_TRUNCATION_LENGTH)
            features[name] = query_statistics(prompts, tokenizer, limit)
    return features


def feature_of(fold: Fold, name: str, router: str) -> np.ndarray:
    """A fold's rows of feature `name`, or one line saying that `router` needs it and who computes it."""
    if name not in fold.features:
        raise InputError(
            f"router {router!r} reads the per-row feature {name!r}, which this run was not given; pass "
            f"features=compute_features(routers, prompts, config) to run_value_benchmark (bench value does)."
        )
    return np.asarray(fold.features[name])


def widened_head(
    train_inputs: np.ndarray, test_inputs: np.ndarray, train: Fold, settings: dict[str, Any], **details: Any
) -> Fitted:
    """The probability head (training.probability) fitted on `train_inputs` (the training rows' features,
    the embedding among them), applied to `test_inputs`: swept by the rules as the plain head is."""
    from benchgen_router.training.probability import fit_probability_head

    head = fit_probability_head(train_inputs, train.rewards, seed=settings["seed"])
    return Fitted(
        probabilities=head.predict(test_inputs),
        train_probabilities=head.predict(train_inputs),
        details={"strengths": head.strengths.tolist(), **details},
    )
