"""benchgen-router train: train a router head for any agent pool with separable CMA-ES, and evaluate it.

    benchgen-router train --rewards rewards.jsonl --tasks tasks.jsonl --backbone Qwen/Qwen3-1.7B \\
        --output-dir run/ [--export router/]

Follows the reference trainer (rewards joined with task prompts on task_id, the --test-split rows
held out, separable CMA-ES from zeros keeping the best candidate ever seen), embedding prompts with
the code that serves. Writes head_weights.npy and manifest.json (and the guard's statistics and the
operating points' heads) into --output-dir; --export DIR writes the router folder in the same run.
Prints the held-out evaluation and a cross-validated estimate; with --calls, the cost/latency
frontier, and --operating-point NAME=COST[:LATENCY] trains one head per trade-off, maximising
reward - COST x (USD per 1,000 queries) - LATENCY x (seconds per query). The out-of-distribution
guard (--no-ood-guard skips it) sends flagged queries to a fallback agent. --config FILE reads the
reference trainer's JSON keys; flags win over it. Every option in detail: docs/training.md.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from benchgen_router import ood as ood_defaults
from benchgen_router.cli.common import (
    EXIT_CODES_HELP,
    add_batching_arguments,
    argument_type,
    non_negative_int,
    positive_int,
    read_card_note,
)
from benchgen_router.frontier.grid import parse_operating_point
from benchgen_router.manifest import POOLINGS
from benchgen_router.training import DEFAULT_BACKBONE, parse_seed_list, reference_settings, train_defaults
from benchgen_router.training.search import CMA_LIBRARIES, DEFAULT_CMA_LIBRARY, MIN_POPSIZE

logger = logging.getLogger("benchgen_router")

seed_list = argument_type(parse_seed_list)
operating_point = argument_type(parse_operating_point)  # NAME=COST[:LATENCY] -> (name, Tradeoff)
HELP = "train a router head with separable CMA-ES on a reward matrix"
DEFAULTS = train_defaults()  # the library's, so that the flags and TrainConfig never disagree


def add_arguments(parser: argparse.ArgumentParser) -> None:
    summary, _, details = (__doc__ or "").partition("\n\n")
    parser.description, parser.epilog = summary, details + "\n" + EXIT_CODES_HELP
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_data_arguments(parser.add_argument_group("data"))
    add_backbone_arguments(parser.add_argument_group("backbone and head"))
    add_finetune_arguments(parser.add_argument_group("fine-tuning the backbone (--head-kind probability)"))
    add_search_arguments(parser.add_argument_group("search (separable CMA-ES)"))
    add_cost_and_latency_arguments(parser.add_argument_group("cost and latency"))
    add_query_forms_arguments(parser.add_argument_group("query forms"))
    add_guard_arguments(parser.add_argument_group("out-of-distribution guard"))
    add_output_arguments(parser.add_argument_group("output"))


def add_data_arguments(data: argparse._ArgumentGroup) -> None:
    data.add_argument("--config", type=Path, help="JSON file with the reference trainer's keys (see below)")
    data.add_argument("--rewards", help="rewards: local JSONL file or Hub dataset id (e.g. benchgen/router-pilot)")
    data.add_argument("--tasks", help="task prompts: local JSONL file or Hub dataset id (benchgen/router-pilot-tasks)")
    data.add_argument("--rewards-id", help="what the manifest records as rewards_dataset (default: --rewards)")
    data.add_argument(
        "--reward-column",
        default=DEFAULTS["reward_column"],
        metavar="NAME",
        help="the rewards file's column to train on: mean_reward (the measured rewards; default) or, for tasks "
        "collected from the traffic journal, feedback_reward (users' feedback for the agents that answered them, "
        "the judge's rating for the rest)",
    )
    data.add_argument("--test-split", default=DEFAULTS["test_split"], help="task split held out (default: %(default)s)")
    data.add_argument(
        "--cv-folds",
        type=non_negative_int,
        default=DEFAULTS["cv_folds"],
        help="k of the k-fold cross-validation over all labelled rows; 0 skips it (default: %(default)s)",
    )


def add_backbone_arguments(model: argparse._ArgumentGroup) -> None:
    model.add_argument(
        "--backbone",
        default=DEFAULTS["backbone"],
        help=f"backbone to embed with: Hub id or local folder (default: {DEFAULT_BACKBONE})",
    )
    model.add_argument(
        "--backbone-id",
        help="backbone id the manifest records as backbone_model, when --backbone "
        "is a local copy of a Hub model (default: --backbone)",
    )
    model.add_argument("--backbone-revision", help="backbone revision (branch, tag or commit) to load and record")
    model.add_argument(
        "--head-hidden-dim",
        type=non_negative_int,
        default=DEFAULTS["head_hidden_dim"],
        help="0: linear head (default); H: tanh MLP with H hidden units",
    )
    model.add_argument(
        "--head-kind",
        choices=("cmaes", "probability"),
        default=DEFAULTS["head_kind"],
        help="cmaes: heads searched by CMA-ES, one per operating point (default); probability: each agent's "
        "probability of answering correctly, with the trade-off chosen per request (docs/tradeoff.md)",
    )
    model.add_argument(
        "--pooling",
        choices=POOLINGS,
        default=DEFAULTS["pooling"],
        help="last-layer: the mean of the backbone's last hidden state (default, the reference's); every-layer: "
        "every hidden state's mean side by side, for a probability head (docs/training.md)",
    )
    model.add_argument(
        "--neighbour-outcomes",
        type=int,
        default=DEFAULTS["neighbour_outcomes"],
        metavar="K",
        help="K > 0: the probability head also reads, per agent, the outcomes of the K training queries nearest "
        "the query (docs/training.md); 0: not (default)",
    )
    model.add_argument(
        "--truncation-length",
        type=positive_int,
        default=DEFAULTS["truncation_length"],
        help="tokens kept per prompt, capped by the backbone's position limit (default: %(default)s)",
    )
    model.add_argument(
        "--device", default=DEFAULTS["device"], help="torch device for the backbone (default: %(default)s)"
    )
    model.add_argument(
        "--dtype",
        default=DEFAULTS["dtype"],
        choices=["float32", "bfloat16", "float16"],
        help="backbone dtype while embedding (default: float32, as the reference)",
    )
    add_batching_arguments(model)
    model.add_argument(
        "--allow-emulated-bf16", action="store_true", help="--dtype bfloat16 even where the CPU only emulates it"
    )
    model.add_argument(
        "--cache-dir", type=Path, help="embedding cache folder (default: ~/.cache/benchgen-router/embeddings)"
    )
    model.add_argument("--no-cache", action="store_true", help="neither read nor write the embedding cache")


def add_finetune_arguments(tune: argparse._ArgumentGroup) -> None:
    tune.add_argument(
        "--finetune",
        action="store_true",
        help="train the backbone with the probability head on each agent's binary cross-entropy, from the frozen "
        "head's fit, early-stopped on held-out training rows; the trained backbone goes into --export's "
        "model.safetensors (docs/training.md)",
    )
    tune.add_argument(
        "--finetune-epochs",
        type=positive_int,
        default=DEFAULTS["finetune_epochs"],
        help="most epochs (default: %(default)s)",
    )
    tune.add_argument(
        "--finetune-layers",
        type=positive_int,
        metavar="N",
        help="train only the top N layers, over the lower layers' outputs computed once per prompt (default: all)",
    )
    tune.add_argument(
        "--finetune-learning-rate",
        type=float,
        default=DEFAULTS["finetune_learning_rate"],
        help="AdamW's learning rate, decayed linearly to 0 over the epochs (default: %(default)s)",
    )
    tune.add_argument(
        "--finetune-batch-size",
        type=positive_int,
        default=DEFAULTS["finetune_batch_size"],
        help="prompts per step, in length-sorted batches (default: %(default)s)",
    )
    tune.add_argument(
        "--finetune-patience",
        type=positive_int,
        default=DEFAULTS["finetune_patience"],
        help="epochs without a better validation loss before stopping (default: %(default)s)",
    )
    tune.add_argument(
        "--finetune-validation-share",
        type=float,
        default=DEFAULTS["finetune_validation_share"],
        help="share of the training rows held out for early stopping (default: %(default)s)",
    )


def add_search_arguments(search: argparse._ArgumentGroup) -> None:
    search.add_argument(
        "--sigma0", type=float, default=DEFAULTS["sigma0"], help="initial step size (default: %(default)s)"
    )
    search.add_argument(
        "--generations", type=int, default=DEFAULTS["generations"], help="generations (default: %(default)s)"
    )
    search.add_argument(
        "--seed",
        type=int,
        default=DEFAULTS["seed"],
        help="seed of the search, the folds and any random split (default: %(default)s)",
    )
    search.add_argument(
        "--popsize",
        type=positive_int,
        help=f"candidates per generation, >= {MIN_POPSIZE} (default: 4 + 3 ln(n_params))",
    )
    search.add_argument(
        "--cma-library",
        choices=CMA_LIBRARIES,
        default=DEFAULTS["cma_library"],
        help=f"pycma with CMA_diagonal=True, or cmaes.SepCMA (default: {DEFAULT_CMA_LIBRARY})",
    )

    search.add_argument(
        "--ensemble-seeds",
        type=seed_list,
        metavar="S1,S2,...",
        help="one search per seed, the heads averaged (linear heads; steadier on few rows than one seed)",
    )
    search.add_argument(
        "--shrink",
        type=float,
        default=DEFAULTS["shrink"],
        help="pull the fitness toward the agent best on average: (1 - s) U + s (column means of U) (default: 0)",
    )


def add_cost_and_latency_arguments(value: argparse._ArgumentGroup) -> None:
    value.add_argument("--calls", type=Path, help="raw per-call records (calls with cost_usd, latency_ms) per task")
    value.add_argument("--pool", type=Path, help="agents.json prices, for calls that record no billed cost")
    value.add_argument(
        "--operating-point",
        dest="operating_points",
        action="append",
        type=operating_point,
        metavar="NAME=COST[:LATENCY]",
        help="train a head for this trade-off (repeatable; needs --calls), e.g. balanced=0.2 or fast=0:0.01",
    )
    value.add_argument("--default-operating-point", metavar="NAME", help="the head used when none is named")
    value.add_argument(
        "--target-eps",
        type=float,
        metavar="EPS",
        help="choose the default: the cheapest point within EPS of the best fixed agent's CV reward",
    )
    value.add_argument(
        "--cv-repeats",
        type=positive_int,
        default=DEFAULTS["cv_repeats"],
        help="repeats of the cost/latency CV (default: %(default)s)",
    )
    value.add_argument(
        "--cv-seed",
        type=int,
        default=DEFAULTS["cv_seed"],
        help="seed of the cost/latency CV folds (default: %(default)s)",
    )


def add_query_forms_arguments(forms: argparse._ArgumentGroup) -> None:
    forms.add_argument(
        "--query-format",
        choices=("pilot", "none"),
        default=DEFAULTS["query_format"],
        help="canonicalise queries before embedding, in training and in the exported router's every entry "
        "point: 'pilot' drops the pilot's answer-format instructions and labels, so a plain question and its "
        "benchmark-formatted prompt get one decision; 'none' embeds them as given, as the reference does "
        "(default: pilot)",
    )


def add_guard_arguments(guard: argparse._ArgumentGroup) -> None:
    guard.add_argument("--no-ood-guard", action="store_true", help="train no out-of-distribution guard (flag no query)")
    guard.add_argument(
        "--ood-method",
        choices=("discriminative", "mahalanobis"),
        default=DEFAULTS["ood_method"],
        help="discriminative: a logistic score of the embedding and its Mahalanobis distance, fitted on the "
        "task prompts and --ood-inside questions against --ood-outside queries; mahalanobis: the distance "
        "alone, fitted on the task prompts (default: discriminative)",
    )
    guard.add_argument(
        "--ood-keep-share",
        type=float,
        default=DEFAULTS["ood_keep_share"],
        help="share of in-distribution queries the guard keeps (calibrated on held-out prompts; default: %(default)s)",
    )
    guard.add_argument(
        "--ood-plain-keep-share",
        type=float,
        default=DEFAULTS["ood_plain_keep_share"],
        help="discriminative: share of held-out --ood-inside questions kept as well "
        f"(default: {ood_defaults.DEFAULT_PLAIN_KEEP_SHARE})",
    )
    guard.add_argument(
        "--ood-inside",
        type=Path,
        help="discriminative: in-domain questions as users type them (JSONL: query, group), fitted and "
        "calibrated on with the task prompts "
        "(default: the packaged set, benchgen_router/ood/queries/guard_fit_inside.jsonl)",
    )
    guard.add_argument(
        "--ood-outside",
        type=Path,
        help="discriminative: queries the guard must flag (JSONL: query, group) "
        "(default: the packaged set, benchgen_router/ood/queries/guard_fit_outside.jsonl)",
    )
    guard.add_argument(
        "--ood-queries",
        type=Path,
        help="out-of-distribution queries (JSONL: query, group) to measure the guard on "
        "(default: the packaged set, benchgen_router/ood/queries/ood_queries.jsonl)",
    )


def add_output_arguments(output: argparse._ArgumentGroup) -> None:
    output.add_argument("--output-dir", help="folder for head_weights.npy and manifest.json")
    output.add_argument("--model-id", help="manifest model_id (default: head-<backbone name>-<hash of the head>)")
    output.add_argument("--export", type=Path, metavar="DIR", help="also write the converted Hub folder here")
    output.add_argument("--card-note", metavar="TEXT|@FILE", help="markdown appended to the exported model card")
    output.add_argument("--no-progress", action="store_true", help="hide the progress bars")


def finish_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace, reparse: Any) -> argparse.Namespace:
    """Apply --config (the command line wins over the file); the library checks the rest."""
    from benchgen_router.errors import InputError

    if args.config is not None:
        parser.set_defaults(**reference_settings(args.config))
        args = reparse()
    missing = [
        f for f, v in (("--rewards", args.rewards), ("--tasks", args.tasks), ("--output-dir", args.output_dir)) if not v
    ]
    if missing:
        raise InputError(f"missing {', '.join(missing)} (on the command line or in --config).")
    args.backbone_id = args.backbone_id or args.backbone
    args.output_dir = Path(args.output_dir)
    return args


def run(args: argparse.Namespace) -> int:
    from dataclasses import fields

    from benchgen_router.training import TrainConfig, run_summary, train

    settings = {item.name: getattr(args, item.name) for item in fields(TrainConfig)}
    result = train(TrainConfig(**{**settings, "card_note": read_card_note(args.card_note)}))
    if args.head_kind == "probability":
        from benchgen_router.training.probability import probability_summary

        print(probability_summary(result.report))
        return 0
    print(run_summary(result, args.ensemble_seeds))
    return 0
