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

Rewards and tasks are joined on task_id as in training (rows with no task are skipped). The
rewards must score the router's pool: the same agent ids, in any order.
"""

from __future__ import annotations

import argparse
import logging
from functools import partial
from pathlib import Path

from benchgen_router.cli.common import EXIT_CODES_HELP, add_batching_arguments, add_dtype_arguments
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
    parser.add_argument("--output-json", type=Path, help="also write the evaluation to this JSON file")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from benchgen_router.data import join_rewards, load_rows
    from benchgen_router.errors import UsageError
    from benchgen_router.evaluation import evaluate_picks, format_evaluation
    from benchgen_router.files import Output, to_json
    from benchgen_router.loading import load_router
    from benchgen_router.ood import PACKAGED_OOD_QUERIES, evaluate_guard, read_ood_queries
    from benchgen_router.routing import ood_scores_of, results_for, run_router

    if args.ood_queries is not None and not args.ood_queries.is_file():
        raise UsageError(f"--ood-queries {args.ood_queries} not found; pass a JSONL file of query, group rows.")
    output = Output(args.output_json, inputs=[args.rewards, args.tasks]) if args.output_json else None
    try:
        data = join_rewards(load_rows(args.rewards, "rewards"), load_rows(args.tasks, "tasks"), min_rows=1)
        if args.split is not None:
            rows = np.array([split == args.split for split in data.splits])
            if not rows.any():
                present = sorted({s for s in data.splits if s is not None})
                raise UsageError(f"no joined row has split '{args.split}' (splits present: {present or 'none'}).")
            data = data.subset(rows)
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
        rewards = data.rewards[:, [data.agents.index(agent) for agent in pool]]  # columns in logit order
        route = partial(
            run_router,
            model,
            tokenizer,
            batch_size=args.batch_size,
            max_batch_tokens=args.max_batch_tokens,
            progress=not args.no_progress,
        )
        logits, embeddings = route(data.prompts)
        picks = np.array([result["agent_index"] for result in results_for(model, logits, embeddings)])
        evaluation = evaluate_picks(picks, rewards, pool)
        title = f"evaluation of {args.model or 'the default router'}"
        print(format_evaluation(evaluation, title + (f" on split '{args.split}'" if args.split else "")))
        queries_file = args.ood_queries or PACKAGED_OOD_QUERIES
        guard = None
        if model.guards_queries and queries_file.is_file():
            queries, groups = read_ood_queries(queries_file)
            rows = f"the {len(data)} evaluated prompts" + (f" of split '{args.split}'" if args.split else "")
            guard = evaluate_guard(
                partial(ood_scores_of, model),
                float(model.ood_threshold),
                embeddings,
                route(queries)[1],
                groups,
                rows,
            )
            guard["ood_queries_file"] = str(queries_file)
            print(format_guard_evaluation(guard))
        if output is not None:
            record = {"model": args.model, "rewards": args.rewards, "split": args.split, **evaluation}
            if guard is not None:
                record["ood_guard"] = guard
            output.handle.write(to_json(record, indent=2) + "\n")
            output.commit()
    finally:
        if output is not None:
            output.discard()
    if not evaluation["beats_best_fixed_agent"]:
        logger.warning(
            "warning: the router does not beat the best fixed agent (%s, %.4f) on these rows.",
            evaluation["best_fixed_agent_id"],
            evaluation["best_fixed_agent"],
        )
    return 0


def format_guard_evaluation(guard: dict) -> str:
    """The guard's figures as printed lines."""
    lines = [
        f"out-of-distribution guard (threshold {guard['threshold']:.4f}) on {guard['ood_queries']} queries of "
        f"{guard['ood_queries_file']}: AUROC {guard['auroc']:.3f}, flagged {guard['ood_flagged_share']:.3f}; "
        f"kept {guard['in_distribution_kept_share']:.3f} of {guard['in_distribution_rows']}"
    ]
    lines += group_lines(guard["groups"])
    return "\n".join(lines)
