"""benchgen-router frontier: the cost-frontier analysis of docs/cost-frontier.md.

    benchgen-router frontier --rewards rewards.jsonl --tasks tasks.v1.jsonl --calls rewards.v1-pilot.jsonl
    benchgen-router frontier ... --grid 0,0.5,1 --target-eps 0.01 --json frontier.json --plots frontier

Repeated k-fold CV of cost-aware routers over a trade-off grid, with the baselines on the same folds,
the non-dominated frontier, the quality-cost gap figures (the area of each router line between the
cheapest and the best agent, and the cost that recovers 50% and 80% of the gap, beside random and the
oracle; for two agents RouteLLM's APGR and CPT), plots and, with --target-eps, nested-CV target mode. Embeds the prompts
with the default router's backbone unless --backbone names another.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchgen_router.cli.common import EXIT_CODES_HELP
from benchgen_router.costs import costs_for_labelled
from benchgen_router.data import join_rewards, load_rows
from benchgen_router.errors import InputError
from benchgen_router.files import atomic_output
from benchgen_router.frontier.cv import (
    DEFAULT_CV_SEED,
    DEFAULT_FOLDS,
    DEFAULT_KNN_KS,
    DEFAULT_REPEATS,
    cross_validate_frontier,
    nested_target_cv,
)
from benchgen_router.frontier.gap import frontier_gap
from benchgen_router.frontier.grid import DEFAULT_SEARCH, parse_grid
from benchgen_router.frontier.pareto import headline
from benchgen_router.frontier.plots import plot_frontier, plot_gap_curves
from benchgen_router.frontier.report import format_frontier, format_gap, frontier_to_dict

HELP = "the cost-aware CV frontier of a pool, with baselines and plots"


def _int_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of integers") from None


def _float_list(text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of numbers") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    summary, _, details = (__doc__ or "").partition("\n\n")
    parser.description, parser.epilog = summary, details + "\n" + EXIT_CODES_HELP
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--rewards", required=True, help="labelled rewards JSONL (rewards.jsonl)")
    parser.add_argument("--tasks", required=True, help="task prompts JSONL (tasks.v1.jsonl)")
    parser.add_argument("--calls", required=True, help="raw per-call JSONL with cost_usd and latency_ms")
    parser.add_argument("--pool", help="pool file (agents.json) to estimate missing costs from token counts")
    parser.add_argument("--backbone", help="backbone folder or id (default: the default router's MiniLM)")
    parser.add_argument("--cache-dir", type=Path, help="embedding cache folder (default: no cache)")
    parser.add_argument("--grid", type=parse_grid, help="trade-offs: '0,0.5,1' or 'lc:ll,...' (default: built in)")
    parser.add_argument("--folds", type=int, default=DEFAULT_FOLDS)
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    parser.add_argument("--cv-seed", type=int, default=DEFAULT_CV_SEED)
    parser.add_argument("--generations", type=int, default=DEFAULT_SEARCH["generations"])
    parser.add_argument("--seed", type=int, default=DEFAULT_SEARCH["seed"], help="search seed")
    parser.add_argument("--shrink", type=float, default=0.0, help="utility regularisation in [0, 1) (default 0)")
    parser.add_argument("--ensemble-seeds", type=_int_list, help="average the heads of these search seeds")
    parser.add_argument("--knn", type=_int_list, default=list(DEFAULT_KNN_KS), help="kNN baselines' k values")
    parser.add_argument("--target-eps", type=float, help="also run nested-CV target mode with this eps")
    parser.add_argument("--target-grid", type=parse_grid, help="trade-offs target mode chooses from")
    parser.add_argument("--outer-repeats", type=int, default=2)
    parser.add_argument("--inner-repeats", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the frontier (and target result) as JSON here")
    parser.add_argument("--plots", help="write <prefix>-cost.png and <prefix>-latency.png")
    parser.add_argument("--plot-knn", type=int, help="draw the kNN line with this k (one of --knn)")
    parser.add_argument(
        "--target-box", type=_float_list, help="draw eps,cost share,latency share of the reference (e.g. 0.01,0.6,0.4)"
    )


def run(args: argparse.Namespace) -> int:
    data = join_rewards(load_rows(args.rewards, "rewards"), load_rows(args.tasks, "tasks"))
    costs = costs_for_labelled(data, args.calls, args.pool)
    backbone = args.backbone or "sentence-transformers/all-MiniLM-L6-v2"  # the default router's, installed
    from benchgen_router.embeddings import embed_prompts  # torch and transformers: only once the data are good

    embeddings = embed_prompts(data.prompts, backbone, data.agents, cache_dir=args.cache_dir).vectors
    search = {"generations": args.generations, "seed": args.seed, "shrink": args.shrink}
    if args.ensemble_seeds:
        search["ensemble_seeds"] = args.ensemble_seeds
    result = cross_validate_frontier(
        embeddings, costs, args.grid, args.folds, args.repeats, args.cv_seed, search, knn_ks=args.knn, progress=True
    )
    print(format_frontier(result, knn_ks=args.knn))
    print(json.dumps(headline(result), indent=1))
    gap = frontier_gap(result, costs.rewards, costs.cost_per_1k)
    print(format_gap(gap))
    stored = frontier_to_dict(result)
    stored["routing_gap"] = {"pool": gap["pool"]}
    if args.target_eps is not None:
        target = nested_target_cv(
            embeddings,
            costs,
            args.target_eps,
            args.target_grid,
            args.folds,
            args.outer_repeats,
            args.folds,
            args.inner_repeats,
            args.cv_seed,
            search,
            progress=False,
        )
        p = target.point
        print(
            f"target mode eps={target.eps:g} ({args.outer_repeats}x{args.folds} outer, {args.inner_repeats}x"
            f"{args.folds} inner): reward {p.reward:.4f} ±{p.reward_std_repeats:.4f} (Δref {p.delta_reward:+.4f}"
            f" ±{p.delta_se:.4f}), {p.cost_per_1k:.4f} USD/1k, {p.latency_s:.2f} s; chosen {p.extra['chosen']}"
        )
        stored["target"] = {"eps": target.eps, "point": p.to_dict(), "chosen": target.chosen}
    if args.json:
        with atomic_output(args.json) as handle:
            json.dump(stored, handle, indent=1)
    if args.plots:
        box = None
        if args.target_box:
            if len(args.target_box) != 3:
                raise InputError("--target-box takes three numbers: eps,cost share,latency share.")
            reference = result.point(result.reference)
            eps, cost_share, latency_share = args.target_box
            box = {
                "reward_floor": reference.reward - eps,
                "cost_cap": cost_share * reference.cost_per_1k,
                "latency_cap": latency_share * reference.latency_s,
            }
        plot_frontier(
            result,
            f"{args.plots}-cost.png",
            f"{args.plots}-latency.png",
            knn_k=args.plot_knn,
            target=box,
        )
        if "curves" in gap:
            panel = ("held-out routers, in-sample oracle", gap["curves"], gap["gap"])
            plot_gap_curves([panel], f"{args.plots}-gap.png")
    return 0
