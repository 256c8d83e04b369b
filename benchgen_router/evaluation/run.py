"""Evaluating a router on reward data: the library behind `benchgen-router evaluate`.

    from benchgen_router.evaluation import EvaluateConfig, evaluate
    report = evaluate(EvaluateConfig(rewards="rewards.jsonl", tasks="tasks.v1.jsonl"))
    report.evaluations[report.primary]["router"]

Every labelled prompt is routed as the router serves it, at each of its operating points, in both
forms the data allow (as given, and as users type them). With per-call records the points are
also placed against the fixed agents on cost and latency; a guarded router's guard is measured on
the out-of-distribution query set. The gap-recovered figures (frontier.gap) come with every run of a
two-agent pool (RouteLLM's APGR and CPT) and, with per-call records, with any pool. In-sample: rows
the router was trained on flatter it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from benchgen_router.errors import InputError, setting_error

IN_SAMPLE_NOTE = (
    "in-sample evaluation of a fixed router on the given rows (no cross-validation, so ±rep and ±fold are 0): "
    "rows the router was trained on make its figures optimistic"
)


@dataclass
class EvaluateConfig:
    """What an evaluation reads; `benchgen-router evaluate --help` describes each (flag = the name
    with dashes). `plot` is a prefix: PREFIX-cost.png, PREFIX-latency.png and PREFIX-gap.png (needs `calls`)."""

    rewards: str
    tasks: str
    model: str | None = None  # None: the committed default router
    split: str | None = None
    backbone: str | None = None
    device: str = "cpu"
    dtype: str = "auto"
    allow_emulated_bf16: bool = False
    batch_size: int | None = None
    max_batch_tokens: int | None = None
    ood_queries: Path | None = None
    operating_point: str | None = None
    tradeoffs: list[str] | None = None  # a probability head's rules (docs/tradeoff.md), each evaluated as a point
    calls: Path | None = None
    pool: Path | None = None
    plot: str | None = None
    no_progress: bool = False


@dataclass
class EvaluateReport:
    """The evaluation of each point (None: a single head; with `tradeoffs`, each rule is a point) on the
    prompts as given (`evaluations`)
    and in every form (`by_form`), the cost frontier (`frontier`: the evaluate_policies result, and
    `frontier_record` as stored) and the guard's measurement, when there are calls and a guard."""

    title: str
    primary: str | None
    points: list[str | None]
    evaluations: dict[str | None, dict[str, Any]]
    by_form: dict[str, dict[str, dict[str, Any]]]
    tradeoffs: bool = False  # the points are a probability head's trade-off rules, not operating points
    frontier: Any = None
    frontier_record: dict[str, Any] | None = None
    frontier_title: str = ""
    cost_notes: list[str] = field(default_factory=list)
    guard: dict[str, Any] | None = None
    gap: dict[str, Any] = field(default_factory=dict)  # routing_gap's record
    gap_curves: list[Any] = field(default_factory=list)  # (title, [GapCurve], its PoolGap) per panel

    def record(self, config: EvaluateConfig) -> dict[str, Any]:
        """The JSON record `--output-json` writes."""
        record = {"model": config.model, "rewards": config.rewards, "split": config.split}
        record.update(self.evaluations[self.primary])
        if self.primary is not None:
            kind = "tradeoff" if self.tradeoffs else "operating_point"
            record[kind] = self.primary
            record[f"{kind}s"] = {point: self.evaluations[point] for point in self.points}
        record["forms"] = self.by_form
        if self.frontier_record is not None:
            record["cost_frontier"] = self.frontier_record
        if self.guard is not None:
            record["ood_guard"] = self.guard
        if self.gap:
            record["routing_gap"] = self.gap
        return record


def in_pool_order(costs: Any, pool: list[str]) -> Any:
    """The cost data with its agent columns in the router's logit order, like the picks."""
    order = [costs.agents.index(agent) for agent in pool]
    return replace(
        costs,
        agents=list(pool),
        rewards=costs.rewards[:, order],
        cost_usd=costs.cost_usd[:, order],
        latency_s=costs.latency_s[:, order],
        calls=costs.calls[:, order],
    )


def point_name(point: str | None, form: str = "formatted") -> str:
    name = "router" if point is None else f"router {point}"
    return name if form == "formatted" else f"{name} [{form}]"


def evaluate(config: EvaluateConfig) -> EvaluateReport:
    """Route the labelled prompts and score the picks (see the module docstring); InputError for
    input that does not fit (no rows, another pool, calls that miss the evaluated tasks)."""
    from benchgen_router.costs import costs_for_labelled
    from benchgen_router.evaluation.metrics import evaluate_picks
    from benchgen_router.forms import FORMS, in_form
    from benchgen_router.loading import load_router
    from benchgen_router.routing import route_queries

    if config.ood_queries is not None and not config.ood_queries.is_file():
        raise setting_error(f"{{ood_queries}} {config.ood_queries} not found; pass a JSONL file of query, group rows.")
    data = labelled_rows(config)
    # before the router loads: calls that do not cover the evaluated tasks fail at once
    costs = None if config.calls is None else costs_for_labelled(data, config.calls, config.pool)
    model, tokenizer = load_router(
        config.model,
        device=config.device,
        dtype=config.dtype,
        backbone=config.backbone,
        allow_emulated_bf16=config.allow_emulated_bf16,
    )
    pool = model.config.agent_order
    if sorted(pool) != sorted(data.agents):
        raise InputError(
            f"the router's pool {pool} is not the rewards' agent_order {data.agents}; "
            "evaluate against rewards measured for this router's agents."
        )
    points = evaluated_points(model, config)
    primary = model.config.operating_point if model.config.operating_point in points else points[0]
    at_point = "tradeoffs" if config.tradeoffs else "operating_points"
    rewards = data.rewards[:, [data.agents.index(agent) for agent in pool]]  # columns in logit order
    route = partial(
        route_queries,
        model,
        tokenizer,
        batch_size=config.batch_size,
        max_batch_tokens=config.max_batch_tokens,
        progress=not config.no_progress,
    )
    where = f"{config.model or 'the default router'}"
    report = EvaluateReport(
        title=f"evaluation of {where}",
        primary=primary,
        points=points,
        evaluations={},
        by_form={f: {} for f in FORMS},
        tradeoffs=bool(config.tradeoffs),
    )
    # Each point on the prompts as the data gives them and as users type them (forms.FORMS).
    routed = {
        (form, point): route(in_form(data.prompts, form), **{at_point: point}) for form in FORMS for point in points
    }
    picks_at = {key: routed_at.picks for key, routed_at in routed.items()}
    for (form, point), picks in picks_at.items():
        evaluation = evaluate_picks(picks, rewards, pool)
        if routed[form, point].out_of_distribution is not None:
            evaluation["flagged_share"] = float(routed[form, point].out_of_distribution.mean())
        report.by_form[form][point or "router"] = evaluation
        if form == "formatted":
            report.evaluations[point] = evaluation
    costs_in_order = None if costs is None else in_pool_order(costs, pool)
    routing_gap(report, rewards, pool, routed["formatted", primary].logits, picks_at, costs_in_order)
    if costs_in_order is not None:
        place_against_fixed_agents(report, model, costs_in_order, picks_at, config)
    if model.guards_queries:
        report.guard = guard_report(model, config, len(data), route, {form: routed[form, points[0]] for form in FORMS})
    return report


def labelled_rows(config: EvaluateConfig) -> Any:
    """The rewards joined to their tasks, only config.split's rows when it is given."""
    from benchgen_router.data import join_rewards, load_rows

    data = join_rewards(load_rows(config.rewards, "rewards"), load_rows(config.tasks, "tasks"), min_rows=1)
    if config.split is not None:
        rows = np.array([split == config.split for split in data.splits])
        if not rows.any():
            present = sorted({s for s in data.splits if s is not None})
            raise InputError(f"no joined row has split '{config.split}' (splits present: {present or 'none'}).")
        data = data.subset(rows)
    return data


def evaluated_points(model: Any, config: EvaluateConfig) -> list[str | None]:
    """The operating points, or trade-off rules, to evaluate; None stands for a single-head router's only
    head, as in results_for."""
    from benchgen_router.routing import operating_point_of, tradeoff_of

    if config.tradeoffs:
        if config.operating_point is not None:
            raise InputError("--tradeoff and --operating-point exclude each other; a probability head has no points.")
        return [tradeoff_of(model, rule) for rule in dict.fromkeys(config.tradeoffs)]
    if config.operating_point is not None:
        return [operating_point_of(model, config.operating_point)]
    return list(model.config.operating_points) or [None]


def guard_report(
    model: Any, config: EvaluateConfig, rows: int, route: Callable[..., Any], routed_by_form: dict[str, Any]
) -> dict[str, Any] | None:
    """The guard against the OOD query set (config.ood_queries, else the packaged one; None when neither
    is there): its AUROC and flag rates, and the share it flags of the evaluated prompts in each form."""
    from benchgen_router.ood import PACKAGED_OOD_QUERIES, evaluate_guard, read_ood_queries

    queries_file = config.ood_queries or PACKAGED_OOD_QUERIES
    if not queries_file.is_file():
        return None
    queries, groups = read_ood_queries(queries_file)
    where = f"the {rows} evaluated prompts" + (f" of split '{config.split}'" if config.split else "")
    guard = evaluate_guard(
        float(model.ood_threshold), routed_by_form["formatted"].ood_scores, route(queries).ood_scores, groups, where
    )
    guard["ood_queries_file"] = str(queries_file)
    for form, routed in routed_by_form.items():
        guard[f"{form}_flagged_share"] = float(routed.out_of_distribution.mean())
    return guard


def routing_gap(
    report: EvaluateReport,
    rewards: np.ndarray,
    pool: list[str],
    logits: np.ndarray,
    picks_at: dict[tuple[str, str | None], Any],
    costs: Any,
) -> None:
    """The gap-recovered figures (frontier.gap) into the report: for two agents RouteLLM's APGR and
    CPT of the router's logit margin swept at RouteLLM's thresholds (cost: the share of calls to the
    better agent); with per-call costs, for any pool, the quality-cost area of the router's points and
    the cost to recover 50% and 80% of the gap. Random and the oracle beside each. A table with no gap
    gets a note instead."""
    from benchgen_router.frontier import gap as gp

    points = [picks for (form, _), picks in picks_at.items() if form == "formatted"]
    if len(pool) == 2:
        strong = int(np.argmax(rewards.mean(axis=0)))
        try:
            two = gp.two_agent_gap(rewards, pool, strong)
        except InputError as err:
            report.gap["two_agents"] = {"note": str(err)}
        else:
            margin = logits[:, strong] - logits[:, 1 - strong]
            curves = [
                gp.score_curve("router", margin, rewards, strong, gp.ROUTELLM_NUM_RESULTS),
                two.random(),
                gp.oracle_curve(two, rewards, two_agent_costs(len(rewards), strong)),
            ]
            report.gap["two_agents"] = {**two.record(curves), "num_results": gp.ROUTELLM_NUM_RESULTS}
            report.gap_curves.append(("two agents: share of calls to the better agent", curves, two))
    if costs is not None:
        try:
            priced = gp.PoolGap.of(rewards, costs.cost_per_1k, pool, cost_unit="USD per 1,000 queries")
        except InputError as err:
            report.gap["pool"] = {"note": str(err)}
        else:
            curves = [
                priced.curve_of_picks("router", points, rewards, costs.cost_per_1k),
                priced.random(),
                gp.oracle_curve(priced, rewards, costs.cost_per_1k),
            ]
            report.gap["pool"] = priced.record(curves)
            report.gap_curves.append(("pool: cost per 1,000 queries", curves, priced))


def two_agent_costs(rows: int, strong: int) -> np.ndarray:
    """RouteLLM's cost: one per call to the strong agent."""
    cost = np.zeros((rows, 2))
    cost[:, strong] = 1.0
    return cost


def place_against_fixed_agents(
    report: EvaluateReport,
    model: Any,
    costs: Any,
    picks_at: dict[tuple[str, str | None], Any],
    config: EvaluateConfig,
) -> None:
    """The evaluated points' cost and latency against the baselines, into the report (and drawn with
    `plot`): frontier_to_dict's layout plus where it came from."""
    from benchgen_router import frontier as fr

    settings = model.config.operating_points
    weights = {
        point_name(point, form): (settings[point]["cost_weight"], settings[point]["latency_weight"])
        for form, point in picks_at
        if point in settings
    }
    formatted = {point_name(point): picks for (form, point), picks in picks_at.items() if form == "formatted"}
    other = {point_name(point, form): picks for (form, point), picks in picks_at.items() if form != "formatted"}
    result = fr.evaluate_policies(costs, formatted, weights, other)
    where = f"{config.model or 'the default router'} on {result.rows} rows" + (
        f" of split '{config.split}'" if config.split else ""
    )
    if config.plot is not None:
        fr.plot_policies(
            result, f"{config.plot}-cost.png", f"{config.plot}-latency.png", title=f"{where}: in-sample, no CV"
        )
        if report.gap_curves:
            fr.plot_gap_curves(report.gap_curves, f"{config.plot}-gap.png", title=f"{where}: in-sample, no CV")
    stored = fr.frontier_to_dict(result)
    stored.update(
        {
            "evaluation": IN_SAMPLE_NOTE,
            "calls": str(config.calls),
            "pool": None if config.pool is None else str(config.pool),
            "notes": list(costs.notes),
            "tradeoffs" if report.tradeoffs else "operating_points": {
                point: point_name(point) for _, point in picks_at if point is not None
            },
        }
    )
    report.frontier, report.frontier_record, report.cost_notes = result, stored, list(costs.notes)
    report.frontier_title = f"cost and latency of {where}; reference: {result.reference}\n{IN_SAMPLE_NOTE}"
