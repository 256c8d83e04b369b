"""The frontier as text and as JSON: the table the trainer prints, and the dict stored with a run
(and read back)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchgen_router.errors import InputError
from benchgen_router.frontier.cv import CVPoint, FrontierResult
from benchgen_router.frontier.grid import Tradeoff
from benchgen_router.frontier.pareto import headline, mark_frontier


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
        raise InputError(f"stored frontier is incomplete ({err}); pass what frontier_to_dict wrote.") from None


def format_gap(record: dict[str, Any]) -> str:
    """The gap-recovered figures (frontier.gap records, as evaluate and frontier store them) as text:
    for two agents RouteLLM's APGR and CPT, for a priced pool the quality-cost area and the cost to
    recover 50% and 80% of the gap between the cheapest and the best agent."""
    lines = []
    two = record.get("two_agents")
    if two is not None:
        if "note" in two:
            lines.append(f"RouteLLM's APGR and CPT: none ({two['note']})")
        else:
            lines.append(
                f"RouteLLM's metrics (strong {two['best']} {two['best_quality']:.4f}, weak {two['cheapest']} "
                f"{two['cheapest_quality']:.4f}; cost: share of calls to the strong agent; the router's logit "
                f"margin swept at {two['num_results']}-bin thresholds as routellm/evals does)"
            )
            for name, figures in two["policies"].items():
                lines.append(
                    f"  {name:<8} APGR {figures['apgr']:.3f}  CPT(50%) {100 * figures['cpt_50']:5.1f}%  "
                    f"CPT(80%) {100 * figures['cpt_80']:5.1f}%"
                )
    pool = record.get("pool")
    if pool is not None:
        if "note" in pool:
            lines.append(f"quality-cost gap: none ({pool['note']})")
        else:
            unit = pool["cost_unit"]
            lines.append(
                f"quality against cost, gap from the cheapest agent ({pool['cheapest']}: {pool['cheapest_quality']:.4f}"
                f" at {pool['cheapest_cost']:.4f}) to the best ({pool['best']}: {pool['best_quality']:.4f} at "
                f"{pool['best_cost']:.4f}), cost in {unit}; area: the gap recovered, averaged over that cost range"
            )
            for name, figures in pool["policies"].items():
                lines.append(
                    f"  {name:<8} area {figures['apgr']:.3f}  to recover 50%: {figures['cost_to_recover_50']:.4f} "
                    f"({100 * figures['cpt_50']:.1f}% of the range)  80%: {figures['cost_to_recover_80']:.4f} "
                    f"({100 * figures['cpt_80']:.1f}%)"
                )
    return "\n".join(lines)
