"""A matrix-factorisation router in the manner of RouteLLM's MF router and EmbedLLM: each agent is a learned
vector, each query a learned projection of its embedding, and their element-wise product, through one
linear layer, is the logit that the agent answers the query correctly.

    router = fit_matrix_factorisation(embeddings, correct, seed=0)  # (n, D) float32, (n, N) in [0, 1]
    probabilities = router.predict(embeddings)                     # (n, N)

The model is EmbedLLM's correctness predictor (richardzhuang0412/EmbedLLM, algorithm/mf.py): model
embeddings P (N, d), a projection W (D -> d, with bias), a classifier w (d -> 1, with bias), logit(m, q) =
w . (P_m * W q) + b, trained on every (query, agent) cell with binary cross-entropy (EmbedLLM's two-class
cross-entropy is the same loss), Gaussian noise of scale NOISE on the query embedding while training, and
Adam with weight decay 1e-5, as both RouteLLM and EmbedLLM train. A step takes about BATCH_CELLS cells, as
EmbedLLM's, but whole queries with every agent's cell, so that each query is projected once per step
(and its noise drawn once). Query embeddings are scaled to unit
length first (EmbedLLM's sentence embeddings are; the router's masked mean is not), so the noise has the
scale it has there. Rather than a fixed number of epochs, training stops when the log loss on a held-back
share of the training queries has not improved for PATIENCE epochs, and keeps the best epoch's weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from benchgen_router.errors import InputError
from benchgen_router.hardware import one_thread

DIM = 128  # RouteLLM's MF dimension
NOISE = 0.05  # EmbedLLM's alpha, on unit-length query embeddings
LEARNING_RATE = 1e-3
WEIGHT_DECAY = 1e-5  # RouteLLM's and EmbedLLM's
BATCH_CELLS = 2048  # (query, agent) cells per step, EmbedLLM's batch
MAX_EPOCHS = 60
PATIENCE = 5
VALIDATION_SHARE = 0.1


@dataclass
class MatrixFactorisationRouter:
    """The fitted weights (float32): agents (N, d), projection (d, D) and its bias (d,), classifier (d,)
    and its bias; `epochs` trained and the best epoch's held-back log loss."""

    agents: np.ndarray
    projection: np.ndarray
    projection_bias: np.ndarray
    classifier: np.ndarray
    classifier_bias: float
    epochs: int
    validation_loss: float

    def logits(self, embeddings: np.ndarray) -> np.ndarray:
        """(n, N) logits that each agent answers each query correctly."""
        queries = _unit(embeddings) @ self.projection.T.astype(np.float64) + self.projection_bias
        return (queries[:, None, :] * self.agents[None, :, :]) @ self.classifier + self.classifier_bias

    def predict(self, embeddings: np.ndarray) -> np.ndarray:
        """(n, N) probability that each agent answers each query correctly."""
        return 1.0 / (1.0 + np.exp(-self.logits(embeddings)))


def _unit(embeddings: np.ndarray) -> np.ndarray:
    x = np.asarray(embeddings, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def fit_matrix_factorisation(
    embeddings: np.ndarray, correct: np.ndarray, seed: int = 0, dim: int = DIM, max_epochs: int = MAX_EPOCHS
) -> MatrixFactorisationRouter:
    """Fit the router on (n, D) embeddings and (n, N) rewards in [0, 1] (soft labels), deterministic for a
    seed (one thread, a seeded generator for the initial weights, the batches and the noise)."""
    import torch

    x, y = np.asarray(embeddings), np.asarray(correct, dtype=np.float64)
    if x.ndim != 2 or y.ndim != 2 or len(x) != len(y) or len(x) < 10:
        raise InputError("matrix factorisation needs (n, D) embeddings and (n, agents) rewards for n >= 10 rows.")
    if not np.isfinite(y).all() or (y < 0).any() or (y > 1).any():
        raise InputError("matrix factorisation needs rewards in [0, 1].")
    rng = np.random.default_rng(seed)
    held = np.zeros(len(x), dtype=bool)
    held[rng.permutation(len(x))[: max(1, round(VALIDATION_SHARE * len(x)))]] = True
    with one_thread():
        return _train(_unit(x), y, held, dim, max_epochs, torch.Generator().manual_seed(seed))


def _train(
    x: np.ndarray, y: np.ndarray, held: np.ndarray, dim: int, max_epochs: int, generator: Any
) -> MatrixFactorisationRouter:
    """Adam on the training rows' cells, early-stopped on the held-back rows' log loss (best epoch kept)."""
    import torch
    from torch import nn

    agents = y.shape[1]
    queries = torch.from_numpy(x).float()
    targets = torch.from_numpy(y).float()
    agent_vectors = nn.Parameter(torch.randn(agents, dim, generator=generator))  # nn.Embedding's N(0, 1)
    projection = nn.Linear(x.shape[1], dim)
    classifier = nn.Linear(dim, 1)
    for layer in (projection, classifier):  # nn.Linear's own initialisation, drawn from the seeded generator
        bound = 1 / np.sqrt(layer.in_features)
        with torch.no_grad():
            layer.weight.uniform_(-bound, bound, generator=generator)
            layer.bias.uniform_(-bound, bound, generator=generator)
    parameters = [agent_vectors, *projection.parameters(), *classifier.parameters()]
    optimiser = torch.optim.Adam(parameters, lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY)

    def logits(rows: torch.Tensor, noisy: bool) -> torch.Tensor:
        """(rows, agents) logits: each query projected once, against every agent's vector."""
        q = queries[rows]
        if noisy:
            q = q + NOISE * torch.randn(q.shape, generator=generator)
        return classifier(projection(q)[:, None, :] * agent_vectors[None, :, :]).squeeze(-1)

    train_rows = torch.from_numpy(np.flatnonzero(~held))
    held_rows = torch.from_numpy(np.flatnonzero(held))
    per_batch = max(1, BATCH_CELLS // agents)  # queries per step: about BATCH_CELLS cells
    best = (np.inf, 0, [p.detach().clone() for p in parameters])
    epoch = 0
    for epoch in range(1, max_epochs + 1):
        order = train_rows[torch.randperm(len(train_rows), generator=generator)]
        for start in range(0, len(order), per_batch):
            batch = order[start : start + per_batch]
            loss = nn.functional.binary_cross_entropy_with_logits(logits(batch, noisy=True), targets[batch])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
        with torch.no_grad():
            held_loss = float(
                nn.functional.binary_cross_entropy_with_logits(logits(held_rows, noisy=False), targets[held_rows])
            )
        if held_loss < best[0]:
            best = (held_loss, epoch, [p.detach().clone() for p in parameters])
        elif epoch - best[1] >= PATIENCE:
            break
    loss, _, (vectors, weight, bias, class_weight, class_bias) = best
    return MatrixFactorisationRouter(
        agents=vectors.numpy().astype(np.float64),
        projection=weight.numpy(),
        projection_bias=bias.numpy().astype(np.float64),
        classifier=class_weight.numpy().astype(np.float64).ravel(),
        classifier_bias=float(class_bias),
        epochs=epoch,
        validation_loss=loss,
    )
