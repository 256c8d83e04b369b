"""The trade-off grid and the search each router point runs: utility weights (Tradeoff), the default
grid, and the search options with their small-data remedies (utility shrinkage, seed ensembles)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchgen_router.costs import MAX_WEIGHT, CostData, utility_matrix
from benchgen_router.errors import InputError
from benchgen_router.training.search import SearchResult, search_heads

# The release trainer's search (separable CMA-ES, sigma0 0.5, 60 generations, seed 42) unless the caller passes others.
DEFAULT_SEARCH: dict[str, Any] = {"hidden_dim": 0, "sigma0": 0.5, "generations": 60, "seed": 42}


# Cost weights in reward per (USD per 1,000 queries), latency weights in reward per second. On the
# pilot pool the agents' costs span 0.01-0.13 USD per 1,000 queries and latencies 3-21 s, so these
# ranges go from "reward only" to "nearly always the cheapest / fastest agent".
DEFAULT_COST_WEIGHTS = (0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0)


DEFAULT_LATENCY_WEIGHTS = (0.001, 0.002, 0.003, 0.005, 0.01, 0.02)


Searcher = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (train embeddings, train utility) -> theta


@dataclass(frozen=True)
class Tradeoff:
    """Weights of the utility U = R - cost_weight * C - latency_weight * L."""

    cost_weight: float = 0.0
    latency_weight: float = 0.0

    def __post_init__(self) -> None:
        utility_matrix(np.zeros((1, 1)), np.zeros((1, 1)), np.zeros((1, 1)), self.cost_weight, self.latency_weight)

    @property
    def name(self) -> str:
        """A short id usable as a head name: lc<cost weight>_ll<latency weight>."""
        return f"lc{self.cost_weight:g}_ll{self.latency_weight:g}"

    def utility(self, data: CostData) -> np.ndarray:
        return data.utility(self.cost_weight, self.latency_weight)


DEFAULT_MIXED_WEIGHTS = ((0.5, 0.002), (0.5, 0.005), (1.0, 0.005))


def default_grid() -> list[Tradeoff]:
    """The cost-only line (including 0, reward only), the latency-only line and a few mixed points."""
    return (
        [Tradeoff(c, 0.0) for c in DEFAULT_COST_WEIGHTS]
        + [Tradeoff(0.0, w) for w in DEFAULT_LATENCY_WEIGHTS]
        + [Tradeoff(c, w) for c, w in DEFAULT_MIXED_WEIGHTS]
    )


def parse_grid(text: str) -> list[Tradeoff]:
    """'0,0.5,1' (cost weights) or '0:0,0.5:0,0:0.01' (cost:latency pairs) -> trade-offs, duplicates removed."""
    grid: list[Tradeoff] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        pieces = item.split(":")
        try:
            if len(pieces) > 2:
                raise ValueError
            weights = [float(piece) for piece in pieces]
        except ValueError:
            raise InputError(
                f"trade-off '{item}' is not a number or a cost:latency pair; write e.g. '0,0.5,1' or '0:0,0:0.01'."
            ) from None
        tradeoff = Tradeoff(weights[0], weights[1] if len(weights) == 2 else 0.0)
        if tradeoff not in grid:
            grid.append(tradeoff)
    if not grid:
        raise InputError("the trade-off grid is empty; pass at least one weight, e.g. '0,0.5,1'.")
    return grid


MAX_POINT_NAME = 64  # config_checks.OPERATING_POINT_NAME: a letter, then up to 63 of [A-Za-z0-9_-]


def operating_point_name_problem(name: str, weights: str = "0.2") -> str:
    """What is wrong with an operating-point name, the characters a name may hold, and a name that
    would do (the rule is the router config's, which every entry point reads point names by)."""
    allowed = "a NAME starts with a letter and has at most 64 letters, digits, '_' or '-'"
    if not name:
        return f"it is empty; {allowed} (e.g. balanced=0.2)"
    others = sorted({c for c in name if not (c.isascii() and (c.isalnum() or c in "_-"))})
    if others:
        problem = f"'{name}' has {', '.join(repr(c) for c in others)}"
    elif not (name[0].isascii() and name[0].isalpha()):
        problem = f"'{name}' does not start with a letter"
    else:
        problem = f"'{name}' is longer than {MAX_POINT_NAME} characters"
    fixed = "".join(c if c.isascii() and (c.isalnum() or c in "_-") else "_" for c in name)
    fixed = (fixed if fixed[0].isascii() and fixed[0].isalpha() else f"p{fixed}")[:MAX_POINT_NAME]
    return f"{problem}; {allowed} (e.g. {fixed}={weights or '0.2'})"


def parse_operating_point(text: str) -> tuple[str, Tradeoff]:
    """'NAME=COST[:LATENCY]' -> (name, its trade-off)."""
    from benchgen_router.config_checks import OPERATING_POINT_NAME

    name, equals, weights = text.partition("=")
    if not equals:
        raise InputError(f"'{text}' is not NAME=COST[:LATENCY] (e.g. balanced=0.2)")
    if not OPERATING_POINT_NAME.match(name):
        problem = operating_point_name_problem(name, weights)
        raise InputError(f"'{text}' is not NAME=COST[:LATENCY] with a valid NAME: {problem}")
    try:
        grid = parse_grid(weights)
    except InputError:
        raise InputError(
            f"'{text}': COST[:LATENCY] must be one number or a cost:latency pair of numbers from 0 to "
            f"{MAX_WEIGHT:g} (e.g. balanced=0.2 or fast=0:0.01)"
        ) from None
    if len(grid) != 1:
        raise InputError(f"'{text}' names more than one trade-off; give one COST[:LATENCY] per point")
    return name, grid[0]


def regularised_utility(utility: np.ndarray, shrink: float) -> np.ndarray:
    """(1 - shrink) * U + shrink * (column means of U), the matrix the search maximises.

    The search's fitness on it is (1 - shrink) * mean U at the picks + shrink * mean over rows of the
    picked agent's average utility: a prior toward the agent that is best on average at this trade-
    off, so a head leaves it only where the per-row gain is large. On 46 rows the unregularised
    search fits noise; the measured effect is in docs/cost-frontier.md. shrink 0 returns U itself.
    """
    if not isinstance(shrink, int | float) or isinstance(shrink, bool) or not 0 <= shrink < 1:
        raise InputError(f"shrink {shrink!r} must be a number in [0, 1) (0: no regularisation).")
    if shrink == 0:
        return utility
    return (1 - shrink) * utility + shrink * utility.mean(axis=0)


def _search_plan(search_kwargs: dict[str, Any] | None) -> tuple[dict[str, Any], float, list[int] | None]:
    """(search_head keywords, shrink, ensemble seeds) of search options, validated before any work."""
    kwargs = {**DEFAULT_SEARCH, **(search_kwargs or {})}
    kwargs.pop("progress", None)
    shrink = kwargs.pop("shrink", 0.0)
    seeds = kwargs.pop("ensemble_seeds", None)
    regularised_utility(np.zeros((1, 1)), shrink)
    if seeds is not None:
        if not isinstance(seeds, list | tuple) or not seeds or not all(isinstance(s, int) for s in seeds):
            raise InputError(f"ensemble_seeds {seeds!r} must be a non-empty list of integers.")
        if kwargs["hidden_dim"] != 0:
            raise InputError("a seed ensemble averages linear heads only; use hidden_dim 0.")
        seeds = list(seeds)
    return kwargs, shrink, seeds


def check_search_options(search_kwargs: dict[str, Any] | None) -> None:
    """InputError (one line) when these search options cannot run: checked before any work."""
    _search_plan(search_kwargs)


def run_search(
    embeddings: np.ndarray, utility: np.ndarray, search_kwargs: dict[str, Any] | None = None, progress: bool = False
) -> tuple[np.ndarray, list[SearchResult]]:
    """(theta, the search runs behind it) for one training set: see make_searcher for the options."""
    return run_searches(embeddings, [utility], search_kwargs, progress)[0]


def run_searches(
    embeddings: np.ndarray,
    utilities: Sequence[np.ndarray],
    search_kwargs: dict[str, Any] | None = None,
    progress: bool = False,
) -> list[tuple[np.ndarray, list[SearchResult]]]:
    """run_search for several utility matrices of the same training rows (a grid's trade-offs), with
    every search, seed ensembles included, run in lockstep (training.search_heads): each result is
    exactly run_search's for that matrix, and the embeddings are read once per generation for all."""
    kwargs, shrink, seeds = _search_plan(search_kwargs)
    seed_list = seeds if seeds is not None else [kwargs["seed"]]
    settings = {key: value for key, value in kwargs.items() if key != "seed"}
    targets = [regularised_utility(utility, shrink) for utility in utilities]
    runs = search_heads(
        embeddings,
        [target for target in targets for _ in seed_list],
        [seed for _ in targets for seed in seed_list],
        **settings,
        progress=progress,
    )
    results = []
    for start in range(0, len(runs), len(seed_list)):
        mine = runs[start : start + len(seed_list)]
        theta = mine[0].theta if seeds is None else np.mean([run.theta for run in mine], axis=0)
        results.append((theta, mine))
    return results


def make_searcher(search_kwargs: dict[str, Any] | None = None) -> tuple[Searcher, int]:
    """The search for one training set, and its hidden_dim.

    `search_kwargs` holds search_head's keywords (defaults: the reference search, DEFAULT_SEARCH) and
    two optional remedies for small data, both off by default so the reference stays reproducible:
    - "shrink": regularised_utility's weight (the search sees the regularised matrix);
    - "ensemble_seeds": a list of seeds; one search per seed, the heads averaged into one (linear
      heads only: their logits are linear in theta, so the averaged theta routes exactly as
      averaging the heads' logits). `seed` is then unused.
    """
    kwargs, _, _ = _search_plan(search_kwargs)  # validated now, before any work

    def search(embeddings: np.ndarray, utility: np.ndarray) -> np.ndarray:
        return run_search(embeddings, utility, search_kwargs)[0]

    return search, int(kwargs["hidden_dim"])


def search_settings(search_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The full settings a searcher runs with (defaults filled in), as plain JSON types."""
    settings = {**DEFAULT_SEARCH, **(search_kwargs or {})}
    settings.pop("progress", None)
    if "ensemble_seeds" in settings:
        settings["ensemble_seeds"] = list(settings["ensemble_seeds"])
    return settings
