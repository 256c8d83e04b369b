"""A router's figures on one held-out fold, from its operating points (cost per 1,000 queries, accuracy):

- `share`: the least share of the reference's cost (the single model best on the training rows) at which
  a random mix of the router's points reaches the reference's held-out accuracy (frontier.cost_to_reach
  over their non-decreasing convex hull); None when no mix reaches it;
- `best`: the router's best held-out accuracy over its points;
- `aiq`: RouterBench's AIQ (frontier.area_under_frontier) over the fold's shared cost window
  (frontier.aiq_window over every router and the zero router, as RouterBench's calc_AIQ).

Two references besides the single models: RouterBench's zero router, the non-decreasing convex hull of
the single models (mixing them at random in proportions), and the oracle (frontier.gap.oracle_curve: the
least mean cost for each accuracy when every answer is known).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from benchgen_router.frontier.pareto import area_under_frontier, cost_to_reach

Points = list[tuple[float, float]]


@dataclass(frozen=True)
class CurveFigures:
    share: float | None  # cost to reach the reference's accuracy, as a share of the reference's cost
    best: float
    aiq: float

    def to_dict(self) -> dict[str, float | None]:
        return {"share_at_reference": self.share, "best_accuracy": self.best, "aiq": self.aiq}


def points_of_picks(picks: np.ndarray, rewards: np.ndarray, cost_per_1k: np.ndarray) -> tuple[float, float]:
    """(mean cost per 1,000 queries, accuracy) of per-row picks on held-out rows."""
    rows = np.arange(len(picks))
    return float(cost_per_1k[rows, picks].mean()), float(rewards[rows, picks].mean())


def single_models(rewards: np.ndarray, cost_per_1k: np.ndarray) -> Points:
    """Each agent's (mean cost per 1,000 queries, accuracy) when it answers every row."""
    return list(zip(cost_per_1k.mean(axis=0).tolist(), rewards.mean(axis=0).tolist(), strict=True))


def best_single_model(rewards: np.ndarray, cost_per_1k: np.ndarray) -> int:
    """The agent with the highest accuracy (the cheaper one on ties): whom a user without a router calls."""
    accuracy, cost = rewards.mean(axis=0), cost_per_1k.mean(axis=0)
    return int(min(range(len(accuracy)), key=lambda j: (-accuracy[j], cost[j])))


def oracle_points(rewards: np.ndarray, cost_per_1k: np.ndarray) -> Points:
    """The oracle's curve: the least mean cost for each accuracy, knowing every answer (exact)."""
    from benchgen_router.frontier.gap import oracle_frontier

    costs, qualities = oracle_frontier(rewards, cost_per_1k)
    return list(zip(costs.tolist(), qualities.tolist(), strict=True))


def figures(points: Sequence[tuple[float, float]], reference: tuple[float, float], window: tuple[float, float]):
    """CurveFigures of a router's points against the reference (cost, accuracy) over the AIQ window."""
    reached = cost_to_reach(points, reference[1])
    share = None if reached is None or reference[0] <= 0 else reached / reference[0]
    return CurveFigures(share, max(quality for _, quality in points), area_under_frontier(points, *window))
