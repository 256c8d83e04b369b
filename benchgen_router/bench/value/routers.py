"""The routers a routing-value benchmark compares, each fitted on one fold's training rows only.

Eight of them predict, per query and agent, the probability that the agent answers correctly, and are then
swept by the probability head's own decision rules (tradeoffs.decide), so that they differ only in what
they predict:
- `probability`: the probability head (training.probability: a logistic regression per agent);
- `mf`: matrix factorisation (training.matrix_factorisation: learned agent vectors against a learned
  projection of the query embedding, as RouteLLM's MF router and EmbedLLM);
- `knn`: the mean correctness of the k most cosine-similar training queries;
- `lookup`: each agent's accuracy on the training queries of the query's group (the per-category table);
  with whole groups held out it has no row of a held-out group to use, and is left out of those folds.

- three probability heads over widened frozen features, each in a module of its own (not run by default:
  `layers` needs its own embedding pass): `layers` (layers.py: a combination of the backbone's per-layer
  means), `stats` (query_stats.py: the query's own statistics) and `knn-stack` (knn_stack.py: the nearest
  training queries' outcomes per agent, stacked);
- `finetuned` (finetuned.py, not run by default: it trains a transformer layer per fold): the probability head
  trained together with the backbone's top layers on the fold's training rows.

The last, `cmaes`, is the release's method: one CMA-ES head per cost weight w, searched on the utility
R - w * C (C in the matrix's cost per 1,000 queries), its points the heads' picks.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PROBABILITY_ROUTERS = ("probability", "mf", "knn", "lookup", "layers", "stats", "knn-stack", "finetuned")
DEFAULT_ROUTERS = ("probability", "cmaes", "knn", "lookup", "mf")
ROUTERS = (*DEFAULT_ROUTERS, "layers", "stats", "knn-stack", "finetuned")
ROUTER_NAMES = {
    "probability": "probability head",
    "cmaes": "CMA-ES heads, cost sweep",
    "knn": "kNN",
    "lookup": "per-category lookup",
    "mf": "matrix factorisation",
    "layers": "probability head + layer means",
    "stats": "probability head + query statistics",
    "knn-stack": "probability head + kNN outcomes",
    "finetuned": "probability head + fine-tuned backbone",
}
# The routers in modules of their own: (module of this package, its fitting function).
FEATURE_ROUTERS = {
    "layers": ("layers", "fit_layers"),
    "stats": ("query_stats", "fit_stats"),
    "knn-stack": ("knn_stack", "fit_knn_stack"),
    "finetuned": ("finetuned", "fit_finetuned"),
}
DEFAULT_KNN_K = 20


@dataclass
class Fold:
    """The rows a router is fitted on (or scored on): embeddings, groups, rewards, cost per 1,000 queries, the
    prompts themselves, and any further per-row features the run computed (`features`, by name)."""

    embeddings: np.ndarray
    groups: Sequence[str | None]
    rewards: np.ndarray
    cost_per_1k: np.ndarray
    prompts: Sequence[str] = ()
    features: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class Fitted:
    """A router's output on the held-out rows: per-agent probabilities (the rules sweep them), or the
    picks of each of its own operating points; `score` is a two-agent router's score for the second agent
    (RouteLLM sweeps a threshold over it); `note` says why a router has nothing on this fold."""

    probabilities: np.ndarray | None = None
    train_probabilities: np.ndarray | None = None  # on the training rows (to calibrate budget rules)
    picks: dict[str, np.ndarray] = field(default_factory=dict)
    scores: dict[str, np.ndarray] = field(default_factory=dict)
    note: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


def fit_and_predict(name: str, train: Fold, test: Fold, settings: dict[str, Any]) -> Fitted:
    """Fit router `name` on `train` and apply it to `test`."""
    if name in FEATURE_ROUTERS:
        module, function = FEATURE_ROUTERS[name]
        return getattr(importlib.import_module(f"{__package__}.{module}"), function)(train, test, settings)
    return {
        "probability": _probability,
        "mf": _matrix_factorisation,
        "knn": _knn,
        "lookup": _lookup,
        "cmaes": _cmaes,
    }[name](train, test, settings)


def _probability(train: Fold, test: Fold, settings: dict[str, Any]) -> Fitted:
    from benchgen_router.training.probability import fit_probability_head

    head = fit_probability_head(train.embeddings, train.rewards, seed=settings["seed"])
    return Fitted(
        probabilities=head.predict(test.embeddings),
        train_probabilities=head.predict(train.embeddings),
        details={"strengths": head.strengths.tolist()},
    )


def _matrix_factorisation(train: Fold, test: Fold, settings: dict[str, Any]) -> Fitted:
    from benchgen_router.training.matrix_factorisation import fit_matrix_factorisation

    router = fit_matrix_factorisation(train.embeddings, train.rewards, seed=settings["seed"])
    return Fitted(probabilities=router.predict(test.embeddings), details={"epochs": router.epochs})


def _knn(train: Fold, test: Fold, settings: dict[str, Any]) -> Fitted:
    from benchgen_router.frontier.cv import nearest_rows

    nearest = nearest_rows(train.embeddings, test.embeddings, settings["knn_k"])
    return Fitted(probabilities=train.rewards[nearest].mean(axis=1))


def _lookup(train: Fold, test: Fold, settings: dict[str, Any]) -> Fitted:
    groups = np.asarray([str(group) for group in train.groups])
    table = {group: train.rewards[groups == group].mean(axis=0) for group in np.unique(groups)}
    unseen = sorted({str(group) for group in test.groups} - set(table))
    if unseen:
        return Fitted(note=f"no training row of {len(unseen)} held-out groups (e.g. {unseen[0]}): nothing to look up")
    return Fitted(probabilities=np.stack([table[str(group)] for group in test.groups]))


def _cmaes(train: Fold, test: Fold, settings: dict[str, Any]) -> Fitted:
    from benchgen_router.frontier.grid import run_searches
    from benchgen_router.head import head_logits

    weights = settings["cost_weights"]
    utilities = [train.rewards - weight * train.cost_per_1k for weight in weights]
    searched = run_searches(train.embeddings, utilities, settings["search"])
    agents = train.rewards.shape[1]
    fitted = Fitted()
    for weight, (theta, _) in zip(weights, searched, strict=True):
        logits = head_logits(theta[None, :], test.embeddings, agents, 0)[0]
        fitted.picks[f"w={weight:g}"] = logits.argmax(axis=1)
        if weight == 0 and agents == 2:  # the reward-only head's margin, swept as RouteLLM sweeps a score
            fitted.scores["cmaes_margin"] = logits[:, 1] - logits[:, 0]
    return fitted
