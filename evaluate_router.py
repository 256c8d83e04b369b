"""Evaluate a converted router against reward data: the same table the trainer prints.

    python evaluate_router.py --model router/ --rewards rewards.jsonl --tasks tasks.jsonl [--split test]

Routes every labelled prompt through the router exactly as it serves (its own model code, weights
and truncation), then compares the picks' mean reward with the best fixed agent, a uniform random
agent and the per-question oracle on the same rows, and reports the share of the routing headroom
captured and how many queries went to each agent. Use it to check a published router against new
reward data. With no --model, the default router committed in this repository is evaluated.

Rewards and tasks are joined on task_id as in training (rows with no task are skipped). The
rewards must score the router's pool: the same agent ids, in any order.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from router_utils import (
    UsageError,
    add_batching_arguments,
    atomic_output,
    check_output_path,
    load_router,
    run_cli,
    run_router,
)
from training import evaluate_picks, format_evaluation, join_rewards, load_rows

logger = logging.getLogger("benchgen_router.evaluate")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    summary, _, details = __doc__.partition("\n\n")
    parser = argparse.ArgumentParser(
        description=summary, epilog=details, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", help="converted router folder or Hub id (default: the bundled default router)")
    parser.add_argument("--rewards", required=True, help="rewards: local JSONL file or Hub dataset id")
    parser.add_argument("--tasks", required=True, help="task prompts: local JSONL file or Hub dataset id")
    parser.add_argument("--split", help="evaluate only the rows of this task split (default: every joined row)")
    parser.add_argument("--backbone", help="load the backbone from here instead of the id in the router's config")
    parser.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16", "auto"],
        help="backbone dtype (default: the router's, float32)",
    )
    add_batching_arguments(parser)
    parser.add_argument("--output-json", type=Path, help="also write the evaluation to this JSON file")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    args = parser.parse_args(argv)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    data = join_rewards(load_rows(args.rewards, "rewards"), load_rows(args.tasks, "tasks"), min_rows=1)
    if args.split is not None:
        rows = np.array([split == args.split for split in data.splits])
        if not rows.any():
            present = sorted({s for s in data.splits if s is not None})
            raise UsageError(f"no joined row has split '{args.split}' (splits present: {present or 'none'}).")
        data = data.subset(rows)

    if args.output_json is not None:
        check_output_path(args.output_json)
    model, tokenizer = load_router(args.model, device=args.device, dtype=args.dtype, backbone=args.backbone)
    pool = model.config.agent_order
    if sorted(pool) != sorted(data.agents):
        raise UsageError(
            f"the router's pool {pool} is not the rewards' agent_order {data.agents}; "
            "evaluate against rewards measured for this router's agents."
        )
    rewards = data.rewards[:, [data.agents.index(agent) for agent in pool]]  # columns in logit order

    logits, _ = run_router(
        model,
        tokenizer,
        data.prompts,
        batch_size=args.batch_size,
        max_batch_tokens=args.max_batch_tokens,
        progress=not args.no_progress,
        desc="routing",
    )
    evaluation = evaluate_picks(logits.argmax(axis=1), rewards, pool)
    title = f"evaluation of {args.model or 'the default router'}" + (f" on split '{args.split}'" if args.split else "")
    print(format_evaluation(evaluation, title))
    if args.output_json is not None:
        with atomic_output(args.output_json) as handle:
            json.dump(
                {"model": args.model, "rewards": args.rewards, "split": args.split, **evaluation}, handle, indent=2
            )
    if not evaluation["beats_best_fixed_agent"]:
        logger.warning(
            "warning: the router does not beat the best fixed agent (%s, %.4f) on these rows.",
            evaluation["best_fixed_agent_id"],
            evaluation["best_fixed_agent"],
        )
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
