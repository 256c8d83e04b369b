"""LiteLLM's own auto-router beside the probability head: its built-in complexity classifier, as shipped
(ComplexityRouter.classify with the default config), scored on the held-out folds of the routing-value
benchmark (bench.value) with that benchmark's metrics, so that every figure lines up with the router's.

    result = run_value_benchmark(matrix, ValueConfig(routers=("probability",), group_folds=0))
    comparison = compare(matrix, result, classify(matrix.prompts))

LiteLLM's classifier scores a prompt from keywords and length and cuts the score into four tiers (SIMPLE,
MEDIUM, COMPLEX, REASONING) at its shipped boundaries; a tier is served by one model. Two of its curves:
- `shipped`: the tiers at the shipped boundaries, each served by the agent `tier_agents` gives it;
- `swept`: its score swept as RouteLLM sweeps a router's score, between the same two agents: every
  distinct score as a threshold (a query at or above it goes to the top agent), and for two agents
  RouteLLM's own equal-count thresholds (frontier.gap.score_curve) for APGR and CPT.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchgen_router.bench.value import metrics
from benchgen_router.bench.value.data import OutcomeMatrix
from benchgen_router.bench.value.run import FoldResult, ValueResult
from benchgen_router.errors import InputError
from benchgen_router.frontier import gap as gp
from benchgen_router.frontier.pareto import aiq_window

TIERS = ("SIMPLE", "MEDIUM", "COMPLEX", "REASONING")
SHIPPED, SWEPT = "LiteLLM classifier, shipped tiers", "LiteLLM classifier, score swept"
# The router's curves compared (bench.value's keys), then the references.
OURS = {
    "probability/lambda": "probability head, lambda swept",
    "probability/tolerance": "probability head, tolerance swept",
}
REFERENCES = ("zero router", "oracle")


@dataclass
class Classified:
    """LiteLLM's verdict on each prompt: its tier and its score (higher: more complex)."""

    tiers: np.ndarray  # (rows,) str
    scores: np.ndarray  # (rows,) float


def classify(prompts: Sequence[str]) -> Classified:
    """ComplexityRouter.classify, default config, of each prompt as a user message (no system prompt)."""
    from litellm.router_strategy.complexity_router import ComplexityRouter

    router = ComplexityRouter("benchmark", ctx=None)  # the context is the owning Router's, unused to classify
    verdicts = [router.classify(prompt) for prompt in prompts]
    return Classified(
        np.array([tier.value for tier, _, _ in verdicts]), np.array([score for _, score, _ in verdicts], float)
    )


def tier_agents(rewards: np.ndarray, cost_per_1k: np.ndarray) -> dict[str, int]:
    """The agent serving each tier, from training rows, in two tiers as LiteLLM's defaults lay them out (a
    vendor's small model, gpt-4o-mini, for SIMPLE; its top models for COMPLEX and REASONING): COMPLEX and
    REASONING the most accurate agent, SIMPLE and MEDIUM the next one down the pool's cost-accuracy frontier
    (the most accurate of the agents that no other is both cheaper and at least as accurate as); with two
    agents, the cheaper."""
    accuracy, cost = rewards.mean(axis=0), cost_per_1k.mean(axis=0)
    top = metrics.best_single_model(rewards, cost_per_1k)

    def dominated(j: int) -> bool:
        return any(
            cost[k] <= cost[j] and accuracy[k] >= accuracy[j] and (cost[k], accuracy[k]) != (cost[j], accuracy[j])
            for k in range(len(cost))
        )

    cheaper = [j for j in range(len(cost)) if cost[j] < cost[top] and not dominated(j)]
    small = max(cheaper, key=lambda j: (accuracy[j], -cost[j])) if cheaper else top
    return {"SIMPLE": small, "MEDIUM": small, "COMPLEX": top, "REASONING": top}


def swept_picks(scores: np.ndarray, low: int, high: int) -> list[np.ndarray]:
    """The picks at every threshold over the scores: `high` for a score at or above it, else `low`; from
    all `high` to all `low`."""
    thresholds = [*np.unique(scores), np.inf]
    return [np.where(scores >= threshold, high, low) for threshold in thresholds]


@dataclass
class FoldComparison:
    """One held-out fold: each curve's points and figures over one AIQ window, the tier layout, and for two
    agents RouteLLM's figures."""

    rows: int
    reference: str
    reference_point: tuple[float, float]
    layout: dict[str, str]
    shares: dict[str, float]  # share of the held-out queries in each tier
    curves: dict[str, metrics.Points]
    figures: dict[str, metrics.CurveFigures]
    window: tuple[float, float]
    same_window: bool  # the AIQ window is the benchmark's own (LiteLLM's curves do not widen it)
    gap: dict[str, dict[str, float]] = field(default_factory=dict)


def held_out_rows(result: ValueResult, rows: int) -> list[np.ndarray]:
    """The held-out rows of each k-fold fold of `result`, in its order (bench.value draws them alike)."""
    from benchgen_router.frontier.cv import fold_assignments

    config = result.config
    assignment = fold_assignments(rows, config.folds, config.repeats, config.seed)
    return [folds == fold for folds in assignment for fold in range(int(folds.max()) + 1)]


def compare(matrix: OutcomeMatrix, result: ValueResult, classified: Classified) -> list[FoldComparison]:
    """LiteLLM's curves on every k-fold fold of `result`, beside the router's curves from the same fold."""
    folds = [fold for fold in result.folds if fold.kind == "k-fold"]
    tests = held_out_rows(result, len(matrix))
    if [int(test.sum()) for test in tests] != [fold.rows for fold in folds]:
        raise InputError("the result's folds are not this matrix's: run the benchmark on it with the same settings.")
    num_results = result.config.num_results
    return [_compare_fold(matrix, fold, test, classified, num_results) for fold, test in zip(folds, tests, strict=True)]


def _compare_fold(
    matrix: OutcomeMatrix, fold: FoldResult, test: np.ndarray, classified: Classified, num_results: int
) -> FoldComparison:
    rewards, cost = matrix.rewards[test], matrix.cost_per_1k[test]
    layout = tier_agents(matrix.rewards[~test], matrix.cost_per_1k[~test])
    tiers, scores = classified.tiers[test], classified.scores[test]
    shipped = np.array([layout[tier] for tier in tiers])
    low, high = layout["SIMPLE"], layout["REASONING"]
    curves = {key: fold.curves[key] for key in (*OURS, "zero router") if key in fold.curves}
    curves[SHIPPED] = [metrics.points_of_picks(shipped, rewards, cost)]
    curves[SWEPT] = [metrics.points_of_picks(picks, rewards, cost) for picks in swept_picks(scores, low, high)]
    window = aiq_window(curves.values())  # RouterBench's: over every router compared, oracle aside
    curves["oracle"] = fold.curves["oracle"]
    comparison = FoldComparison(
        rows=int(test.sum()),
        reference=fold.reference,
        reference_point=fold.reference_point,
        layout={tier: matrix.agents[agent] for tier, agent in layout.items()},
        shares={tier: float(np.mean(tiers == tier)) for tier in TIERS},
        curves=curves,
        figures={key: metrics.figures(points, fold.reference_point, window) for key, points in curves.items()},
        window=window,
        same_window=bool(np.allclose(window, fold.window)),
    )
    if len(matrix.agents) == 2 and "figures" in fold.gap:
        comparison.gap = _two_agent_figures(fold, rewards, cost, scores, curves[SHIPPED][0], num_results)
    return comparison


def _two_agent_figures(
    fold: FoldResult, rewards: np.ndarray, cost: np.ndarray, scores: np.ndarray, shipped: tuple, num_results: int
) -> dict[str, dict[str, float]]:
    """RouteLLM's APGR and CPT of LiteLLM's curves on this fold, beside the router's from the same run."""
    pool = gp.PoolGap.of(rewards, cost, ["0", "1"])
    found = {
        SWEPT: gp.score_curve(SWEPT, scores, rewards, pool.best, num_results),
        SHIPPED: pool.curve_of_points(SHIPPED, [shipped[0]], [shipped[1]]),  # joined to always-weak and -strong
    }
    figures = {name: pool.figures(curve).to_dict() for name, curve in found.items()}
    ours = {"probability": "probability head, margin swept", "random": "random", "oracle": "oracle"}
    figures.update({label: fold.gap["figures"][key] for key, label in ours.items() if key in fold.gap["figures"]})
    return figures


def spread(values: Sequence[float]) -> tuple[float, float]:
    array = np.asarray(values, dtype=float)
    return float(array.mean()), float(array.std(ddof=1)) if len(array) > 1 else 0.0


def summary(comparisons: Sequence[FoldComparison]) -> dict[str, Any]:
    """Per curve over the folds: the cost share at the reference's accuracy (mean and std over the folds that
    reach it, and how many do), best accuracy and AIQ; per two-agent figure, mean and std."""
    curves: dict[str, Any] = {}
    for key in comparisons[0].figures:
        runs = [comparison.figures[key] for comparison in comparisons]
        shares = [run.share for run in runs if run.share is not None]
        record: dict[str, Any] = {"folds": len(runs), "reached": len(shares)}
        if shares:
            record["share"], record["share_std"] = spread(shares)
        record["best"], record["best_std"] = spread([run.best for run in runs])
        record["aiq"], record["aiq_std"] = spread([run.aiq for run in runs])
        curves[key] = record
    gap: dict[str, Any] = {}
    for name in comparisons[0].gap:
        runs = [comparison.gap[name] for comparison in comparisons if name in comparison.gap]
        gap[name] = {key: spread([run[key] for run in runs]) for key in ("apgr", "cpt_50", "cpt_80")}
    tiers = {tier: spread([comparison.shares[tier] for comparison in comparisons])[0] for tier in TIERS}
    layouts = sorted({tuple(comparison.layout.items()) for comparison in comparisons})
    return {
        "curves": curves,
        "gap": gap,
        "tier_shares": tiers,
        "layouts": [dict(layout) for layout in layouts],
        "same_window": sum(comparison.same_window for comparison in comparisons),
    }


def format_comparison(name: str, result: ValueResult, comparisons: Sequence[FoldComparison]) -> str:
    """Markdown: the tier layout, LiteLLM's tiers on the held-out queries, then every curve's figures (and for
    two agents RouteLLM's), mean ± std over the folds."""
    table = summary(comparisons)
    layouts = "; ".join(", ".join(f"{tier} {agent}" for tier, agent in layout.items()) for layout in table["layouts"])
    tiers = ", ".join(f"{tier} {100 * share:.1f}%" for tier, share in table["tier_shares"].items())
    lines = [
        f"#### {name} ({len(comparisons)} held-out folds of about {comparisons[0].rows} queries; "
        f"{result.rows} queries, {len(result.agents)} agents)",
        "",
        f"Tiers served by: {layouts}. LiteLLM's tiers of the held-out queries: {tiers}. AIQ window: the "
        f"benchmark's own on {table['same_window']} of {len(comparisons)} folds.",
        "",
        "| router | cost share at the reference's accuracy | best accuracy | AIQ |",
        "| --- | ---: | ---: | ---: |",
    ]
    for key, record in table["curves"].items():
        if record["reached"] == 0:
            share = "never"
        else:
            share = f"{100 * record['share']:.1f}% ± {100 * record['share_std']:.1f}"
            if record["reached"] < record["folds"]:
                share += f" ({record['reached']} of {record['folds']} folds)"
        lines.append(
            f"| {OURS.get(key, key)} | {share} | {record['best']:.4f} ± {record['best_std']:.4f} "
            f"| {record['aiq']:.4f} ± {record['aiq_std']:.4f} |"
        )
    if table["gap"]:
        lines += ["", "| router (RouteLLM's figures) | APGR | CPT(50%) | CPT(80%) |", "| --- | ---: | ---: | ---: |"]
        for label, record in table["gap"].items():
            (apgr, apgr_std), (cpt50, cpt50_std), (cpt80, cpt80_std) = (record[k] for k in ("apgr", "cpt_50", "cpt_80"))
            lines.append(
                f"| {label} | {apgr:.3f} ± {apgr_std:.3f} | {100 * cpt50:.1f}% ± {100 * cpt50_std:.1f} "
                f"| {100 * cpt80:.1f}% ± {100 * cpt80_std:.1f} |"
            )
    return "\n".join([*lines, ""])


def comparison_to_dict(name: str, result: ValueResult, comparisons: Sequence[FoldComparison]) -> dict[str, Any]:
    """The summary and every fold's points and figures, as plain JSON types."""
    return {
        "name": name,
        "agents": result.agents,
        "rows": result.rows,
        "cost_unit": result.cost_unit,
        "summary": summary(comparisons),
        "folds": [
            {
                "rows": comparison.rows,
                "reference": comparison.reference,
                "reference_point": list(comparison.reference_point),
                "layout": comparison.layout,
                "tier_shares": comparison.shares,
                "window": list(comparison.window),
                "same_window": comparison.same_window,
                "curves": {key: [list(point) for point in points] for key, points in comparison.curves.items()},
                "figures": {key: figures.to_dict() for key, figures in comparison.figures.items()},
                "routellm": comparison.gap,
            }
            for comparison in comparisons
        ],
    }


def plot_comparisons(panels: Sequence[tuple[str, str, Sequence[FoldComparison]]], png: Any) -> None:
    """Accuracy against cost per 1,000 queries, one panel per (title, cost unit, folds): each curve's mean
    held-out hull (bench.value's mean_curve), which for LiteLLM's shipped tiers, one point, is flat from it."""
    from benchgen_router.bench.value.report import mean_curve
    from benchgen_router.frontier.plots import plot_curve_panels

    drawn = []
    for title, unit, comparisons in panels:
        costs = [cost for comparison in comparisons for points in comparison.curves.values() for cost, _ in points]
        grid = np.linspace(0.0, max(costs), 300)
        lines = [
            (OURS.get(key, key), grid, curve)
            for key in comparisons[0].curves
            if (curve := mean_curve(comparisons, key, grid)) is not None
        ]
        drawn.append((f"{title} ({len(comparisons)} folds; cost: {unit})", lines, []))
    plot_curve_panels(drawn, png, "cost per 1,000 queries", "accuracy (held out, mean over folds)")
