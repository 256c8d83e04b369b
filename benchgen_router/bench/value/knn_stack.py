"""The `knn-stack` router: the probability head over the embedding and, per agent, what the query's k nearest
training queries (cosine, as the `knn` router) say of that agent: a stacking of kNN under the head, as
`train --neighbour-outcomes K` trains it (training/neighbours.py says how the feature is computed).
"""

from __future__ import annotations

from typing import Any

from benchgen_router.bench.value.features import widened_head
from benchgen_router.bench.value.routers import Fitted, Fold
from benchgen_router.training.neighbours import with_neighbour_outcomes


def fit_knn_stack(train: Fold, test: Fold, settings: dict[str, Any]) -> Fitted:
    """The probability head over [embedding, neighbours' log-odds per agent]."""
    train_inputs, test_inputs = with_neighbour_outcomes(
        train.embeddings, train.rewards, test.embeddings, settings["knn_k"]
    )
    return widened_head(train_inputs, test_inputs, train, settings)
