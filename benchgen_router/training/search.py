"""The search: separable CMA-ES over the head's flat parameter vector, and k-fold cross-validation
(docs/reference.md, "Training"): x0 = zeros, sigma0 0.5, 60 generations, seed 42, fitness = mean reward
of the candidate's picks on the training rows, the best candidate ever seen kept.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchgen_router.errors import InputError
from benchgen_router.evaluation.metrics import evaluate_picks
from benchgen_router.head import check_float32_finite, head_param_count, head_picks, unflatten_theta

CMA_LIBRARIES = ("pycma", "cmaes")
# pycma's diagonal CMA-ES: at the release geometry (10,245 parameters) it reached a higher reward than
# cmaes.SepCMA in less time; the measurements are in search_head's docstring.
DEFAULT_CMA_LIBRARY = "pycma"


def population_picks(thetas: np.ndarray, embeddings: np.ndarray, num_agents: int, hidden_dim: int) -> np.ndarray:
    """Each candidate head's pick per row, (P, n) -> (Q, P): head_logits(...).argmax(-1), transposed,
    with the embedding product as one BLAS matrix product (Q, D) @ (D, P * width). np.einsum without
    `optimize` runs that contraction as a plain C loop, about 15x slower at 11,000 rows x 384
    dimensions x 23 candidates (docs/training.md, "Training time").

    A linear head's pick depends only on the logits' differences to agent 0, so it scores N - 1
    columns per candidate, not N: E @ (w_j - w_0) + (b_j - b_0), and agent j > 0 is picked where
    that difference is the first strict maximum above 0 (np.argmax's first-on-ties rule). The picks
    equal head_logits' except where two agents' logits tie to the last bits of float64."""
    thetas = np.atleast_2d(thetas)
    parts = unflatten_theta(thetas, embeddings.shape[1], num_agents, hidden_dim)
    population, dim = len(thetas), embeddings.shape[1]
    if hidden_dim == 0:
        weight, bias = parts  # (P, D, N), (P, N)
        first_layer, first_bias = weight[..., 1:] - weight[..., :1], bias[:, 1:] - bias[:, :1]
    else:
        first_layer, first_bias = parts[0], parts[1]  # (P, D, H), (P, H)
    width = first_layer.shape[-1]
    stacked = np.ascontiguousarray(first_layer.transpose(1, 0, 2)).reshape(dim, population * width)
    projected = (embeddings @ stacked).reshape(len(embeddings), population, width) + first_bias[None]
    if hidden_dim == 0:
        if num_agents == 2:
            return (projected[..., 0] > 0).astype(np.intp)
        differences = np.concatenate([np.zeros((*projected.shape[:2], 1)), projected], axis=-1)
        return differences.argmax(axis=-1)
    _, _, w2, b2 = parts
    return (np.matmul(np.tanh(projected).transpose(1, 0, 2), w2) + b2[:, None]).argmax(axis=-1).T


def fitness(thetas: np.ndarray, embeddings: np.ndarray, rewards: np.ndarray, hidden_dim: int) -> np.ndarray:
    """Mean reward of each candidate head's picks: thetas (P, n) -> (P,), one vectorised pass."""
    picks = population_picks(thetas, embeddings, rewards.shape[1], hidden_dim)  # (Q, P)
    return picked_rewards(rewards, picks).mean(axis=1)


def picked_rewards(rewards: np.ndarray, picks: np.ndarray) -> np.ndarray:
    """(P, Q) reward of each candidate's pick on each row, from picks (Q, P): rewards[q, picks[q, p]],
    a fresh C-ordered array, so a mean along rows sums in the same order as the single search's."""
    return rewards[np.arange(rewards.shape[0]), np.ascontiguousarray(picks.T)]


class _PycmaDiagonal:
    """pycma's CMA-ES restricted to a diagonal covariance (CMA_diagonal=True: sep-CMA-ES with
    pycma's enlarged diagonal learning rates). Samples come from a private numpy Generator, so the
    search never touches numpy's global random state and seed 0 is as deterministic as any other
    (pycma's own `seed` option treats 0 as "seed from the clock")."""

    library = "pycma"

    def __init__(self, dim: int, sigma0: float, seed: int, popsize: int | None) -> None:
        with warnings.catch_warnings():  # pycma warns on import when matplotlib (plotting only) is absent
            warnings.simplefilter("ignore", UserWarning)
            import cma

        rng = np.random.default_rng(seed)
        options: dict[str, Any] = {
            "CMA_diagonal": True,
            "seed": float("nan"),  # sampling goes through `randn` below instead
            "randn": lambda count, n: rng.standard_normal((count, n)),
            "verbose": -9,
            "verb_log": 0,
            "verb_disp": 0,
        }
        if popsize is not None:
            options["popsize"] = popsize
        self._es = cma.CMAEvolutionStrategy(np.zeros(dim), sigma0, options)
        self.popsize = int(self._es.popsize)

    def ask(self) -> np.ndarray:
        return np.asarray(self._es.ask(), dtype=np.float64)

    def tell(self, candidates: np.ndarray, losses: np.ndarray) -> None:
        self._es.tell(list(candidates), losses.tolist())


class _CmaesSep:
    """cmaes.SepCMA (Ros & Hansen's sep-CMA-ES learning rates), seeded through its own RandomState."""

    library = "cmaes"

    def __init__(self, dim: int, sigma0: float, seed: int, popsize: int | None) -> None:
        from cmaes import SepCMA

        self._es = SepCMA(mean=np.zeros(dim), sigma=sigma0, seed=seed, population_size=popsize)
        self.popsize = int(self._es.population_size)

    def ask(self) -> np.ndarray:
        return np.stack([self._es.ask() for _ in range(self.popsize)])

    def tell(self, candidates: np.ndarray, losses: np.ndarray) -> None:
        self._es.tell([(x, float(loss)) for x, loss in zip(candidates, losses, strict=True)])


MIN_POPSIZE = 4  # pycma stops with "unused injected direction/solutions" at 2; 4 is its own floor (4 + 3 ln n)
MAX_SEED = 2**32 - 1  # both libraries seed numpy generators, which take 0 .. 2**32 - 1


def check_search_settings(sigma0: float, generations: int, seed: int, popsize: int | None, library: str) -> None:
    """Search settings the CMA-ES libraries accept, checked before any work (one line each)."""
    if library not in CMA_LIBRARIES:
        raise InputError(f"unknown CMA-ES library '{library}'; use one of {', '.join(CMA_LIBRARIES)}.")
    if not (isinstance(sigma0, int | float) and math.isfinite(sigma0) and 0 < sigma0 <= 1e6):
        raise InputError(f"sigma0 must be a positive step size no larger than 1e6, got {sigma0!r}.")
    if not isinstance(generations, int) or generations < 1:
        raise InputError(f"generations must be at least 1, got {generations!r}.")
    if not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise InputError(f"seed must be an integer from 0 to {MAX_SEED}, got {seed!r}.")
    if popsize is not None and (not isinstance(popsize, int) or popsize < MIN_POPSIZE):
        raise InputError(f"popsize must be at least {MIN_POPSIZE} candidates per generation, got {popsize!r}.")


@dataclass
class SearchResult:
    theta: np.ndarray
    train_reward: float
    history: list[dict[str, Any]]
    library: str
    popsize: int
    generations_run: int
    seconds: float


def search_head(
    embeddings: np.ndarray,
    rewards: np.ndarray,
    hidden_dim: int = 0,
    sigma0: float = 0.5,
    generations: int = 60,
    seed: int = 42,
    popsize: int | None = None,
    library: str = DEFAULT_CMA_LIBRARY,
    progress: bool = False,
) -> SearchResult:
    """Separable CMA-ES over the flat head vector (docs/reference.md, "Training"): x0 = zeros,
    fitness = mean training reward of the candidate's picks, each generation scored in one
    vectorised pass, the best candidate ever seen returned. Deterministic for a fixed seed.
    Diagonal because a full covariance of a 10,245-parameter head is a 10,245^2 matrix; pycma is the
    default and cmaes.SepCMA the alternative (`library`), compared in docs/benchmark.md."""
    return search_heads(embeddings, [rewards], [seed], hidden_dim, sigma0, generations, popsize, library, progress)[0]


def search_heads(
    embeddings: np.ndarray,
    targets: Sequence[np.ndarray],
    seeds: Sequence[int],
    hidden_dim: int = 0,
    sigma0: float = 0.5,
    generations: int = 60,
    popsize: int | None = None,
    library: str = DEFAULT_CMA_LIBRARY,
    progress: bool = False,
) -> list[SearchResult]:
    """Independent searches over the same embeddings, one per (target matrix, seed), run in lockstep:
    each generation, every search's candidates are scored through one product with the embeddings
    (reading the 11,000 x 384 matrix once instead of once per search), then each search is told its
    own scores. Every search has its own strategy and random generator, so each result is exactly
    search_head(embeddings, target, seed=seed)'s. A result's `seconds` is its share of the wall time."""
    from tqdm.auto import tqdm

    if len(targets) != len(seeds) or not targets:
        raise ValueError(f"search_heads needs one seed per target matrix, got {len(targets)} and {len(seeds)}")
    for seed in seeds:
        check_search_settings(sigma0, generations, seed, popsize, library)
    agents = targets[0].shape[1]
    dim = head_param_count(embeddings.shape[1], agents, hidden_dim)
    make = _PycmaDiagonal if library == "pycma" else _CmaesSep
    strategies = [make(dim, sigma0, seed, popsize) for seed in seeds]
    best = [(np.zeros(dim), -math.inf) for _ in strategies]
    histories: list[list[dict[str, Any]]] = [[] for _ in strategies]
    started = time.perf_counter()
    desc = f"CMA-ES ({library})" + (f", {len(strategies)} searches" if len(strategies) > 1 else "")
    with tqdm(range(generations), desc=desc, unit="gen", disable=not progress) as bar:
        for generation in bar:
            populations = [strategy.ask() for strategy in strategies]
            picks = population_picks(np.concatenate(populations), embeddings, agents, hidden_dim)
            offset = 0
            for index, (strategy, candidates, target) in enumerate(zip(strategies, populations, targets, strict=True)):
                scores = picked_rewards(target, picks[:, offset : offset + len(candidates)]).mean(axis=1)
                offset += len(candidates)
                strategy.tell(candidates, -scores)
                top = int(np.argmax(scores))
                if scores[top] > best[index][1]:
                    best[index] = (candidates[top].copy(), float(scores[top]))
                histories[index].append(
                    {
                        "generation": generation,
                        "best_reward": best[index][1],
                        "generation_best": float(scores[top]),
                        "generation_mean": float(scores.mean()),
                    }
                )
            bar.set_postfix(best=f"{max(reward for _, reward in best):.4f}")
    seconds = (time.perf_counter() - started) / len(strategies)
    results = []
    for (theta, reward), history, strategy in zip(best, histories, strategies, strict=True):
        check_float32_finite(theta, f"the head found with sigma0={sigma0}")
        results.append(SearchResult(theta, reward, history, library, strategy.popsize, generations, seconds))
    return results


def cross_validate(
    embeddings: np.ndarray,
    rewards: np.ndarray,
    agents: Sequence[str],
    folds: int,
    seed: int,
    hidden_dim: int,
    search: Callable[[np.ndarray, np.ndarray], SearchResult],
    progress: bool = False,
) -> dict[str, Any]:
    """k-fold estimate over all labelled rows: train on k-1 folds with the same search settings,
    evaluate on the held-out fold, and report mean and standard deviation (ddof=1) over folds.

    The baselines of each fold are computed on that fold's rows, as for the held-out table, so the
    router and the baselines are always compared on the same rows. Folds are a seeded shuffle.
    """
    from tqdm.auto import tqdm

    rows = len(rewards)
    folds = min(folds, rows)
    assignment = np.empty(rows, dtype=int)
    assignment[np.random.default_rng(seed).permutation(rows)] = np.arange(rows) % folds
    per_fold = []
    for fold in tqdm(range(folds), desc="cross-validation", unit="fold", disable=not progress):
        test = assignment == fold
        result = search(embeddings[~test], rewards[~test])
        picks = head_picks(result.theta, embeddings[test], rewards.shape[1], hidden_dim)
        evaluation = evaluate_picks(picks, rewards[test], agents)
        per_fold.append(
            {
                "fold": fold,
                "rows": int(test.sum()),
                "train_reward": result.train_reward,
                "router": evaluation["router"],
                "best_fixed": evaluation["best_fixed_agent"],
                "random": evaluation["random_agent"],
                "oracle": evaluation["oracle"],
            }
        )
    summary: dict[str, Any] = {"folds": folds, "rows": rows, "seed": seed}
    for key in ("router", "best_fixed", "random", "oracle"):
        values = np.array([fold[key] for fold in per_fold])
        summary[f"{key}_mean"] = float(values.mean())
        summary[f"{key}_std"] = float(values.std(ddof=1)) if folds > 1 else 0.0
    summary["per_fold"] = per_fold
    return summary
