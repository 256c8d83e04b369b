"""The `knn-stack` router: the probability head over the embedding and, per agent, what the query's k nearest
training queries (cosine, as the `knn` router) say of that agent: a stacking of kNN under the head.

The neighbours' feature is the smoothed log-odds of their mean correctness, log(p / (1 - p)) with
p = (sum of rewards + 1) / (k + 2), so that a linear head can pass it on as a logit. On the training rows it
is computed leave-one-out (each row's neighbours among the other training rows), so the head learns how far
to trust neighbours it has not itself been counted among; a held-out row's neighbours are k training rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from benchgen_router.bench.value.features import widened_head
from benchgen_router.bench.value.routers import Fitted, Fold

CHUNK_ROWS = 1024  # training rows whose neighbours are sought at once: a (chunk, train) similarity block


def neighbour_log_odds(neighbours: np.ndarray, rewards: np.ndarray) -> np.ndarray:
    """(rows, agents) smoothed log-odds of each row's neighbours' (rows, k) rewards (module docstring)."""
    k = neighbours.shape[1]
    p = (rewards[neighbours].sum(axis=1) + 1.0) / (k + 2.0)
    return np.log(p / (1.0 - p))


def leave_one_out_neighbours(embeddings: np.ndarray, k: int) -> np.ndarray:
    """(rows, k) each row's k most cosine-similar other rows (itself left out, not merely its equals)."""
    from benchgen_router.frontier.cv import nearest_rows

    k = min(k, len(embeddings) - 1)
    found = np.zeros((len(embeddings), k), dtype=np.int64)
    for start in range(0, len(embeddings), CHUNK_ROWS):
        rows = np.arange(start, min(start + CHUNK_ROWS, len(embeddings)))
        nearest = nearest_rows(embeddings, embeddings[rows], k + 1)
        drop = nearest == rows[:, None]
        drop[~drop.any(axis=1), -1] = True  # itself ranked below k equals: drop the last instead
        found[rows] = nearest[~drop].reshape(len(rows), k)
    return found


def fit_knn_stack(train: Fold, test: Fold, settings: dict[str, Any]) -> Fitted:
    """The probability head over [embedding, neighbours' log-odds per agent]."""
    from benchgen_router.frontier.cv import nearest_rows

    k = settings["knn_k"]
    train_odds = neighbour_log_odds(leave_one_out_neighbours(train.embeddings, k), train.rewards)
    test_odds = neighbour_log_odds(nearest_rows(train.embeddings, test.embeddings, k), train.rewards)
    return widened_head(
        np.hstack([train.embeddings, train_odds]), np.hstack([test.embeddings, test_odds]), train, settings
    )
