"""The share of the quality gap a router recovers per unit of cost: RouteLLM's metrics for two agents,
computed as routellm/evals computes them, and their generalisation to any pool.

Two agents, a weak (cheap) and a strong one (lm-sys/RouteLLM, routellm/evals/benchmarks.py and
evaluate.py at 0b64fdaf):
- threshold sweep (`threshold_sweep`): the router's per-query score for the strong agent is cut into
  `num_results` (10) equal-count bins; the bins' edges (linear quantiles, as pandas.qcut computes
  them) are the thresholds. A query goes to the strong agent when its score >= the threshold, and
  when it is > the threshold for the last edge, so the sweep runs from 100% strong calls to 0%.
  RouteLLM's qcut raises on repeated edges (tied scores); repeated edges are dropped here.
- the curve: (share of strong calls, accuracy) at each threshold, sorted by the share.
- APGR (`apgr`): AUC = trapz(accuracy, share); APGR = (AUC - trapz(weak, share)) /
  (trapz(strong, share) - trapz(weak, share)), with `weak` and `strong` each agent's accuracy on all the
  evaluated rows. Over a sweep from 0 to 1 this is the mean performance gap recovered,
  (accuracy - weak) / (strong - weak), over the share of strong calls.
- CPT(x) (`cpt`): np.interp(weak + x * (strong - weak), accuracies, shares) with the points sorted by
  share: the share of strong calls at which the curve first recovers x of the gap. np.interp assumes
  increasing accuracies; a curve that dips is read as np.interp reads it, as in RouteLLM.
- random: RouteLLM averages a random router over 10 draws; its expectation, used here, is the straight
  line from always-weak to always-strong (APGR 0.5, CPT(x) = x).
- oracle: `get_optimal_accuracy`: the weak agent's correct answers plus, with a share s of strong
  calls, min(s * rows, rows the strong agent answers and the weak one does not) (`oracle_accuracy`).

Any pool (`PoolGap`): the cheapest agent (lowest mean cost) plays the weak one, the best agent (highest
mean quality, the cheaper on ties) the strong one, and cost is normalised so that the cheapest
agent's mean cost per query is 0 and the best agent's is 1. A policy's point is (normalised mean
cost, mean quality) of its picks; with two agents and any two prices the normalised cost is exactly
the share of strong calls, so every figure below reduces to RouteLLM's:
- `gap_area`: the curve restricted to normalised costs 0-1 (cut by linear interpolation), its trapz
  area minus the cheapest agent's, over the best agent's minus the cheapest agent's (APGR);
- `cost_to_recover`: CPT(x) on the normalised cost, also given in the cost's own unit;
- `random`: mixing the cheapest and the best agent (the straight line); `oracle`: the least mean cost
  for each mean quality knowing every answer (the fractional multiple-choice knapsack, exact).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchgen_router.errors import InputError

ROUTELLM_NUM_RESULTS = 10  # routellm/evals/evaluate.py --num-results default: 10 bins, 11 thresholds
GAP_FRACTIONS = (0.5, 0.8)  # CPT(50%) and CPT(80%), the two RouteLLM's paper reports
_TIE = 1e-12


# ---------------------------------------------------------------------------------------------
# Two agents, as routellm/evals computes them


def routellm_thresholds(scores: np.ndarray, num_results: int = ROUTELLM_NUM_RESULTS) -> np.ndarray:
    """The edges of `num_results` equal-count bins of the scores (pandas.qcut's retbins), repeats dropped."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 1 or not len(scores) or not np.isfinite(scores).all():
        raise InputError("router scores must be a non-empty vector of finite numbers.")
    if num_results < 1:
        raise InputError(f"the threshold sweep needs at least 1 bin (got {num_results}).")
    return np.unique(np.quantile(scores, np.linspace(0, 1, num_results + 1)))


def threshold_sweep(
    scores: np.ndarray,
    strong_rewards: np.ndarray,
    weak_rewards: np.ndarray,
    num_results: int = ROUTELLM_NUM_RESULTS,
) -> tuple[np.ndarray, np.ndarray]:
    """(shares of strong calls, accuracies) of the sweep over `routellm_thresholds`, sorted by share.
    `scores`: the router's score for the strong agent per query (higher: strong)."""
    scores = np.asarray(scores, dtype=np.float64)
    strong_rewards, weak_rewards = np.asarray(strong_rewards, float), np.asarray(weak_rewards, float)
    if not (len(scores) == len(strong_rewards) == len(weak_rewards)):
        raise InputError("scores and both agents' rewards must have one entry per query.")
    thresholds = routellm_thresholds(scores, num_results)
    shares, accuracies = [], []
    for index, threshold in enumerate(thresholds):
        strong = scores >= threshold if index != len(thresholds) - 1 else scores > threshold
        shares.append(strong.mean())
        accuracies.append(np.where(strong, strong_rewards, weak_rewards).mean())
    return _by_cost(np.asarray(shares), np.asarray(accuracies))


def _by_cost(costs: np.ndarray, qualities: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(costs, kind="stable")
    return costs[order], qualities[order]


def apgr(shares: np.ndarray, accuracies: np.ndarray, weak: float, strong: float) -> float:
    """RouteLLM's APGR of a curve sorted by share (see the module docstring); NaN without a gap or a range."""
    width = float(shares[-1] - shares[0])
    if abs(strong - weak) <= _TIE or width <= _TIE:
        return float("nan")
    area = float(np.trapezoid(accuracies, shares))
    return (area - weak * width) / ((strong - weak) * width)


def cpt(shares: np.ndarray, accuracies: np.ndarray, weak: float, strong: float, fraction: float) -> float:
    """RouteLLM's CPT(fraction): the share of strong calls that recovers `fraction` of the gap."""
    return float(np.interp(weak + fraction * (strong - weak), accuracies, shares))


def oracle_accuracy(strong_rewards: np.ndarray, weak_rewards: np.ndarray, share: float) -> float:
    """RouteLLM's get_optimal_accuracy at a share of strong calls (0-1)."""
    strong_rewards, weak_rewards = np.asarray(strong_rewards, float), np.asarray(weak_rewards, float)
    gainers = int(((weak_rewards == 0) & (strong_rewards == 1)).sum())
    return (float(weak_rewards.sum()) + min(share * len(weak_rewards), gainers)) / len(weak_rewards)


# ---------------------------------------------------------------------------------------------
# Any pool


@dataclass(frozen=True)
class GapCurve:
    """One policy's points: normalised mean cost (0: the cheapest agent, 1: the best; two agents: the
    share of strong calls) and mean quality, sorted by cost."""

    name: str
    cost: np.ndarray
    quality: np.ndarray


@dataclass(frozen=True)
class GapFigures:
    """A curve's summary: `area` (APGR), `recover[x]` the normalised cost that recovers x of the gap
    (CPT(x)) and `recover_cost[x]` the same in the cost's own unit per query."""

    name: str
    area: float
    recover: dict[float, float]
    recover_cost: dict[float, float]
    covered: tuple[float, float]  # the normalised cost range the curve spans within 0-1

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "apgr": self.area,
            **{f"cpt_{round(100 * x)}": value for x, value in self.recover.items()},
            **{f"cost_to_recover_{round(100 * x)}": value for x, value in self.recover_cost.items()},
            "covered": list(self.covered),
        }


@dataclass(frozen=True)
class PoolGap:
    """The gap of a pool: the cheapest and the best agent, their mean quality and cost per query."""

    agents: list[str]
    cheapest: int
    best: int
    cheapest_quality: float
    best_quality: float
    cheapest_cost: float
    best_cost: float
    cost_unit: str = "USD per query"
    notes: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, rewards: np.ndarray, cost: np.ndarray, agents: Sequence[str], cost_unit: str = "USD per query"):
        """The gap of a (rows, agents) reward and cost table; InputError when it has no gap to recover."""
        rewards, cost = np.asarray(rewards, float), np.asarray(cost, float)
        if rewards.ndim != 2 or rewards.shape != cost.shape or rewards.shape[1] != len(agents) or not len(rewards):
            raise InputError("rewards and cost must be (rows, agents) tables of the same shape with rows.")
        quality, mean_cost = rewards.mean(axis=0), cost.mean(axis=0)
        if np.ptp(mean_cost) <= _TIE:
            raise InputError(
                "every agent costs the same per query: there is no cost range to recover the gap over; "
                "give per-call costs (or a pool file with prices) that differ."
            )
        cheap = np.flatnonzero(mean_cost <= mean_cost.min() + _TIE)
        cheapest = int(cheap[np.argmax(quality[cheap])])
        top = np.flatnonzero(quality >= quality.max() - _TIE)
        best = int(top[np.argmin(mean_cost[top])])
        if best == cheapest:
            raise InputError(
                f"the cheapest agent ({agents[cheapest]}) is also the best: there is no quality gap to recover."
            )
        return cls(
            list(agents),
            cheapest,
            best,
            float(quality[cheapest]),
            float(quality[best]),
            float(mean_cost[cheapest]),
            float(mean_cost[best]),
            cost_unit,
        )

    @property
    def gap(self) -> float:
        return self.best_quality - self.cheapest_quality

    def normalise(self, cost: np.ndarray | float) -> np.ndarray:
        return (np.asarray(cost, float) - self.cheapest_cost) / (self.best_cost - self.cheapest_cost)

    def in_cost_unit(self, normalised: Any) -> Any:
        """Normalised cost(s) back in the cost's own unit per query."""
        return self.cheapest_cost + normalised * (self.best_cost - self.cheapest_cost)

    def curve_of_picks(
        self, name: str, picks: Sequence[np.ndarray], rewards: np.ndarray, cost: np.ndarray, endpoints: bool = True
    ) -> GapCurve:
        """The curve of a router's operating points (one picks vector each) on these rows; `endpoints`
        adds always-cheapest and always-best, which any router reaches at its extreme settings."""
        rows = np.arange(len(rewards))
        costs = [float(cost[rows, p].mean()) for p in picks]
        return self.curve_of_points(name, costs, [float(rewards[rows, p].mean()) for p in picks], endpoints)

    def curve_of_points(
        self, name: str, costs: Sequence[float], qualities: Sequence[float], endpoints: bool = True
    ) -> GapCurve:
        """The curve of operating points given as mean cost per query (in the gap's unit) and mean quality."""
        costs, qualities = list(costs), list(qualities)
        if endpoints:
            costs += [self.cheapest_cost, self.best_cost]
            qualities += [self.cheapest_quality, self.best_quality]
        ordered_costs, ordered_qualities = _by_cost(np.asarray(costs, float), np.asarray(qualities, float))
        return GapCurve(name, self.normalise(ordered_costs), ordered_qualities)

    def record(self, curves: Sequence[GapCurve]) -> dict[str, object]:
        """The gap and each curve's figures as plain JSON types (what evaluate and frontier store)."""
        return {
            "cheapest": self.agents[self.cheapest],
            "best": self.agents[self.best],
            "cheapest_quality": self.cheapest_quality,
            "best_quality": self.best_quality,
            "cheapest_cost": self.cheapest_cost,
            "best_cost": self.best_cost,
            "cost_unit": self.cost_unit,
            "policies": {curve.name: self.figures(curve).to_dict() for curve in curves},
        }

    def random(self) -> GapCurve:
        """Mixing the cheapest and the best agent at random (the expectation: a straight line)."""
        return GapCurve("random", np.array([0.0, 1.0]), np.array([self.cheapest_quality, self.best_quality]))

    def figures(self, curve: GapCurve, fractions: Sequence[float] = GAP_FRACTIONS) -> GapFigures:
        """APGR and CPT of a curve on this gap (see the module docstring)."""
        costs, qualities = _window(curve.cost, curve.quality)
        area = apgr(costs, qualities, self.cheapest_quality, self.best_quality)
        recover = {x: cpt(costs, qualities, self.cheapest_quality, self.best_quality, x) for x in fractions}
        in_unit = {x: self.in_cost_unit(value) for x, value in recover.items()}
        covered = (float(costs[0]), float(costs[-1])) if len(costs) else (float("nan"), float("nan"))
        return GapFigures(curve.name, area, recover, in_unit, covered)


def _window(costs: np.ndarray, qualities: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The part of a curve (sorted by cost) between normalised costs 0 and 1, cut at the edges by
    linear interpolation; unchanged when it lies inside (every two-agent curve does)."""
    inside = (costs >= 0) & (costs <= 1)
    keep_costs, keep_qualities = list(costs[inside]), list(qualities[inside])
    for edge in (0.0, 1.0):
        crosses = len(costs) > 1 and costs[0] < edge < costs[-1] and edge not in keep_costs
        if crosses:
            keep_costs.append(edge)
            keep_qualities.append(float(np.interp(edge, costs, qualities)))
    return _by_cost(np.asarray(keep_costs, float), np.asarray(keep_qualities, float))


def oracle_frontier(rewards: np.ndarray, cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean costs, mean qualities) of the least mean cost for each mean quality when every answer is known:
    per row the agents on the upper hull of (cost, reward), the hull's steps of all rows taken best-ratio
    first (the exact frontier of fractional choices), from every row's cheapest agent to every row's best."""
    rewards, cost = np.asarray(rewards, float), np.asarray(cost, float)
    rows = len(rewards)
    start_cost, start_quality, steps = 0.0, 0.0, []
    for reward_row, cost_row in zip(rewards, cost, strict=True):
        order = np.lexsort((-reward_row, cost_row))  # by cost, the better first among equal costs
        here_cost, here_reward = cost_row[order[0]], reward_row[order[0]]
        start_cost, start_quality = start_cost + here_cost, start_quality + here_reward
        while True:  # the next hull vertex: the steepest gain per extra cost among dearer, better agents
            better = [j for j in order if reward_row[j] > here_reward + _TIE]
            if not better:
                break
            slopes = [(reward_row[j] - here_reward) / max(cost_row[j] - here_cost, _TIE) for j in better]
            j = better[int(np.argmax(slopes))]
            steps.append((slopes[int(np.argmax(slopes))], cost_row[j] - here_cost, reward_row[j] - here_reward))
            here_cost, here_reward = cost_row[j], reward_row[j]
    steps.sort(key=lambda step: -step[0])
    costs, qualities = [start_cost / rows], [start_quality / rows]
    for _, extra_cost, extra_reward in steps:
        costs.append(costs[-1] + extra_cost / rows)
        qualities.append(qualities[-1] + extra_reward / rows)
    return np.asarray(costs), np.asarray(qualities)


def oracle_curve(gap: PoolGap, rewards: np.ndarray, cost: np.ndarray) -> GapCurve:
    """The oracle's frontier (oracle_frontier) on a gap, flat from its end to the best agent's cost. Two
    agents: RouteLLM's get_optimal_accuracy at every share."""
    costs, qualities = oracle_frontier(rewards, cost)
    if costs[-1] < gap.best_cost:
        costs, qualities = np.append(costs, gap.best_cost), np.append(qualities, qualities[-1])
    return GapCurve("oracle", gap.normalise(costs), qualities)


def two_agent_gap(rewards: np.ndarray, agents: Sequence[str], strong: int) -> PoolGap:
    """The gap of a two-agent table with RouteLLM's cost: one per call to the strong agent, none otherwise."""
    if rewards.shape[1] != 2:
        raise InputError(f"RouteLLM's metrics are for two agents; this pool has {rewards.shape[1]}.")
    cost = np.zeros_like(rewards, dtype=float)
    cost[:, strong] = 1.0
    gap = PoolGap.of(rewards, cost, agents, cost_unit="strong calls per query")
    if gap.best != strong:
        raise InputError(f"{agents[strong]} is not the better agent on these rows; there is no gap for it to close.")
    return gap


def score_curve(name: str, scores: np.ndarray, rewards: np.ndarray, strong: int, num_results: int) -> GapCurve:
    """A two-agent router's RouteLLM curve from its per-query scores for the strong agent (column `strong`)."""
    shares, accuracies = threshold_sweep(scores, rewards[:, strong], rewards[:, 1 - strong], num_results)
    return GapCurve(name, shares, accuracies)


def frontier_gap(result: Any, rewards: np.ndarray, cost_per_1k: np.ndarray) -> dict[str, Any]:
    """A cross-validated frontier's gap figures: its router points and each kNN line as curves between
    the cheapest and the best agent (cost in USD per 1,000 queries), random and the in-sample oracle.
    {"pool": PoolGap.record} with `curves` and `gap` for plotting, or {"pool": {"note": ...}}."""
    try:
        priced = PoolGap.of(rewards, cost_per_1k, result.agents, cost_unit="USD per 1,000 queries")
    except InputError as err:
        return {"pool": {"note": str(err)}}
    lines: dict[str, list[Any]] = {"router (CV)": result.of_kind("router")}
    for point in result.of_kind("knn"):
        lines.setdefault(f"kNN k={point.name[3:].split()[0]} (CV)", []).append(point)
    curves = [
        priced.curve_of_points(name, [p.cost_per_1k for p in points], [p.reward for p in points])
        for name, points in lines.items()
    ]
    curves += [priced.random(), oracle_curve(priced, rewards, cost_per_1k)]
    return {"pool": priced.record(curves), "curves": curves, "gap": priced}
