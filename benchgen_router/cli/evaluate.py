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
its default point (or the one asked for). A router with a probability head is evaluated at its
default decision, or at each --tradeoff rule given (docs/tradeoff.md), each reported like a point.

With --calls (the raw per-call records, rewards.v1-pilot.jsonl format) it also reports each
evaluated point's mean reward, cost (USD per 1,000 queries), latency and share of queries per agent
against every fixed agent, uniform random and the per-task oracles on the same rows, with the
non-dominated marks and the area under the frontier (AIQ) with and without the router, and the
quality-cost gap figures: the area of the router's points between the cheapest and the best agent
(the gap recovered, averaged over that cost range) and the cost that recovers 50% and 80% of the gap,
beside random and the oracle; --plot draws them (PREFIX-cost.png, PREFIX-latency.png, PREFIX-gap.png).

A two-agent router gets RouteLLM's figures on the labelled prompts in any case: its logit margin swept
at RouteLLM's thresholds gives the curve of accuracy against the share of calls to the better agent,
its APGR and CPT(50%) and CPT(80%), computed as routellm/evals computes them, beside random and the
oracle. This is an in-sample evaluation of a fixed router on the given rows, not cross-validation:
rows the router was trained on make it look better than it will on new queries.

Rewards and tasks are joined on task_id as in training (rows with no task are skipped). The
rewards must score the router's pool: the same agent ids, in any order.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from benchgen_router.cli.common import EXIT_CODES_HELP, add_batching_arguments, add_dtype_arguments
from benchgen_router.errors import InputError
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
        "(default: the packaged benchgen_router/ood/queries/ood_queries.jsonl)",
    )
    parser.add_argument(
        "--operating-point",
        metavar="NAME",
        help="evaluate only this operating point of the router (default: every point, or its single head)",
    )
    parser.add_argument(
        "--tradeoff",
        dest="tradeoffs",
        action="append",
        metavar="RULE",
        help="a probability head's trade-off rule to evaluate at, e.g. budget=0.3 or tolerance=0.05 "
        "(docs/tradeoff.md); repeat it to evaluate several, each reported like an operating point",
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
        raise InputError(f"{flag} {path} not found; pass {what}.") from None
    except IsADirectoryError:
        raise InputError(f"{flag} {path} is a folder; pass {what}.") from None
    except OSError as err:
        raise InputError(f"cannot read {flag} {path} ({err.strerror}); pass {what} this user can read.") from None


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """File problems of the cost options, found before torch is imported and the router loaded."""
    for flag, value in (("--pool", args.pool), ("--plot", args.plot)):
        if value is not None and args.calls is None:
            raise InputError(f"{flag} needs --calls (the raw per-call records the cost figures come from).")
    if args.calls is not None:
        _check_readable(args.calls, "--calls", "the raw per-call JSONL file (rewards.v1-pilot.jsonl format)")
    if args.pool is not None:
        _check_readable(args.pool, "--pool", "the pool file (agents.json)")
    if args.plot is not None:
        folder = Path(f"{args.plot}-cost.png").parent
        if not folder.is_dir():
            raise InputError(f"--plot folder {folder} does not exist; create it or pass another prefix.")


def run(args: argparse.Namespace) -> int:
    from dataclasses import fields

    from benchgen_router.evaluation.metrics import format_evaluation
    from benchgen_router.evaluation.run import EvaluateConfig, evaluate
    from benchgen_router.files import Output, to_json
    from benchgen_router.frontier import format_frontier, format_gap

    config = EvaluateConfig(**{item.name: getattr(args, item.name) for item in fields(EvaluateConfig)})
    inputs = [args.rewards, args.tasks, *(path for path in (args.calls, args.pool) if path is not None)]
    output = Output(args.output_json, inputs=inputs) if args.output_json else None  # refused before any work
    try:
        report = evaluate(config)
        on_split = f" on split '{args.split}'" if args.split else ""
        for form, evaluations in report.by_form.items():
            for point in report.points:
                kind = "trade-off" if report.tradeoffs else "operating point"
                at = "" if point is None else f" at {kind} '{point}'"
                suffix = "" if form == "formatted" else f", {form} questions"
                print(format_evaluation(evaluations[point or "router"], report.title + at + on_split + suffix))
        if report.frontier is not None:
            kinds = ("router", "router_form", "fixed", "random", "oracle")
            print(format_frontier(report.frontier, kinds=kinds, title=report.frontier_title))
            for note in report.cost_notes:
                print(f"note: {note}")
        if report.gap:
            print(format_gap(report.gap))
        if report.guard is not None:
            print(format_guard_evaluation(report.guard))
        if output is not None:
            output.handle.write(to_json(report.record(config), indent=2) + "\n")
            output.commit()
    finally:
        if output is not None:
            output.discard()
    for point, evaluation in report.evaluations.items():
        if not evaluation["beats_best_fixed_agent"]:
            logger.warning(
                "warning: the router%s does not beat the best fixed agent (%s, %.4f) on these rows.",
                "" if point is None else f" at {'trade-off' if report.tradeoffs else 'operating point'} '{point}'",
                evaluation["best_fixed_agent_id"],
                evaluation["best_fixed_agent"],
            )
    return 0


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
