"""Neighbour outcomes: what the k training queries nearest a query (cosine) say of each agent, as features a
probability head reads beside the embedding (`train --neighbour-outcomes K`, `bench value`'s `knn-stack`).

The feature is the smoothed log-odds of the neighbours' mean reward, log(p / (1 - p)) with
p = (sum of rewards + 1) / (k + 2), so that a linear head can pass it on as a logit. On the training rows it is
computed leave-one-out (each row's neighbours among the other training rows), so the head learns how far to
trust neighbours it has not itself been counted among; any other query's neighbours are k training rows. A
router computes the same at routing time (NeighbourOutcomes in modeling_router.py) from the training rows'
embeddings and rewards, which its model.safetensors carries.
"""

from __future__ import annotations

import numpy as np

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


def with_neighbour_outcomes(
    train_embeddings: np.ndarray, train_rewards: np.ndarray, other_embeddings: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """([training embedding, its leave-one-out neighbour outcomes], [other embedding, its neighbour outcomes
    among the training rows]): the head's inputs for the training rows and for any other rows."""
    from benchgen_router.frontier.cv import nearest_rows

    train_odds = neighbour_log_odds(leave_one_out_neighbours(train_embeddings, k), train_rewards)
    other_odds = neighbour_log_odds(nearest_rows(train_embeddings, other_embeddings, k), train_rewards)
    return np.hstack([train_embeddings, train_odds]), np.hstack([other_embeddings, other_odds])
