"""The `layers` router: the probability head over a combination of the frozen backbone's per-layer masked
means (embeddings.embed_layer_means), not only the last layer's, at no training cost beyond the head.

Which combination is chosen per fold on its training rows only, from four fixed ones (REPRESENTATIONS):
- `last`: the last layer's mean (the plain probability head's embedding);
- `mean`: the mean of the transformer layers' means (layers 1..L);
- `middle+last`: layer L // 2's mean beside the last one's;
- `all`: every hidden state's mean side by side (the input embeddings' and each layer's).
Each is fitted (the probability head, its own L2 strength by inner cross-validation) on a seeded two
thirds of the training rows and scored on the other third by log loss summed over agents; the lowest
(the simpler on ties, in the order above) is refitted on every training row.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from benchgen_router.bench.value.features import LAYER_MEANS, feature_of, widened_head
from benchgen_router.bench.value.routers import Fitted, Fold

logger = logging.getLogger("benchgen_router")

REPRESENTATIONS = ("last", "mean", "middle+last", "all")
SELECTION_HOLDOUT = 3  # one row in this many scores the representations


def representation(means: np.ndarray, name: str) -> np.ndarray:
    """(rows, features) of the named combination of `means` (rows, layers + 1, D)."""
    layers = means.shape[1] - 1
    if name == "last":
        return means[:, -1]
    if name == "mean":
        return means[:, 1:].mean(axis=1)
    if name == "middle+last":
        return np.hstack([means[:, layers // 2], means[:, -1]])
    if name == "all":
        return means.reshape(len(means), -1)
    raise ValueError(f"unknown representation {name!r}; choose from {', '.join(REPRESENTATIONS)}.")


def selection_losses(means: np.ndarray, rewards: np.ndarray, seed: int) -> dict[str, float]:
    """Each representation's held-out log loss (summed over agents, mean over rows) on a seeded third of
    the rows, its head fitted on the other two thirds."""
    from benchgen_router.training.probability import fit_probability_head

    held = np.random.default_rng(seed).permutation(len(means)) % SELECTION_HOLDOUT == 0
    losses = {}
    for name in REPRESENTATIONS:
        inputs = representation(means, name)
        head = fit_probability_head(inputs[~held], rewards[~held], seed=seed)
        p = np.clip(head.predict(inputs[held]), 1e-7, 1 - 1e-7)
        y = rewards[held]
        losses[name] = float(-(y * np.log(p) + (1 - y) * np.log(1 - p)).sum(axis=1).mean())
    return losses


def fit_layers(train: Fold, test: Fold, settings: dict[str, Any]) -> Fitted:
    """The probability head over the representation the training rows choose (module docstring)."""
    train_means, test_means = feature_of(train, LAYER_MEANS, "layers"), feature_of(test, LAYER_MEANS, "layers")
    losses = selection_losses(train_means, train.rewards, settings["seed"])
    chosen = min(REPRESENTATIONS, key=lambda name: losses[name])  # min keeps the first of equals
    scored = ", ".join(f"{name} {loss:.4f}" for name, loss in losses.items())
    logger.info("layers: %s chosen on the training rows (held-out log loss: %s)", chosen, scored)
    return widened_head(
        representation(train_means, chosen),
        representation(test_means, chosen),
        train,
        settings,
        representation=chosen,
        selection_losses=losses,
    )
