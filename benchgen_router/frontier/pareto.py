"""Pareto geometry of policies on (cost or latency, reward): dominance, the non-dominated frontier,
the reachable frontier (mixtures of policies), its area over a window, and the headline summary."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from benchgen_router.frontier.cv import CVPoint, FrontierResult


_TIE = 1e-12


# The policies a user chooses between when deploying: the frontier is drawn over these. kNN is a
# baseline for the search (compared point by point and by area), and oracles see the answers.
FRONTIER_KINDS = ("router", "fixed", "best_fixed_train", "random")


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
    """RouterBench's AIQ (Hu et al., arXiv 2403.12031, "average improvement in quality") of a router's
    (cost, quality) points over the cost window [low, high]: (1 / (high - low)) times the integral over the
    window of f, the points' non-decreasing convex hull (reachable_frontier: any random mix of the points
    is reachable, so f is their upper concave hull up to the best point, flat after it), 0 below the
    cheapest point, where nothing is reachable (as RouterBench's calc_AIQ, which integrates from 0). f is
    piecewise linear, so the integral is an exact sum of trapezoids. Routers are compared over one shared
    window (aiq_window)."""
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


def aiq_window(curves: Iterable[Iterable[tuple[float, float]]]) -> tuple[float, float]:
    """RouterBench's shared cost window for the AIQ of several routers (its calc_AIQ): from 0 to the
    largest cost at which any of their non-decreasing convex hulls reaches its best quality (past it, every
    hull is flat)."""
    peaks = [reachable_frontier(points)[-1][0] for points in curves]
    if not peaks:
        raise ValueError("no curves")
    return 0.0, max(peaks)


def cost_to_reach(points: Iterable[tuple[float, float]], quality: float) -> float | None:
    """The least mean cost at which a random mix of the points reaches `quality` (where reachable_frontier
    first attains it), or None when no mix does."""
    previous: tuple[float, float] | None = None
    for x, y in reachable_frontier(points):
        if y >= quality - _TIE:
            if previous is None:  # the cheapest point already reaches it
                return x
            (x1, y1) = previous
            return x1 + (x - x1) * (quality - y1) / (y - y1)
        previous = (x, y)
    return None


def cheapest_within(
    points: Sequence[CVPoint], target_reward: float, eps: float, by: str = "cost_per_1k"
) -> CVPoint | None:
    """The point with the lowest `by` (cost_per_1k or latency_s) whose reward is >= target - eps."""
    eligible = [point for point in points if point.reward >= target_reward - eps - _TIE]
    return min(eligible, key=lambda p: (getattr(p, by), -p.reward)) if eligible else None


def saving(value: float, reference: float) -> float | None:
    """1 - value / reference: the share of the reference's cost or latency saved; None (no figure) when
    the reference's is 0 (every call priced at 0 or answered in 0 ms), against which nothing is saved."""
    return 1 - value / reference if reference > 0 else None


def share_text(saved: float | None, what: str) -> str:
    """`73% of its latency`, or that no share exists against a reference of 0."""
    return f"{100 * (1 - saved):.0f}% of its {what}" if saved is not None else f"no share of its {what} (which is 0)"


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
                "cost_saving": saving(best.cost_per_1k, reference.cost_per_1k),
                "latency_saving": saving(best.latency_s, reference.latency_s),
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


def headline_text(summary: dict[str, Any], names: dict[str, str] | None = None, figures: bool = True) -> str:
    """headline()'s summary as one sentence: the cheapest router point at equal quality, and dominance.
    `names` renames router points (e.g. "router lc0.2_ll0" -> an operating point's name); without
    `figures` the sentence names the points only (for a card whose table holds the figures) and says
    whether the cheapest point at equal quality costs less than the reference, which is all the table
    can be read to support."""
    best = summary.get("cheapest_router_by_cost")
    names = names or {}
    reference = summary.get("reference")
    if figures:
        within = f"within {summary['eps']:.4f} reward of {reference} (equal quality: the paired se"
    else:
        within = f"at equal quality with {reference} (within the paired se"
    if best is None:
        text = f"no router point is {within})"
    elif figures:
        text = (
            f"cheapest router point {within} of the reward-only point): {names.get(best['name'], best['name'])}, "
            f"{best['reward']:.4f} (Δ {best['delta_reward']:+.4f} ± {best['delta_se']:.4f}) at "
            f"{share_text(best['cost_saving'], 'cost')} and {share_text(best['latency_saving'], 'latency')}"
        )
    elif best["cost_saving"] is not None and best["cost_saving"] > 0:
        name = names.get(best["name"], best["name"])
        text = f"the cheapest router point {within} of the reward-only point) is {name}, which costs less than it"
    else:  # the cheapest point at equal quality costs as much as the reference or more: no saving to claim
        name = names.get(best["name"], best["name"])
        text = f"no router point {within} of the reward-only point) costs less than it; the cheapest of them is {name}"
    dominated = [name for name, by in summary.get("fixed_agents_dominated_by_a_router", {}).items() if by]
    every = summary.get("router_dominates_every_fixed_agent")
    return (
        f"{text}; a router point dominates {'every fixed agent' if every else ', '.join(dominated) or 'no fixed agent'}"
        " on reward and cost"
    )
