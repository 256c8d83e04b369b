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
from benchgen_router.evaluation import evaluate_picks
from benchgen_router.head import check_float32_finite, head_logits, head_param_count, head_picks

CMA_LIBRARIES = ("pycma", "cmaes")
# pycma's diagonal CMA-ES: at the release geometry (10,245 parameters) it reached a higher reward than
# cmaes.SepCMA in less time; the measurements are in search_head's docstring.
DEFAULT_CMA_LIBRARY = "pycma"


def fitness(thetas: np.ndarray, embeddings: np.ndarray, rewards: np.ndarray, hidden_dim: int) -> np.ndarray:
    """Mean reward of each candidate head's picks: thetas (P, n) -> (P,), one vectorised pass."""
    picks = head_logits(thetas, embeddings, rewards.shape[1], hidden_dim).argmax(axis=-1)  # (P, Q)
    return rewards[np.arange(rewards.shape[0]), picks].mean(axis=1)


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
    from tqdm.auto import tqdm

    check_search_settings(sigma0, generations, seed, popsize, library)
    dim = head_param_count(embeddings.shape[1], rewards.shape[1], hidden_dim)
    strategy = (_PycmaDiagonal if library == "pycma" else _CmaesSep)(dim, sigma0, seed, popsize)
    best_theta, best_reward, history = np.zeros(dim), -math.inf, []
    started = time.perf_counter()
    with tqdm(range(generations), desc=f"CMA-ES ({library})", unit="gen", disable=not progress) as bar:
        for generation in bar:
            candidates = strategy.ask()
            scores = fitness(candidates, embeddings, rewards, hidden_dim)
            strategy.tell(candidates, -scores)
            top = int(np.argmax(scores))
            if scores[top] > best_reward:
                best_theta, best_reward = candidates[top].copy(), float(scores[top])
            history.append(
                {
                    "generation": generation,
                    "best_reward": best_reward,
                    "generation_best": float(scores[top]),
                    "generation_mean": float(scores.mean()),
                }
            )
            bar.set_postfix(best=f"{best_reward:.4f}")
    check_float32_finite(best_theta, f"the head found with sigma0={sigma0}")
    return SearchResult(
        best_theta, best_reward, history, library, strategy.popsize, generations, time.perf_counter() - started
    )


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
