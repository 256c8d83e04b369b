"""Quality per dollar and per second: repeated k-fold cross-validation of cost-aware routers over a
grid of trade-off weights, the baselines on the same folds, the non-dominated frontier, an area-
under-frontier summary, plots, and the choice of an operating point by nested cross-validation.

Every router point is the ordinary search (`search_head`) run on the utility matrix
U = R - cost_weight * C - latency_weight * L of the training folds (units in costs.py: C in USD per
1,000 queries, L in seconds); its picks on the held-out fold are scored on the held-out rows' true
reward, cost and latency.

Statistics, defined once here and used by every table:
- Each repeat is one seeded shuffle into k folds, so every row is held out exactly once per repeat.
  `reward` is the mean over repeats of that repeat's mean held-out reward (all rows pooled).
- `reward_std_repeats`: standard deviation (ddof=1) over repeats of the repeat means: how much the
  result moves with the fold assignment (and hence the training sets). A fixed agent has 0 here.
- `reward_std_folds`: standard deviation (ddof=1) over all repeats x folds of the per-fold means:
  the noise of one fold-sized test set.
- `delta_reward` / `delta_se`: the paired difference to the reference policy (the best fixed agent
  on all rows, "always frontier_a" on the pilot): per task, the difference averaged over repeats;
  `delta_se` is the standard error of its mean over tasks (std ddof=1 / sqrt(rows)), the sampling
  error of the task set itself, which is what "equal quality" has to be judged against.
- cost and latency: mean per query over held-out picks, cost in USD per 1,000 queries.
- `share`: fraction of held-out queries sent to each agent.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from benchgen_router.costs import CostData, cheapest_of_best, costs_for_labelled, utility_matrix
from benchgen_router.data import join_rewards, load_rows
from benchgen_router.errors import UsageError
from benchgen_router.files import atomic_output
from benchgen_router.head import head_picks
from benchgen_router.training import SearchResult, search_head

# The release trainer's search (separable CMA-ES, sigma0 0.5, 60 generations, seed 42) unless the caller passes others.
DEFAULT_SEARCH: dict[str, Any] = {"hidden_dim": 0, "sigma0": 0.5, "generations": 60, "seed": 42}
DEFAULT_FOLDS = 5
DEFAULT_REPEATS = 10
DEFAULT_CV_SEED = 0
# Cost weights in reward per (USD per 1,000 queries), latency weights in reward per second. On the
# pilot pool the agents' costs span 0.01-0.13 USD per 1,000 queries and latencies 3-21 s, so these
# ranges go from "reward only" to "nearly always the cheapest / fastest agent".
DEFAULT_COST_WEIGHTS = (0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0)
DEFAULT_LATENCY_WEIGHTS = (0.001, 0.002, 0.003, 0.005, 0.01, 0.02)
DEFAULT_KNN_KS = (1, 3, 5, 10)
_TIE = 1e-12
# The policies a user chooses between when deploying: the frontier is drawn over these. kNN is a
# baseline for the search (compared point by point and by area), and oracles see the answers.
FRONTIER_KINDS = ("router", "fixed", "best_fixed_train", "random")

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
            raise UsageError(
                f"trade-off '{item}' is not a number or a cost:latency pair; write e.g. '0,0.5,1' or '0:0,0:0.01'."
            ) from None
        tradeoff = Tradeoff(weights[0], weights[1] if len(weights) == 2 else 0.0)
        if tradeoff not in grid:
            grid.append(tradeoff)
    if not grid:
        raise UsageError("the trade-off grid is empty; pass at least one weight, e.g. '0,0.5,1'.")
    return grid


def regularised_utility(utility: np.ndarray, shrink: float) -> np.ndarray:
    """(1 - shrink) * U + shrink * (column means of U), the matrix the search maximises.

    The search's fitness on it is (1 - shrink) * mean U at the picks + shrink * mean over rows of the
    picked agent's average utility: a prior toward the agent that is best on average at this trade-
    off, so a head leaves it only where the per-row gain is large. On 46 rows the unregularised
    search fits noise; the measured effect is in docs/cost-frontier.md. shrink 0 returns U itself.
    """
    if not isinstance(shrink, int | float) or isinstance(shrink, bool) or not 0 <= shrink < 1:
        raise UsageError(f"shrink {shrink!r} must be a number in [0, 1) (0: no regularisation).")
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
            raise UsageError(f"ensemble_seeds {seeds!r} must be a non-empty list of integers.")
        if kwargs["hidden_dim"] != 0:
            raise UsageError("a seed ensemble averages linear heads only; use hidden_dim 0.")
        seeds = list(seeds)
    return kwargs, shrink, seeds


def check_search_options(search_kwargs: dict[str, Any] | None) -> None:
    """UsageError (one line) when these search options cannot run: checked before any work."""
    _search_plan(search_kwargs)


def run_search(
    embeddings: np.ndarray, utility: np.ndarray, search_kwargs: dict[str, Any] | None = None, progress: bool = False
) -> tuple[np.ndarray, list[SearchResult]]:
    """(theta, the search runs behind it) for one training set: see make_searcher for the options."""
    kwargs, shrink, seeds = _search_plan(search_kwargs)
    target = regularised_utility(utility, shrink)
    if seeds is None:
        result = search_head(embeddings, target, **kwargs, progress=progress)
        return result.theta, [result]
    runs = [search_head(embeddings, target, **{**kwargs, "seed": seed}, progress=progress) for seed in seeds]
    return np.mean([run.theta for run in runs], axis=0), runs


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


# ---------------------------------------------------------------------------------------------
# Policies on held-out rows and their statistics


def fold_assignments(rows: int, folds: int, repeats: int, seed: int) -> np.ndarray:
    """(repeats, rows) fold index of each row in each repeat: seeded shuffles, fold sizes within one."""
    if folds < 2 or folds > rows:
        raise UsageError(f"cross-validation needs 2 to {rows} folds for {rows} rows (got {folds}).")
    if repeats < 1:
        raise UsageError(f"cross-validation needs at least 1 repeat (got {repeats}).")
    rng = np.random.default_rng(seed)
    assignment = np.empty((repeats, rows), dtype=int)
    for repeat in range(repeats):
        assignment[repeat, rng.permutation(rows)] = np.arange(rows) % folds
    return assignment


@dataclass
class CVPoint:
    """One policy's cross-validated operating point (statistics defined in the module docstring)."""

    name: str
    kind: str  # router | knn | fixed | best_fixed_train | random | oracle | target
    cost_weight: float | None
    latency_weight: float | None
    reward: float
    reward_std_repeats: float
    reward_std_folds: float
    delta_reward: float
    delta_se: float
    cost_per_1k: float
    cost_std_repeats: float
    latency_s: float
    latency_std_repeats: float
    share: dict[str, float]
    deployable: bool = True
    cost_frontier: bool = False
    latency_frontier: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {key: value for key, value in self.__dict__.items() if key != "extra" or value}


def _std(values: np.ndarray) -> float:
    return float(values.std(ddof=1)) if values.size > 1 else 0.0


def _point(
    name: str,
    kind: str,
    choice: np.ndarray,
    data: CostData,
    assignment: np.ndarray,
    reference: np.ndarray,
    tradeoff: Tradeoff | None = None,
    deployable: bool = True,
) -> CVPoint:
    """Statistics of a policy given its held-out choice probabilities (repeats, rows, agents)."""
    reward = (choice * data.rewards).sum(-1)  # (repeats, rows)
    cost = (choice * data.cost_per_1k).sum(-1)
    latency = (choice * data.latency_s).sum(-1)
    folds = int(assignment.max()) + 1
    fold_means = np.array([reward[r, assignment[r] == f].mean() for r in range(len(assignment)) for f in range(folds)])
    reference_reward = (reference * data.rewards).sum(-1)
    paired = (reward - reference_reward).mean(axis=0)
    share = choice.mean(axis=(0, 1))
    return CVPoint(
        name=name,
        kind=kind,
        cost_weight=None if tradeoff is None else tradeoff.cost_weight,
        latency_weight=None if tradeoff is None else tradeoff.latency_weight,
        reward=float(reward.mean()),
        reward_std_repeats=_std(reward.mean(axis=1)),
        reward_std_folds=_std(fold_means),
        delta_reward=float(paired.mean()),
        delta_se=_std(paired) / math.sqrt(len(paired)),
        cost_per_1k=float(cost.mean()),
        cost_std_repeats=_std(cost.mean(axis=1)),
        latency_s=float(latency.mean()),
        latency_std_repeats=_std(latency.mean(axis=1)),
        share={agent: float(s) for agent, s in zip(data.agents, share, strict=True)},
        deployable=deployable,
    )


def _one_hot(picks: np.ndarray, agents: int) -> np.ndarray:
    return np.eye(agents)[picks]


def best_fixed_agent(rewards: np.ndarray, cost: np.ndarray) -> int:
    """The agent with the highest mean reward; ties go to the cheaper one (frontier_a on the pilot,
    tied with frontier_b on reward and cheaper)."""
    means = rewards.mean(axis=0)
    tied = np.flatnonzero(means >= means.max() - _TIE)
    return int(tied[np.argmin(cost.mean(axis=0)[tied])])


def knn_picks(
    train_embeddings: np.ndarray, train_utility: np.ndarray, test_embeddings: np.ndarray, k: int
) -> np.ndarray:
    """Per test row, argmax of the mean utility row of its k most cosine-similar training rows."""

    def normalise(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)

    similarity = normalise(test_embeddings) @ normalise(train_embeddings).T  # (test, train)
    k = min(k, len(train_embeddings))
    nearest = np.argsort(-similarity, axis=1, kind="stable")[:, :k]
    return train_utility[nearest].mean(axis=1).argmax(axis=1)


# ---------------------------------------------------------------------------------------------
# The frontier and the area under it


def dominates(a: tuple[float, float], b: tuple[float, float], tolerance: float = _TIE) -> bool:
    """(cost, reward) a dominates b: no dearer, no worse, and strictly better in one. Differences
    below `tolerance` count as ties, so two policies with the same reward computed in a different
    order of float additions do not dominate each other."""
    no_dearer, no_worse = a[0] <= b[0] + tolerance, a[1] >= b[1] - tolerance
    return no_dearer and no_worse and (a[0] < b[0] - tolerance or a[1] > b[1] + tolerance)


def non_dominated(points: Sequence[tuple[float, float]]) -> list[bool]:
    """For (cost, reward) pairs: True where no other point dominates (see dominates)."""
    return [not any(dominates(q, p) for j, q in enumerate(points) if j != i) for i, p in enumerate(points)]


def mark_frontier(points: Sequence[CVPoint]) -> None:
    """Set cost_frontier / latency_frontier on the points of FRONTIER_KINDS (others get False)."""
    candidates = [point for point in points if point.kind in FRONTIER_KINDS]
    for point in points:
        point.cost_frontier = point.latency_frontier = False
    for flags, attribute in (
        (non_dominated([(p.cost_per_1k, p.reward) for p in candidates]), "cost_frontier"),
        (non_dominated([(p.latency_s, p.reward) for p in candidates]), "latency_frontier"),
    ):
        for point, flag in zip(candidates, flags, strict=True):
            setattr(point, attribute, flag)


def reachable_frontier(points: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Breakpoints of f(x) = the highest reward reachable at a mean cost <= x by sending each query to
    one of the policies at random (any mix of the points is reachable, so f is the upper concave hull
    of the points up to the highest-reward point, flat after it). f is undefined (no policy) below the
    cheapest point; the last breakpoint extends flat to the right."""
    ordered = sorted(set((float(x), float(y)) for x, y in points))
    if not ordered:
        raise ValueError("no points")
    hull: list[tuple[float, float]] = []
    for point in ordered:
        if hull and point[0] == hull[-1][0]:  # same cost: keep the better reward
            if point[1] <= hull[-1][1]:
                continue
            hull.pop()
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            # drop the middle point when it is on or below the chord from hull[-2] to point
            if (y2 - y1) * (point[0] - x1) <= (point[1] - y1) * (x2 - x1):
                hull.pop()
            else:
                break
        hull.append(point)
    top = max(range(len(hull)), key=lambda i: (hull[i][1], -hull[i][0]))
    return hull[: top + 1]


def frontier_value(breakpoints: Sequence[tuple[float, float]], x: float) -> float:
    """f(x) for reachable_frontier's breakpoints: 0 below the cheapest point (nothing is that cheap)."""
    if x < breakpoints[0][0]:
        return 0.0
    for (x1, y1), (x2, y2) in itertools.pairwise(breakpoints):
        if x <= x2:
            return y1 + (y2 - y1) * (x - x1) / (x2 - x1)
    return breakpoints[-1][1]


def area_under_frontier(points: Iterable[tuple[float, float]], low: float, high: float) -> float:
    """Mean of f over the cost window [low, high] (f from reachable_frontier, 0 where no policy is that
    cheap): the RouterBench-style AIQ ("average quality over a cost range of the non-decreasing convex
    hull"), defined here exactly so it can be recomputed. f is piecewise linear, so the integral is an
    exact sum of trapezoids."""
    if not high > low:
        raise ValueError(f"empty cost window [{low}, {high}]")
    breakpoints = reachable_frontier(points)
    knots = sorted({low, high, *(x for x, _ in breakpoints if low < x < high)})
    area = 0.0
    for left, right in itertools.pairwise(knots):
        if right <= breakpoints[0][0]:  # nothing reachable this cheap: f = 0 (it jumps at the first point)
            continue
        area += 0.5 * (frontier_value(breakpoints, left) + frontier_value(breakpoints, right)) * (right - left)
    return area / (high - low)


# ---------------------------------------------------------------------------------------------
# The cross-validation over the grid


@dataclass
class FrontierResult:
    agents: list[str]
    rows: int
    folds: int
    repeats: int
    cv_seed: int
    search: dict[str, Any]
    grid: list[Tradeoff]
    points: list[CVPoint]
    reference: str  # name of the reference point (best fixed agent on all rows)
    aiq: dict[str, float]
    aiq_window: tuple[float, float]
    # held-out choice probabilities per point name, (repeats, rows, agents): for paired comparisons
    choices: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def point(self, name: str) -> CVPoint:
        for point in self.points:
            if point.name == name:
                return point
        raise KeyError(name)

    def of_kind(self, kind: str) -> list[CVPoint]:
        return [point for point in self.points if point.kind == kind]


def _router_name(tradeoff: Tradeoff) -> str:
    return f"router {tradeoff.name}"


def cross_validate_frontier(
    embeddings: np.ndarray,
    data: CostData,
    grid: Sequence[Tradeoff] | None = None,
    folds: int = DEFAULT_FOLDS,
    repeats: int = DEFAULT_REPEATS,
    seed: int = DEFAULT_CV_SEED,
    search_kwargs: dict[str, Any] | None = None,
    searcher: Searcher | None = None,
    knn_ks: Sequence[int] = DEFAULT_KNN_KS,
    progress: bool = False,
    other_forms: dict[str, np.ndarray] | None = None,
) -> FrontierResult:
    """Repeated k-fold CV of the router at every trade-off of the grid, kNN at every (k, trade-off),
    and the baselines on the same held-out rows (statistics in the module docstring). `other_forms`
    ({form: embeddings of the same rows in another form}) adds, per trade-off, the same held-out
    heads scoring that form: points "router <trade-off> [<form>]" of kind "router_form"."""
    from tqdm.auto import tqdm

    embeddings = np.asarray(embeddings)
    if embeddings.ndim != 2 or len(embeddings) != len(data):
        raise UsageError(
            f"{len(embeddings)} embeddings for {len(data)} labelled rows; embed exactly the labelled prompts, in order."
        )
    grid = list(grid) if grid is not None else default_grid()
    if not grid:
        raise UsageError("the trade-off grid is empty; pass at least one weight.")
    settings = search_settings(search_kwargs)
    default_search, hidden_dim = make_searcher(settings)
    search = searcher or default_search
    assignment = fold_assignments(len(data), folds, repeats, seed)
    agents = len(data.agents)
    utilities = {tradeoff: tradeoff.utility(data) for tradeoff in grid}
    router = {tradeoff: np.zeros((repeats, len(data)), dtype=int) for tradeoff in grid}
    knn = {(k, tradeoff): np.zeros((repeats, len(data)), dtype=int) for k in knn_ks for tradeoff in grid}
    fixed_train = np.zeros((repeats, len(data)), dtype=int)
    forms = {form: np.asarray(vectors) for form, vectors in (other_forms or {}).items()}
    in_form = {(form, tradeoff): np.zeros((repeats, len(data)), dtype=int) for form in forms for tradeoff in grid}
    with tqdm(total=repeats * folds * len(grid), desc="frontier CV", unit="search", disable=not progress) as bar:
        for repeat in range(repeats):
            for fold in range(folds):
                test = assignment[repeat] == fold
                train = ~test
                fixed_train[repeat, test] = best_fixed_agent(data.rewards[train], data.cost_per_1k[train])
                for tradeoff in grid:
                    utility = utilities[tradeoff]
                    theta = search(embeddings[train], utility[train])
                    router[tradeoff][repeat, test] = head_picks(theta, embeddings[test], agents, hidden_dim)
                    for form, vectors in forms.items():
                        in_form[form, tradeoff][repeat, test] = head_picks(theta, vectors[test], agents, hidden_dim)
                    for k in knn_ks:
                        knn[k, tradeoff][repeat, test] = knn_picks(
                            embeddings[train], utility[train], embeddings[test], k
                        )
                    bar.update()
    extra = {
        f"{_router_name(tradeoff)} [{form}]": ("router_form", _one_hot(picks, agents))
        for (form, tradeoff), picks in in_form.items()
    }
    return _summarise(data, assignment, grid, router, knn, fixed_train, folds, repeats, seed, settings, extra)


def _summarise(
    data: CostData,
    assignment: np.ndarray,
    grid: list[Tradeoff],
    router: dict[Tradeoff, np.ndarray],
    knn: dict[tuple[int, Tradeoff], np.ndarray],
    fixed_train: np.ndarray,
    folds: int,
    repeats: int,
    seed: int,
    settings: dict[str, Any],
    extra_choices: dict[str, tuple[str, np.ndarray]] | None = None,
) -> FrontierResult:
    agents = len(data.agents)
    rows = len(data)
    reference_index = best_fixed_agent(data.rewards, data.cost_per_1k)
    reference_name = f"always {data.agents[reference_index]}"
    broadcast = np.ones((repeats, rows, 1))
    reference = broadcast * np.eye(agents)[reference_index]
    choices: dict[str, np.ndarray] = {}
    points: list[CVPoint] = []

    def add(name: str, kind: str, choice: np.ndarray, tradeoff: Tradeoff | None = None, deployable: bool = True):
        choices[name] = choice
        points.append(_point(name, kind, choice, data, assignment, reference, tradeoff, deployable))

    for tradeoff in grid:
        add(_router_name(tradeoff), "router", _one_hot(router[tradeoff], agents), tradeoff)
    for (k, tradeoff), picks in knn.items():
        add(f"knn{k} {tradeoff.name}", "knn", _one_hot(picks, agents), tradeoff)
    for j, agent in enumerate(data.agents):
        add(f"always {agent}", "fixed", broadcast * np.eye(agents)[j])
    add("best fixed (train folds)", "best_fixed_train", _one_hot(fixed_train, agents))
    add("uniform random", "random", np.full((repeats, rows, agents), 1.0 / agents))
    for name, (kind, choice) in (extra_choices or {}).items():
        add(name, kind, choice)
    # in-sample bounds: they see the held-out row's own rewards, so they are not deployable
    first_best = data.rewards.argmax(axis=1)
    add("oracle (first best)", "oracle", broadcast * _one_hot(first_best, agents), deployable=False)
    cheapest = cheapest_of_best(data.rewards, data.cost_per_1k)
    add("oracle (cheapest best)", "oracle", broadcast * _one_hot(cheapest, agents), deployable=False)
    for tradeoff in grid:
        if tradeoff.cost_weight or tradeoff.latency_weight:
            best_utility = tradeoff.utility(data).argmax(axis=1)
            add(f"oracle {tradeoff.name}", "oracle", broadcast * _one_hot(best_utility, agents), tradeoff, False)

    mark_frontier(points)

    fixed = [p for p in points if p.kind == "fixed"]
    window = (min(p.cost_per_1k for p in fixed), max(p.cost_per_1k for p in fixed))
    # Every family is scored together with the fixed agents: a deployer can always mix in a fixed
    # agent, so "X + fixed agents" minus "fixed agents" is what method X adds over them.
    families = {
        "fixed agents": fixed,
        "router + fixed agents": [p for p in points if p.kind in ("router", "fixed")],
    }
    for k in sorted({k for k, _ in knn}):
        families[f"knn{k} + fixed agents"] = fixed + [
            p for p in points if p.kind == "knn" and p.name.startswith(f"knn{k} ")
        ]
    families["oracle + fixed agents (in-sample)"] = fixed + [p for p in points if p.kind == "oracle"]
    # With every fixed agent at one cost there is no cost range to average over: no AIQ.
    aiq = {
        name: area_under_frontier([(p.cost_per_1k, p.reward) for p in members], *window)
        for name, members in families.items()
        if members and window[1] > window[0]
    }
    return FrontierResult(
        list(data.agents), rows, folds, repeats, seed, settings, grid, points, reference_name, aiq, window, choices
    )


# ---------------------------------------------------------------------------------------------
# Reading the frontier: savings at equal quality, dominance, target mode


def cheapest_within(
    points: Sequence[CVPoint], target_reward: float, eps: float, by: str = "cost_per_1k"
) -> CVPoint | None:
    """The point with the lowest `by` (cost_per_1k or latency_s) whose reward is >= target - eps."""
    eligible = [point for point in points if point.reward >= target_reward - eps - _TIE]
    return min(eligible, key=lambda p: (getattr(p, by), -p.reward)) if eligible else None


def headline(result: FrontierResult, eps: float | None = None) -> dict[str, Any]:
    """Savings of the router against the reference (best fixed agent) at equal quality, and dominance.

    "Equal quality" is reward >= reference - eps; eps defaults to the paired standard error of the
    lambda-0 router against the reference (the CV spread that matters for a paired comparison)."""
    reference = result.point(result.reference)
    routers = result.of_kind("router")
    if eps is None:
        zero = [p for p in routers if not p.cost_weight and not p.latency_weight]
        eps = (zero[0] if zero else routers[0]).delta_se
    summary: dict[str, Any] = {"reference": reference.name, "eps": eps}
    for key, by in (("cost", "cost_per_1k"), ("latency", "latency_s")):
        best = cheapest_within(routers, reference.reward, eps, by)
        summary[f"cheapest_router_by_{key}"] = (
            None
            if best is None
            else {
                "name": best.name,
                "reward": best.reward,
                "delta_reward": best.delta_reward,
                "delta_se": best.delta_se,
                "cost_per_1k": best.cost_per_1k,
                "latency_s": best.latency_s,
                "cost_saving": 1 - best.cost_per_1k / reference.cost_per_1k,
                "latency_saving": 1 - best.latency_s / reference.latency_s,
            }
        )
    dominated_by = {}
    for fixed in result.of_kind("fixed"):
        dominators = [
            p.name for p in routers if dominates((p.cost_per_1k, p.reward), (fixed.cost_per_1k, fixed.reward))
        ]
        dominated_by[fixed.name] = dominators
    summary["fixed_agents_dominated_by_a_router"] = dominated_by
    summary["router_dominates_every_fixed_agent"] = all(dominated_by.values())
    return summary


def headline_text(summary: dict[str, Any], names: dict[str, str] | None = None) -> str:
    """headline()'s summary as one sentence: the cheapest router point at equal quality, and dominance.
    `names` renames router points (e.g. "router lc0.2_ll0" -> an operating point's name)."""
    best = summary.get("cheapest_router_by_cost")
    names = names or {}
    reference = summary.get("reference")
    if best is None:
        text = f"no router point is within {summary['eps']:.4f} reward of {reference} (equal quality: its paired se)"
    else:
        text = (
            f"cheapest router point within {summary['eps']:.4f} reward of {reference} (equal quality: the paired se "
            f"of the reward-only point): {names.get(best['name'], best['name'])}, {best['reward']:.4f} "
            f"(Δ {best['delta_reward']:+.4f} ± {best['delta_se']:.4f}) at {100 * (1 - best['cost_saving']):.0f}% of "
            f"its cost and {100 * (1 - best['latency_saving']):.0f}% of its latency"
        )
    dominated = [name for name, by in summary.get("fixed_agents_dominated_by_a_router", {}).items() if by]
    every = summary.get("router_dominates_every_fixed_agent")
    return (
        f"{text}; a router point dominates {'every fixed agent' if every else ', '.join(dominated) or 'no fixed agent'}"
        " on reward and cost"
    )


@dataclass
class TargetResult:
    eps: float
    point: CVPoint  # outer-CV point of the target-mode router
    chosen: list[str]  # the trade-off chosen on each outer training set
    reference: CVPoint


def select_tradeoff(inner: FrontierResult, eps: float) -> Tradeoff:
    """Target mode on one training set: the cheapest router point whose CV reward is within eps of the
    best fixed agent of that training set; if none is, the router point with the highest reward."""
    routers = inner.of_kind("router")
    reference = inner.point(inner.reference)
    best = cheapest_within(routers, reference.reward, eps)
    if best is None:
        best = max(routers, key=lambda p: (p.reward, -p.cost_per_1k))
    return Tradeoff(best.cost_weight or 0.0, best.latency_weight or 0.0)


def nested_target_cv(
    embeddings: np.ndarray,
    data: CostData,
    eps: float,
    grid: Sequence[Tradeoff] | None = None,
    outer_folds: int = DEFAULT_FOLDS,
    outer_repeats: int = 2,
    inner_folds: int = DEFAULT_FOLDS,
    inner_repeats: int = 2,
    seed: int = DEFAULT_CV_SEED,
    search_kwargs: dict[str, Any] | None = None,
    searcher: Searcher | None = None,
    progress: bool = False,
) -> TargetResult:
    """Nested CV of target mode: on each outer training set, an inner repeated CV picks the trade-off
    (select_tradeoff; the best fixed agent is that of the outer training rows), a head trained on the
    whole outer training set with it routes the outer test fold. The outer test rows are never seen
    by the choice."""
    grid = list(grid) if grid is not None else [t for t in default_grid() if not t.latency_weight]
    settings = search_settings(search_kwargs)
    default_search, hidden_dim = make_searcher(settings)
    search = searcher or default_search
    assignment = fold_assignments(len(data), outer_folds, outer_repeats, seed)
    picks = np.zeros((outer_repeats, len(data)), dtype=int)
    chosen = []
    for repeat in range(outer_repeats):
        for fold in range(outer_folds):
            test = assignment[repeat] == fold
            train = np.flatnonzero(~test)
            inner = cross_validate_frontier(
                embeddings[train],
                data.subset(train),
                grid,
                inner_folds,
                inner_repeats,
                seed + 1000 * (repeat * outer_folds + fold + 1),
                settings,
                search,
                knn_ks=(),
                progress=progress,
            )
            tradeoff = select_tradeoff(inner, eps)
            chosen.append(tradeoff.name)
            theta = search(embeddings[train], tradeoff.utility(data)[train])
            picks[repeat, test] = head_picks(theta, embeddings[test], len(data.agents), hidden_dim)
    agents = len(data.agents)
    reference_index = best_fixed_agent(data.rewards, data.cost_per_1k)
    reference = np.ones((outer_repeats, len(data), 1)) * np.eye(agents)[reference_index]
    point = _point(f"target eps={eps:g}", "target", _one_hot(picks, agents), data, assignment, reference)
    point.extra = {"chosen": {name: chosen.count(name) for name in sorted(set(chosen))}}
    reference_point = _point(f"always {data.agents[reference_index]}", "fixed", reference, data, assignment, reference)
    return TargetResult(eps, point, chosen, reference_point)


IN_SAMPLE_SEARCH = {"in_sample": True}  # what evaluate_policies records as its "search": nothing was searched


def evaluate_policies(
    data: CostData,
    router_picks: dict[str, np.ndarray],
    weights: dict[str, tuple[float, float]] | None = None,
    other_forms: dict[str, np.ndarray] | None = None,
) -> FrontierResult:
    """In-sample operating points of fixed routers on the rows of `data`, against every fixed agent,
    uniform random and the per-task oracles on the same rows, with the frontier marks and the AIQ.

    `router_picks` maps a point name (e.g. "router balanced") to that router's pick per row, as agent
    indices in `data.agents` order; `weights` gives each one's (cost weight, latency weight) where
    known (an operating point's), the others get None. Nothing is trained or held out: the rows are
    scored once (repeats = folds = 1, so ±rep and ±fold are 0), and a router trained on some of these
    rows looks better on them than it will on new queries. Δref ± se is still the paired difference
    to the best fixed agent and its standard error over tasks. The baselines are _summarise's, so
    they are computed exactly as in the CV; "best fixed (train folds)" is left out, having no training
    folds here (it would repeat the reference). With several routers the AIQ also has one entry per
    router, each with the fixed agents only. `other_forms` adds routers' picks on the same rows in
    another form of the prompts (e.g. "router balanced [plain]"), as points of kind "router_form",
    which join no frontier family."""
    rows, agents = len(data), len(data.agents)
    if not router_picks:
        raise ValueError("evaluate_policies needs at least one router's picks")
    weights = weights or {}
    extra: dict[str, tuple[str, np.ndarray]] = {}
    policies = [(name, picks, "router") for name, picks in router_picks.items()]
    policies += [(name, picks, "router_form") for name, picks in (other_forms or {}).items()]
    for name, picks, kind in policies:
        picks = np.asarray(picks)
        if picks.shape != (rows,) or picks.dtype.kind not in "iu" or (picks < 0).any() or (picks >= agents).any():
            raise ValueError(f"picks of {name!r} must be {rows} agent indices in [0, {agents}), got {picks!r}")
        extra[name] = (kind, _one_hot(picks, agents)[None])  # (1 repeat, rows, agents)
    assignment = np.zeros((1, rows), dtype=int)  # a single "fold" holding every row
    fixed_train = np.full((1, rows), best_fixed_agent(data.rewards, data.cost_per_1k))
    result = _summarise(data, assignment, [], {}, {}, fixed_train, 1, 1, 0, dict(IN_SAMPLE_SEARCH), extra)
    names = [p.name for p in result.points]
    if len(set(names)) != len(names):
        raise ValueError(f"router names {list(router_picks)} repeat a baseline's name")
    result.points = [p for p in result.points if p.kind != "best_fixed_train"]
    result.choices = {p.name: result.choices[p.name] for p in result.points}
    routers = result.of_kind("router")
    for point in routers + result.of_kind("router_form"):
        if point.name in weights:
            point.cost_weight, point.latency_weight = (float(w) for w in weights[point.name])
    # routers first, as in the CV table
    result.points = routers + [p for p in result.points if p.kind != "router"]
    mark_frontier(result.points)  # again, without the dropped point (it changes no flag: it is the reference)
    if len(routers) > 1 and result.aiq:
        fixed = [(p.cost_per_1k, p.reward) for p in result.of_kind("fixed")]
        single = {
            f"{p.name} + fixed agents": area_under_frontier([*fixed, (p.cost_per_1k, p.reward)], *result.aiq_window)
            for p in routers
        }
        ordered = list(result.aiq.items())
        at = [name for name, _ in ordered].index("router + fixed agents") + 1
        result.aiq = dict(ordered[:at] + list(single.items()) + ordered[at:])
    return result


def plot_policies(result: FrontierResult, cost_png: str | Path, latency_png: str | Path, title: str = "") -> None:
    """Reward vs cost and reward vs latency of an evaluate_policies result. plot_frontier draws a CV
    grid's trade-off lines with error bars over repeats; here each router is one fixed policy scored
    once, so routers and fixed agents are labelled points, with uniform random, the cheapest-of-best
    oracle and the non-dominated frontier. PNGs written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for png, axis, flag, label in (
        (cost_png, "cost_per_1k", "cost_frontier", "mean cost (USD per 1,000 queries)"),
        (latency_png, "latency_s", "latency_frontier", "mean latency per query (s)"),
    ):
        fig, ax = plt.subplots(figsize=(9, 6), dpi=120)
        for kind, marker, color, legend in (
            ("router", "o", "tab:blue", "router"),
            ("fixed", "D", "black", "fixed agent"),
        ):
            for number, p in enumerate(result.of_kind(kind)):
                x = getattr(p, axis)
                ax.plot(x, p.reward, marker, color=color, ms=7, label=legend if number == 0 else None)
                ax.annotate(
                    p.name.removeprefix("always "),
                    (x, p.reward),
                    textcoords="offset points",
                    xytext=(5, -10),
                    fontsize=8,
                    color=color,
                )
        for p in result.of_kind("random"):
            ax.plot(getattr(p, axis), p.reward, "P", color="gray", ms=6, label=p.name)
        for p in result.of_kind("oracle"):
            if p.name == "oracle (cheapest best)":
                ax.plot(getattr(p, axis), p.reward, "*", color="tab:green", ms=12, label="oracle, cheapest of best")
        _draw_frontier(ax, result.points, axis, flag)
        _save_plot(
            fig,
            ax,
            png,
            label,
            "mean reward (in-sample, these rows)",
            title or f"fixed routers in-sample on {result.rows} rows (no CV)",
        )


# ---------------------------------------------------------------------------------------------
# Multi-head checkpoints


class TrainedHead(NamedTuple):
    name: str
    cost_weight: float
    latency_weight: float
    theta: np.ndarray
    cv_point: dict[str, Any] | None


def train_heads_over_grid(
    embeddings: np.ndarray,
    data: CostData,
    grid: Sequence[Tradeoff],
    search_kwargs: dict[str, Any] | None = None,
    cv: FrontierResult | None = None,
) -> list[TrainedHead]:
    """One head per trade-off, each trained on all rows with the same search, with its CV point (from
    `cv`, a cross_validate_frontier run with the same data and search; None leaves it out)."""
    embeddings = np.asarray(embeddings)
    if len(embeddings) != len(data):
        raise UsageError(f"{len(embeddings)} embeddings for {len(data)} labelled rows; embed the labelled prompts.")
    search, _ = make_searcher(search_kwargs)
    heads = []
    for tradeoff in grid:
        point = None
        if cv is not None:
            try:
                point = cv.point(_router_name(tradeoff)).to_dict()
            except KeyError:
                raise UsageError(
                    f"the CV run has no point for trade-off {tradeoff.name}; run it over the same grid."
                ) from None
        theta = search(embeddings, tradeoff.utility(data))
        heads.append(TrainedHead(tradeoff.name, tradeoff.cost_weight, tradeoff.latency_weight, theta, point))
    return heads


# ---------------------------------------------------------------------------------------------
# Output: text table, JSON-able dict, plots


def _share_text(share: dict[str, float], agents: Sequence[str]) -> str:
    return " ".join(f"{100 * share[agent]:3.0f}" for agent in agents)


def format_frontier(
    result: FrontierResult,
    kinds: Sequence[str] = ("router", "router_form", "fixed", "best_fixed_train", "random", "oracle"),
    knn_ks: Sequence[int] = (),
    title: str | None = None,
) -> str:
    """The frontier table as plain text (what train and evaluate print). `*` marks points on the
    non-dominated reward/cost frontier, `+` on the reward/latency one (over FRONTIER_KINDS). `title`
    replaces the first line, which describes a CV run (e.g. for evaluate_policies' in-sample table)."""
    agents = result.agents
    points = [p for p in result.points if p.kind in kinds or (p.kind == "knn" and int(p.name[3:].split()[0]) in knn_ks)]
    header = (
        f"{'policy':<28} {'reward':>7} {'±rep':>6} {'±fold':>6} {'Δref':>7} {'±se':>6} "
        f"{'USD/1k':>7} {'lat s':>6}  {'fr':<2}  share % ({', '.join(agents)})"
    )
    lines = [
        title
        or f"{result.repeats}x repeated {result.folds}-fold CV over {result.rows} labelled rows "
        f"(cv seed {result.cv_seed}; search {result.search}); reference: {result.reference}",
        "±rep: std over repeats; ±fold: std over folds; Δref ± se: paired difference to the reference "
        "and its standard error over tasks; USD per 1,000 queries; * cost frontier, + latency frontier",
        header,
        "-" * len(header),
    ]
    for p in points:
        mark = ("*" if p.cost_frontier else " ") + ("+" if p.latency_frontier else " ")
        lines.append(
            f"{p.name:<28} {p.reward:7.4f} {p.reward_std_repeats:6.4f} {p.reward_std_folds:6.4f} "
            f"{p.delta_reward:+7.4f} {p.delta_se:6.4f} {p.cost_per_1k:7.4f} {p.latency_s:6.2f}  {mark}  "
            f"{_share_text(p.share, agents)}"
        )
    low, high = result.aiq_window
    if not result.aiq:
        lines.append(f"AIQ: none (every fixed agent costs {low:.4f} USD/1k, so there is no cost range)")
        return "\n".join(lines)
    lines.append(
        f"AIQ (mean reachable reward over cost {low:.4f}-{high:.4f} USD/1k): "
        + ", ".join(
            f"{name} {value:.4f}"
            for name, value in result.aiq.items()
            if not name.startswith("knn") or int(name[3:].split()[0]) in knn_ks
        )
    )
    return "\n".join(lines)


def frontier_to_dict(result: FrontierResult, include_knn: bool = True) -> dict[str, Any]:
    """The CV run as plain JSON types (for a manifest or model card)."""
    return {
        "agents": result.agents,
        "rows": result.rows,
        "folds": result.folds,
        "repeats": result.repeats,
        "cv_seed": result.cv_seed,
        "search": result.search,
        "units": {
            "cost_per_1k": "USD per 1,000 queries",
            "latency_s": "seconds per query",
            "cost_weight": "reward per (USD per 1,000 queries)",
            "latency_weight": "reward per second",
        },
        "grid": [
            {"name": t.name, "cost_weight": t.cost_weight, "latency_weight": t.latency_weight} for t in result.grid
        ],
        "reference": result.reference,
        "points": [p.to_dict() for p in result.points if include_knn or p.kind != "knn"],
        "aiq": result.aiq,
        "aiq_window_cost_per_1k": list(result.aiq_window),
        "headline": headline(result),
    }


def frontier_from_dict(stored: dict[str, Any]) -> FrontierResult:
    """A FrontierResult back from frontier_to_dict's output (for tables and plots; no held-out choices)."""
    try:
        points = [CVPoint(**{"extra": {}, **point}) for point in stored["points"]]
        mark_frontier(points)  # flags by this version's definition
        grid = [Tradeoff(t["cost_weight"], t["latency_weight"]) for t in stored["grid"]]
        return FrontierResult(
            stored["agents"],
            stored["rows"],
            stored["folds"],
            stored["repeats"],
            stored["cv_seed"],
            stored["search"],
            grid,
            points,
            stored["reference"],
            stored["aiq"],
            tuple(stored["aiq_window_cost_per_1k"]),
        )
    except (KeyError, TypeError) as err:
        raise UsageError(f"stored frontier is incomplete ({err}); pass what frontier_to_dict wrote.") from None


def _draw_frontier(ax: Any, points: Sequence[CVPoint], axis: str, flag: str) -> None:
    """The non-dominated frontier (points with `flag` set) as a step line over `axis`."""
    line = sorted((getattr(p, axis), p.reward) for p in points if getattr(p, flag))
    ax.step(
        [x for x, _ in line],
        [y for _, y in line],
        where="post",
        color="tab:red",
        lw=1.5,
        alpha=0.5,
        label="non-dominated frontier",
    )


def _save_plot(fig: Any, ax: Any, png: str | Path, xlabel: str, ylabel: str, title: str) -> None:
    """Label, lay out and write one plot as PNG, atomically, and free it."""
    import matplotlib.pyplot as plt

    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    with atomic_output(png, "wb") as handle:
        fig.savefig(handle, format="png")
    plt.close(fig)


def plot_frontier(
    result: FrontierResult,
    cost_png: str | Path,
    latency_png: str | Path,
    knn_k: int | None = None,
    title: str = "",
    compare: Sequence[tuple[str, Sequence[CVPoint]]] = (),
    target: dict[str, float] | None = None,
    limits: dict[str, tuple[float, float, float, float]] | None = None,
) -> None:
    """Reward vs cost and reward vs latency: fixed agents as labelled points, the router's trade-off
    lines (std over repeats as error bars, each point labelled with its weight), optionally one kNN
    line and further router curves (`compare`: label and points, e.g. another search setting), the
    in-sample oracle, the non-dominated frontier over FRONTIER_KINDS, and optionally a target box
    (`target`: reward_floor, cost_cap, latency_cap) as dashed lines. `limits` zooms in: "cost" or
    "latency" -> (x min, x max, reward min, reward max). PNGs written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for png, axis, flag, label, cap, plane in (
        (cost_png, "cost_per_1k", "cost_frontier", "mean cost (USD per 1,000 queries)", "cost_cap", "cost"),
        (latency_png, "latency_s", "latency_frontier", "mean latency per query (s)", "latency_cap", "latency"),
    ):
        fig, ax = plt.subplots(figsize=(9, 6), dpi=120)
        routers = result.of_kind("router")
        families = [
            ("router, cost weight", "o-", "tab:blue", [p for p in routers if not p.latency_weight]),
            (
                "router, latency weight",
                "s--",
                "tab:purple",
                [p for p in routers if p.latency_weight and not p.cost_weight],
            ),
            ("router, both weights", "^:", "tab:cyan", [p for p in routers if p.latency_weight and p.cost_weight]),
        ]
        for family, style, color, members in families:
            if not members:
                continue
            xs, ys = [getattr(p, axis) for p in members], [p.reward for p in members]
            ax.errorbar(
                xs,
                ys,
                yerr=[p.reward_std_repeats for p in members],
                fmt=style,
                color=color,
                ms=4,
                capsize=2,
                lw=1,
                label=family,
            )
            for p, x, y in zip(members, xs, ys, strict=True):
                weight = p.latency_weight if p.latency_weight and not p.cost_weight else p.cost_weight
                ax.annotate(f"{weight:g}", (x, y), textcoords="offset points", xytext=(3, 3), fontsize=6, color=color)
        for (name, members), color in zip(compare, ("tab:olive", "tab:brown", "tab:pink"), strict=False):
            members = sorted(members, key=lambda p: (p.latency_weight or 0.0, p.cost_weight or 0.0))
            ax.plot(
                [getattr(p, axis) for p in members],
                [p.reward for p in members],
                "d-",
                color=color,
                ms=4,
                lw=1,
                alpha=0.8,
                label=name,
            )
        if knn_k is not None:
            knn = [p for p in result.of_kind("knn") if p.name.startswith(f"knn{knn_k} ") and not p.latency_weight]
            if knn:
                ax.plot(
                    [getattr(p, axis) for p in knn],
                    [p.reward for p in knn],
                    "x-",
                    color="tab:orange",
                    ms=4,
                    lw=1,
                    label=f"kNN (k={knn_k}), cost weight",
                )
        for p in result.of_kind("fixed"):
            ax.plot(getattr(p, axis), p.reward, "D", color="black", ms=6)
            ax.annotate(
                p.name.removeprefix("always "),
                (getattr(p, axis), p.reward),
                textcoords="offset points",
                xytext=(5, -10),
                fontsize=8,
            )
        for kind, marker in (("best_fixed_train", "v"), ("random", "P")):
            for p in result.of_kind(kind):
                ax.plot(getattr(p, axis), p.reward, marker, color="gray", ms=6, label=p.name)
        for p in result.of_kind("oracle"):
            if p.name == "oracle (cheapest best)":
                ax.plot(
                    getattr(p, axis),
                    p.reward,
                    "*",
                    color="tab:green",
                    ms=12,
                    label="oracle, cheapest of best (in-sample)",
                )
        _draw_frontier(ax, result.points, axis, flag)
        if target:
            ax.axhline(target["reward_floor"], color="tab:green", ls="--", lw=0.8, label="target")
            ax.axvline(target[cap], color="tab:green", ls="--", lw=0.8)
        if limits and plane in limits:
            x_low, x_high, y_low, y_high = limits[plane]
            ax.set_xlim(x_low, x_high)
            ax.set_ylim(y_low, y_high)
        _save_plot(
            fig,
            ax,
            png,
            label,
            "mean reward (held-out, repeated CV)",
            title or f"{result.repeats}x{result.folds}-fold CV, {result.rows} rows",
        )


# ---------------------------------------------------------------------------------------------
# The analysis as a command (the numbers in docs/cost-frontier.md)


def _int_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of integers") from None


def _float_list(text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of numbers") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchgen_router.frontier",
        description="Repeated k-fold CV of cost-aware routers over a trade-off grid, with baselines, the "
        "frontier, plots and (optionally) nested-CV target mode. Embeds with the default router's backbone.",
    )
    parser.add_argument("--rewards", required=True, help="labelled rewards JSONL (rewards.jsonl)")
    parser.add_argument("--tasks", required=True, help="task prompts JSONL (tasks.v1.jsonl)")
    parser.add_argument("--calls", required=True, help="raw per-call JSONL with cost_usd and latency_ms")
    parser.add_argument("--pool", help="pool file (agents.json) to estimate missing costs from token counts")
    parser.add_argument("--backbone", help="backbone folder or id (default: the default router's MiniLM)")
    parser.add_argument("--cache-dir", type=Path, help="embedding cache folder (default: no cache)")
    parser.add_argument("--grid", type=parse_grid, help="trade-offs: '0,0.5,1' or 'lc:ll,...' (default: built in)")
    parser.add_argument("--folds", type=int, default=DEFAULT_FOLDS)
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    parser.add_argument("--cv-seed", type=int, default=DEFAULT_CV_SEED)
    parser.add_argument("--generations", type=int, default=DEFAULT_SEARCH["generations"])
    parser.add_argument("--seed", type=int, default=DEFAULT_SEARCH["seed"], help="search seed")
    parser.add_argument("--shrink", type=float, default=0.0, help="utility regularisation in [0, 1) (default 0)")
    parser.add_argument("--ensemble-seeds", type=_int_list, help="average the heads of these search seeds")
    parser.add_argument("--knn", type=_int_list, default=list(DEFAULT_KNN_KS), help="kNN baselines' k values")
    parser.add_argument("--target-eps", type=float, help="also run nested-CV target mode with this eps")
    parser.add_argument("--target-grid", type=parse_grid, help="trade-offs target mode chooses from")
    parser.add_argument("--outer-repeats", type=int, default=2)
    parser.add_argument("--inner-repeats", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the frontier (and target result) as JSON here")
    parser.add_argument("--plots", help="write <prefix>-cost.png and <prefix>-latency.png")
    parser.add_argument("--plot-knn", type=int, help="draw the kNN line with this k (one of --knn)")
    parser.add_argument(
        "--target-box", type=_float_list, help="draw eps,cost share,latency share of the reference (e.g. 0.01,0.6,0.4)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        data = join_rewards(load_rows(args.rewards, "rewards"), load_rows(args.tasks, "tasks"))
        costs = costs_for_labelled(data, args.calls, args.pool)
        backbone = args.backbone or "sentence-transformers/all-MiniLM-L6-v2"  # the default router's, installed
        from benchgen_router.embeddings import embed_prompts  # torch and transformers: only once the data are good

        embeddings = embed_prompts(data.prompts, backbone, data.agents, cache_dir=args.cache_dir).vectors
        search = {"generations": args.generations, "seed": args.seed, "shrink": args.shrink}
        if args.ensemble_seeds:
            search["ensemble_seeds"] = args.ensemble_seeds
        result = cross_validate_frontier(
            embeddings, costs, args.grid, args.folds, args.repeats, args.cv_seed, search, knn_ks=args.knn, progress=True
        )
        print(format_frontier(result, knn_ks=args.knn))
        print(json.dumps(headline(result), indent=1))
        stored = frontier_to_dict(result)
        if args.target_eps is not None:
            target = nested_target_cv(
                embeddings,
                costs,
                args.target_eps,
                args.target_grid,
                args.folds,
                args.outer_repeats,
                args.folds,
                args.inner_repeats,
                args.cv_seed,
                search,
                progress=False,
            )
            p = target.point
            print(
                f"target mode eps={target.eps:g} ({args.outer_repeats}x{args.folds} outer, {args.inner_repeats}x"
                f"{args.folds} inner): reward {p.reward:.4f} ±{p.reward_std_repeats:.4f} (Δref {p.delta_reward:+.4f}"
                f" ±{p.delta_se:.4f}), {p.cost_per_1k:.4f} USD/1k, {p.latency_s:.2f} s; chosen {p.extra['chosen']}"
            )
            stored["target"] = {"eps": target.eps, "point": p.to_dict(), "chosen": target.chosen}
        if args.json:
            with atomic_output(args.json) as handle:
                json.dump(stored, handle, indent=1)
        if args.plots:
            box = None
            if args.target_box:
                if len(args.target_box) != 3:
                    raise UsageError("--target-box takes three numbers: eps,cost share,latency share.")
                reference = result.point(result.reference)
                eps, cost_share, latency_share = args.target_box
                box = {
                    "reward_floor": reference.reward - eps,
                    "cost_cap": cost_share * reference.cost_per_1k,
                    "latency_cap": latency_share * reference.latency_s,
                }
            plot_frontier(
                result,
                f"{args.plots}-cost.png",
                f"{args.plots}-latency.png",
                knn_k=args.plot_knn,
                target=box,
            )
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
