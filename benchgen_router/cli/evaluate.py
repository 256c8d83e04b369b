"""benchgen-router evaluate: score a converted router against reward data, with the trainer's table.

    benchgen-router evaluate --model router/ --rewards rewards.jsonl --tasks tasks.jsonl [--split test]

Routes every labelled prompt through the router exactly as it serves (its own model code, weights
and truncation), then compares the picks' mean reward with the best fixed agent, a uniform random
agent and the per-question oracle on the same rows, and reports the share of the routing headroom
captured and how many queries went to each agent. With no --model, the committed default router is
evaluated.

A router with an out-of-distribution guard is scored as it serves (flagged prompts go to its
fallback agent), and the guard is measured on --ood-queries (default: the packaged set): AUROC of
the evaluated prompts against the OOD queries, overall and per group, the share of each group
flagged at the calibrated threshold and the share of the evaluated prompts kept. The evaluated
prompts may include the ones the guard was fitted on, which makes the kept share optimistic.

A router with operating points (one head per quality/cost/latency trade-off) is evaluated at each
of its points, or only at --operating-point; the top-level figures of --output-json are those of
its default point (or the one asked for).

With --calls (the raw per-call records, rewards.v1-pilot.jsonl format) it also reports each
evaluated point's mean reward, cost (USD per 1,000 queries), latency and share of queries per agent
against every fixed agent, uniform random and the per-task oracles on the same rows, with the
non-dominated marks and the area under the frontier (AIQ) with and without the router; --plot draws
them. This is an in-sample evaluation of a fixed router on the given rows, not cross-validation:
rows the router was trained on make it look better than it will on new queries.

Rewards and tasks are joined on task_id as in training (rows with no task are skipped). The
rewards must score the router's pool: the same agent ids, in any order.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from benchgen_router.cli.common import EXIT_CODES_HELP, add_batching_arguments, add_dtype_arguments
from benchgen_router.errors import UsageError
from benchgen_router.ood import group_lines

logger = logging.getLogger("benchgen_router")

HELP = "evaluate a router against reward data"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    summary, _, details = (__doc__ or "").partition("\n\n")
    parser.description, parser.epilog = summary, details + "\n" + EXIT_CODES_HELP
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--model", help="converted router folder or Hub id (default: the committed default router)")
    parser.add_argument("--rewards", required=True, help="rewards: local JSONL file or Hub dataset id")
    parser.add_argument("--tasks", required=True, help="task prompts: local JSONL file or Hub dataset id")
    parser.add_argument("--split", help="evaluate only the rows of this task split (default: every joined row)")
    parser.add_argument("--backbone", help="load the backbone from here instead of the id in the router's config")
    parser.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    add_dtype_arguments(parser)
    add_batching_arguments(parser)
    parser.add_argument(
        "--ood-queries",
        type=Path,
        help="out-of-distribution queries (JSONL: query, group) to measure a guarded router on "
        "(default: the packaged benchgen_router/data/ood_queries.jsonl)",
    )
    parser.add_argument(
        "--operating-point",
        metavar="NAME",
        help="evaluate only this operating point of the router (default: every point, or its single head)",
    )
    parser.add_argument(
        "--calls",
        type=Path,
        metavar="FILE",
        help="raw per-call records (JSONL: task_id, calls with agent, cost_usd, latency_ms, correct) for the "
        "router's in-sample cost and latency point against the fixed agents",
    )
    parser.add_argument(
        "--pool", type=Path, metavar="FILE", help="pool prices (agents.json) for calls without cost_usd; needs --calls"
    )
    parser.add_argument(
        "--plot", metavar="PREFIX", help="draw the cost table as PREFIX-cost.png and PREFIX-latency.png; needs --calls"
    )
    parser.add_argument("--output-json", type=Path, help="also write the evaluation to this JSON file")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def _check_readable(path: Path, flag: str, what: str) -> None:
    try:
        with path.open("rb"):
            pass
    except FileNotFoundError:
        raise UsageError(f"{flag} {path} not found; pass {what}.") from None
    except IsADirectoryError:
        raise UsageError(f"{flag} {path} is a folder; pass {what}.") from None
    except OSError as err:
        raise UsageError(f"cannot read {flag} {path} ({err.strerror}); pass {what} this user can read.") from None


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """File problems of the cost options, found before torch is imported and the router loaded."""
    for flag, value in (("--pool", args.pool), ("--plot", args.plot)):
        if value is not None and args.calls is None:
            raise UsageError(f"{flag} needs --calls (the raw per-call records the cost figures come from).")
    if args.calls is not None:
        _check_readable(args.calls, "--calls", "the raw per-call JSONL file (rewards.v1-pilot.jsonl format)")
    if args.pool is not None:
        _check_readable(args.pool, "--pool", "the pool file (agents.json)")
    if args.plot is not None:
        folder = Path(f"{args.plot}-cost.png").parent
        if not folder.is_dir():
            raise UsageError(f"--plot folder {folder} does not exist; create it or pass another prefix.")


def _in_pool_order(costs: Any, pool: list[str]) -> Any:
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


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from benchgen_router.costs import costs_for_labelled
    from benchgen_router.data import join_rewards, load_rows
    from benchgen_router.evaluation import evaluate_picks, format_evaluation
    from benchgen_router.files import Output, to_json
    from benchgen_router.forms import FORMS, in_form
    from benchgen_router.loading import load_router
    from benchgen_router.ood import PACKAGED_OOD_QUERIES, evaluate_guard, read_ood_queries
    from benchgen_router.routing import operating_point_of, route_queries

    if args.ood_queries is not None and not args.ood_queries.is_file():
        raise UsageError(f"--ood-queries {args.ood_queries} not found; pass a JSONL file of query, group rows.")
    inputs = [args.rewards, args.tasks, *(path for path in (args.calls, args.pool) if path is not None)]
    output = Output(args.output_json, inputs=inputs) if args.output_json else None
    evaluations: dict[str | None, dict] = {}
    try:
        data = join_rewards(load_rows(args.rewards, "rewards"), load_rows(args.tasks, "tasks"), min_rows=1)
        if args.split is not None:
            rows = np.array([split == args.split for split in data.splits])
            if not rows.any():
                present = sorted({s for s in data.splits if s is not None})
                raise UsageError(f"no joined row has split '{args.split}' (splits present: {present or 'none'}).")
            data = data.subset(rows)
        # before the router loads: calls that do not cover the evaluated tasks fail at once
        costs = None if args.calls is None else costs_for_labelled(data, args.calls, args.pool)
        model, tokenizer = load_router(
            args.model,
            device=args.device,
            dtype=args.dtype,
            backbone=args.backbone,
            allow_emulated_bf16=args.allow_emulated_bf16,
        )
        pool = model.config.agent_order
        if sorted(pool) != sorted(data.agents):
            raise UsageError(
                f"the router's pool {pool} is not the rewards' agent_order {data.agents}; "
                "evaluate against rewards measured for this router's agents."
            )
        # None stands for a single-head router's only head, as in results_for
        if args.operating_point is not None:
            points: list[str | None] = [operating_point_of(model, args.operating_point)]
        else:
            points = list(model.config.operating_points) or [None]
        primary = model.config.operating_point if model.config.operating_point in points else points[0]
        rewards = data.rewards[:, [data.agents.index(agent) for agent in pool]]  # columns in logit order
        route = partial(
            route_queries,
            model,
            tokenizer,
            batch_size=args.batch_size,
            max_batch_tokens=args.max_batch_tokens,
            progress=not args.no_progress,
        )
        title = f"evaluation of {args.model or 'the default router'}"
        on_split = f" on split '{args.split}'" if args.split else ""
        # Each point on the prompts as the data gives them and as users type them (forms.FORMS).
        routed = {
            (form, point): route(in_form(data.prompts, form), operating_points=point)
            for form in FORMS
            for point in points
        }
        picks_at = {key: routed_at.picks for key, routed_at in routed.items()}
        by_form: dict[str, dict[str, dict]] = {form: {} for form in FORMS}
        for (form, point), picks in picks_at.items():
            evaluation = evaluate_picks(picks, rewards, pool)
            if routed[form, point].out_of_distribution is not None:
                evaluation["flagged_share"] = float(routed[form, point].out_of_distribution.mean())
            by_form[form][point or "router"] = evaluation
            if form == "formatted":
                evaluations[point] = evaluation
            at = "" if point is None else f" at operating point '{point}'"
            print(
                format_evaluation(
                    evaluation, title + at + on_split + ("" if form == "formatted" else f", {form} questions")
                )
            )
        frontier = None
        if costs is not None:
            frontier = cost_frontier(model, _in_pool_order(costs, pool), picks_at, args)
        queries_file = args.ood_queries or PACKAGED_OOD_QUERIES
        guard = None
        if model.guards_queries and queries_file.is_file():
            queries, groups = read_ood_queries(queries_file)
            rows = f"the {len(data)} evaluated prompts" + (f" of split '{args.split}'" if args.split else "")
            guard = evaluate_guard(
                float(model.ood_threshold),
                routed["formatted", points[0]].ood_scores,
                route(queries).ood_scores,
                groups,
                rows,
            )
            guard["ood_queries_file"] = str(queries_file)
            for form in FORMS:
                flags = routed[form, points[0]].out_of_distribution
                guard[f"{form}_flagged_share"] = float(flags.mean())
            print(format_guard_evaluation(guard))
        if output is not None:
            record = {"model": args.model, "rewards": args.rewards, "split": args.split, **evaluations[primary]}
            if primary is not None:
                record["operating_point"] = primary
                record["operating_points"] = {point: evaluations[point] for point in points}
            record["forms"] = by_form
            if frontier is not None:
                record["cost_frontier"] = frontier
            if guard is not None:
                record["ood_guard"] = guard
            output.handle.write(to_json(record, indent=2) + "\n")
            output.commit()
    finally:
        if output is not None:
            output.discard()
    for point, evaluation in evaluations.items():
        if not evaluation["beats_best_fixed_agent"]:
            logger.warning(
                "warning: the router%s does not beat the best fixed agent (%s, %.4f) on these rows.",
                "" if point is None else f" at operating point '{point}'",
                evaluation["best_fixed_agent_id"],
                evaluation["best_fixed_agent"],
            )
    return 0


IN_SAMPLE_NOTE = (
    "in-sample evaluation of a fixed router on the given rows (no cross-validation, so ±rep and ±fold are 0): "
    "rows the router was trained on make its figures optimistic"
)


def _point_name(point: str | None, form: str = "formatted") -> str:
    name = "router" if point is None else f"router {point}"
    return name if form == "formatted" else f"{name} [{form}]"


def cost_frontier(
    model: Any, costs: Any, picks_at: dict[tuple[str, str | None], Any], args: argparse.Namespace
) -> dict:
    """The evaluated points' cost and latency against the baselines: printed, plotted with --plot, and
    returned as the JSON record's "cost_frontier" (frontier_to_dict's layout plus where it came from)."""
    from benchgen_router import frontier as fr

    settings = model.config.operating_points
    weights = {
        _point_name(point, form): (settings[point]["cost_weight"], settings[point]["latency_weight"])
        for form, point in picks_at
        if point in settings
    }
    formatted = {_point_name(point): picks for (form, point), picks in picks_at.items() if form == "formatted"}
    other = {_point_name(point, form): picks for (form, point), picks in picks_at.items() if form != "formatted"}
    result = fr.evaluate_policies(costs, formatted, weights, other)
    where = f"{args.model or 'the default router'} on {result.rows} rows" + (
        f" of split '{args.split}'" if args.split else ""
    )
    title = f"cost and latency of {where}; reference: {result.reference}\n{IN_SAMPLE_NOTE}"
    print(fr.format_frontier(result, kinds=("router", "router_form", "fixed", "random", "oracle"), title=title))
    for note in costs.notes:
        print(f"note: {note}")
    if args.plot is not None:
        fr.plot_policies(
            result, f"{args.plot}-cost.png", f"{args.plot}-latency.png", title=f"{where}: in-sample, no CV"
        )
    stored = fr.frontier_to_dict(result)
    stored.update(
        {
            "evaluation": IN_SAMPLE_NOTE,
            "calls": str(args.calls),
            "pool": None if args.pool is None else str(args.pool),
            "notes": list(costs.notes),
            "operating_points": {point: _point_name(point) for _, point in picks_at if point is not None},
        }
    )
    return stored


def format_guard_evaluation(guard: dict) -> str:
    """The guard's figures as printed lines."""
    lines = [
        f"out-of-distribution guard (threshold {guard['threshold']:.4f}) on {guard['ood_queries']} queries of "
        f"{guard['ood_queries_file']}: AUROC {guard['auroc']:.3f}, flagged {guard['ood_flagged_share']:.3f}; "
        f"kept {guard['in_distribution_kept_share']:.3f} of {guard['in_distribution_rows']}",
        "flagged share of the evaluated prompts by form: "
        + ", ".join(f"{form} {guard[f'{form}_flagged_share']:.3f}" for form in ("formatted", "plain")),
    ]
    lines += group_lines(guard["groups"])
    return "\n".join(lines)
