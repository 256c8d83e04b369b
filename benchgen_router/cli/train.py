"""benchgen-router train: train a router head for any agent pool with separable CMA-ES, and evaluate it.

    benchgen-router train --rewards rewards.jsonl --tasks tasks.jsonl --backbone Qwen/Qwen3-1.7B \\
        --output-dir run/ [--export router/]

Follows the reference trainer: reward rows are joined with task prompts on task_id (rows with
no task are skipped; fewer than 10 joined rows is refused), the rows whose task split is
--test-split are held out, and separable CMA-ES searches the flat head vector from zeros, scoring
each candidate by the mean training reward of its picks and keeping the best candidate ever seen.
Prompts are embedded by the same RouterModel code that serves the converted router, and cached on
disk, so a re-run or a sweep does not embed again.

Writes head_weights.npy (flat float64 theta) and manifest.json into --output-dir, which
`benchgen-router convert` turns into a router folder; --export DIR does that conversion in the same run. Prints
the held-out evaluation (router vs best fixed agent, uniform random, per-question oracle, the share
of the routing headroom captured, picks per agent) and a k-fold cross-validated estimate over all
labelled rows, and stores both in the manifest.

Query forms: prompts are canonicalised before embedding (--query-format pilot, the default: the
pilot's labels and answer-format instructions are dropped, and the exported router's config records
the rules so that every entry point applies them); --query-format none embeds them as given.

Out-of-distribution guard (skip it with --no-ood-guard): every prompt of --tasks, labelled or not,
is embedded the same way. The default discriminative guard is fitted on a seeded 70% of them (in
three views), half the --ood-inside questions and every --ood-outside query, and its threshold
calibrated to keep --ood-keep-share of the other 30% of prompts and --ood-plain-keep-share of the
other half of the questions; --ood-method mahalanobis fits the distance alone on the prompts.
Flagged queries go to the fallback agent: the best fixed agent on the training rows, or with
--calls the agent of highest utility at each operating point. The statistics are written as
ood_guard.safetensors next to head_weights.npy and the settings recorded in the manifest
(`ood_guard`), with the guard's AUROC and flagged shares on --ood-queries when that file exists.

Held-out rule: rows whose split equals --test-split are held out. If no row has that split and it
is the default 'test', a seeded random 20% is held out (the reference rule); any other split name
that no row carries is an error.

Cost and latency (--calls, the raw per-call records; --pool, the agents' prices for calls with no
billed cost): every labelled task gets its agents' mean cost (USD per 1,000 queries) and latency
(seconds per query), and the cross-validation becomes the cost/latency frontier: --cv-repeats x
--cv-folds CV of the router next to every fixed agent, the best fixed agent chosen on the training
folds, uniform random and the oracles, printed, stored in the manifest (`frontier`) and plotted
(frontier-cost.png, frontier-latency.png in --output-dir). --operating-point NAME=COST[:LATENCY]
(repeatable) trains one head per trade-off, each maximising reward - COST x (USD per 1,000
queries) - LATENCY x (seconds per query): COST 1 gives up 0.01 reward to save a cent per 1,000
queries, LATENCY 0.01 gives up 0.01 reward to answer a second faster. The checkpoint carries every
head; --default-operating-point names the one used when a caller names none, or --target-eps EPS
chooses it: the cheapest point whose cross-validated reward is within EPS of the best fixed agent
(the highest-reward point if none is), with that rule's own estimate from nested cross-validation
(`target_mode` in the manifest). With every weight 0 the search is the reference's, bit for bit.

--config FILE reads the reference trainer's JSON keys (model_id, model, rewards_dataset,
tasks_dataset or tasks_path, test_split, head_hidden_dim, cma_seed, cma_sigma0, cma_generations,
cma_population_size, device, output_dir); options given on the command line win over the file.
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
    non_negative_int,
    positive_int,
    read_card_note,
)
from benchgen_router.ood import group_lines
from benchgen_router.trainer import DEFAULT_BACKBONE, train_defaults
from benchgen_router.training import CMA_LIBRARIES, DEFAULT_CMA_LIBRARY, MIN_POPSIZE

logger = logging.getLogger("benchgen_router")

HELP = "train a router head with separable CMA-ES on a reward matrix"
DEFAULTS = train_defaults()  # the library's, so that the flags and TrainConfig never disagree
# Reference trainer config key -> (option dest, type).
CONFIG_KEYS: dict[str, tuple[str, type]] = {
    "model_id": ("model_id", str),
    "model": ("backbone", str),
    "rewards_dataset": ("rewards", str),
    "tasks_dataset": ("tasks", str),
    "tasks_path": ("tasks", str),
    "test_split": ("test_split", str),
    "head_hidden_dim": ("head_hidden_dim", int),
    "cma_seed": ("seed", int),
    "cma_sigma0": ("sigma0", float),
    "cma_generations": ("generations", int),
    "cma_population_size": ("popsize", int),
    "device": ("device", str),
    "output_dir": ("output_dir", str),
}
KIND_NAMES = {str: "a string", int: "an integer", float: "a number"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    summary, _, details = (__doc__ or "").partition("\n\n")
    parser.description, parser.epilog = summary, details + "\n" + EXIT_CODES_HELP
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    data = parser.add_argument_group("data")
    data.add_argument("--config", type=Path, help="JSON file with the reference trainer's keys (see below)")
    data.add_argument("--rewards", help="rewards: local JSONL file or Hub dataset id (e.g. benchgen/router-pilot)")
    data.add_argument("--tasks", help="task prompts: local JSONL file or Hub dataset id (benchgen/router-pilot-tasks)")
    data.add_argument("--rewards-id", help="what the manifest records as rewards_dataset (default: --rewards)")
    data.add_argument("--test-split", default=DEFAULTS["test_split"], help="task split held out (default: %(default)s)")
    data.add_argument(
        "--cv-folds",
        type=non_negative_int,
        default=DEFAULTS["cv_folds"],
        help="k of the k-fold cross-validation over all labelled rows; 0 skips it (default: %(default)s)",
    )

    model = parser.add_argument_group("backbone and head")
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

    search = parser.add_argument_group("search (separable CMA-ES)")
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

    value = parser.add_argument_group("cost and latency")
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

    forms = parser.add_argument_group("query forms")
    forms.add_argument(
        "--query-format",
        choices=("pilot", "none"),
        default=DEFAULTS["query_format"],
        help="canonicalise queries before embedding, in training and in the exported router's every entry "
        "point: 'pilot' drops the pilot's answer-format instructions and labels, so a plain question and its "
        "benchmark-formatted prompt get one decision; 'none' embeds them as given, as the reference does "
        "(default: pilot)",
    )

    guard = parser.add_argument_group("out-of-distribution guard")
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
        "calibrated on with the task prompts (default: the packaged set, benchgen_router/data/guard_fit_inside.jsonl)",
    )
    guard.add_argument(
        "--ood-outside",
        type=Path,
        help="discriminative: queries the guard must flag (JSONL: query, group) "
        "(default: the packaged set, benchgen_router/data/guard_fit_outside.jsonl)",
    )
    guard.add_argument(
        "--ood-queries",
        type=Path,
        help="out-of-distribution queries (JSONL: query, group) to measure the guard on "
        "(default: the packaged set, benchgen_router/data/ood_queries.jsonl)",
    )

    output = parser.add_argument_group("output")
    output.add_argument("--output-dir", help="folder for head_weights.npy and manifest.json")
    output.add_argument("--model-id", help="manifest model_id (default: head-<backbone name>-<hash of the head>)")
    output.add_argument("--export", type=Path, metavar="DIR", help="also write the converted Hub folder here")
    output.add_argument("--card-note", metavar="TEXT|@FILE", help="markdown appended to the exported model card")
    output.add_argument("--no-progress", action="store_true", help="hide the progress bars")


def seed_list(text: str) -> list[int]:
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of integers") from None
    if not seeds:
        raise argparse.ArgumentTypeError("give at least one seed")
    return seeds


def operating_point(text: str) -> tuple[str, Any]:
    """NAME=COST[:LATENCY] -> (name, Tradeoff)."""
    from benchgen_router.costs import MAX_WEIGHT
    from benchgen_router.errors import InputError
    from benchgen_router.frontier import parse_grid
    from benchgen_router.model_code import OPERATING_POINT_NAME

    name, equals, weights = text.partition("=")
    if not equals or not OPERATING_POINT_NAME.match(name):
        raise argparse.ArgumentTypeError(
            f"'{text}' is not NAME=COST[:LATENCY] with a NAME of letters, digits, '_' or '-' (e.g. balanced=0.2)"
        )
    try:
        grid = parse_grid(weights)
    except InputError:
        raise argparse.ArgumentTypeError(
            f"'{text}': COST[:LATENCY] must be one number or a cost:latency pair of numbers from 0 to "
            f"{MAX_WEIGHT:g} (e.g. balanced=0.2 or fast=0:0.01)"
        ) from None
    if len(grid) != 1:
        raise argparse.ArgumentTypeError(f"'{text}' names more than one trade-off; give one COST[:LATENCY] per point")
    return name, grid[0]


def read_config(path: Path) -> dict[str, Any]:
    """Option defaults from a reference trainer config file (unknown keys are logged and ignored)."""
    from benchgen_router.errors import InputError
    from benchgen_router.files import read_json

    config = read_json(path, "config file")
    if not isinstance(config, dict):
        raise InputError(f"config file {path} must be a JSON object of trainer settings.")
    if "tasks_dataset" in config and "tasks_path" in config:
        raise InputError(f"config file {path} gives both tasks_dataset and tasks_path; keep one.")
    defaults: dict[str, Any] = {}
    for key, value in config.items():
        if key not in CONFIG_KEYS:
            logger.warning("config file %s: ignoring unknown key '%s'", path, key)
            continue
        dest, kind = CONFIG_KEYS[key]
        if value is None:
            continue
        wrong = f"config file {path}: '{key}' must be {KIND_NAMES[kind]}, got {value!r}."
        if isinstance(value, bool | list | dict):
            raise InputError(wrong)
        try:
            defaults[dest] = kind(str(value))
        except ValueError:
            raise InputError(wrong) from None
    return defaults


def finish_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace, reparse: Any) -> argparse.Namespace:
    """Apply --config (the command line wins over the file), then check what argparse cannot."""
    from benchgen_router.errors import InputError
    from benchgen_router.training import check_search_settings

    if args.config is not None:
        parser.set_defaults(**read_config(args.config))
        args = reparse()
    missing = [
        f for f, v in (("--rewards", args.rewards), ("--tasks", args.tasks), ("--output-dir", args.output_dir)) if not v
    ]
    if missing:
        raise InputError(f"missing {', '.join(missing)} (on the command line or in --config).")
    if args.cv_folds == 1:
        raise InputError("--cv-folds must be 0 (skip) or at least 2.")
    if args.head_hidden_dim < 0 or args.truncation_length < 1:
        raise InputError("--head-hidden-dim must be >= 0 and --truncation-length >= 1.")
    check_search_settings(args.sigma0, args.generations, args.seed, args.popsize, args.cma_library)
    if not 0.0 < args.ood_keep_share < 1.0:
        raise InputError(f"--ood-keep-share must lie strictly between 0 and 1, got {args.ood_keep_share}.")
    if args.ood_queries is not None and not args.ood_queries.is_file():
        raise InputError(f"--ood-queries {args.ood_queries} not found; pass a JSONL file of query, group rows.")
    check_value_arguments(args)
    args.backbone_id = args.backbone_id or args.backbone
    args.output_dir = Path(args.output_dir)
    for flag, folder in (("--output-dir", args.output_dir), ("--export", args.export)):
        if folder is not None and folder.exists() and not folder.is_dir():
            raise InputError(f"{flag} {folder} is a file; pass a folder.")
    return args


def check_value_arguments(args: argparse.Namespace) -> None:
    """The cost/latency and search options, checked before any work."""
    from benchgen_router.errors import InputError

    for flag, path in (("--calls", args.calls), ("--pool", args.pool)):
        if path is not None and not path.is_file():
            raise InputError(f"{flag} {path} not found; pass the file (see --help).")
    if args.pool is not None and args.calls is None:
        raise InputError("--pool prices calls: pass --calls FILE with it.")
    points = args.operating_points or []
    names = [name for name, _ in points]
    if points and args.calls is None:
        raise InputError("--operating-point trains for cost and latency: pass --calls FILE (the per-call records).")
    if len(set(names)) != len(names):
        raise InputError(f"--operating-point names repeat: {sorted({n for n in names if names.count(n) > 1})}.")
    if len({tradeoff for _, tradeoff in points}) != len(points):
        raise InputError("two --operating-point names have the same weights; give each point its own trade-off.")
    if args.default_operating_point is not None and args.default_operating_point not in names:
        raise InputError(
            f"--default-operating-point {args.default_operating_point!r} is not one of the --operating-point "
            f"names {names or '(none given)'}."
        )
    if args.target_eps is not None:
        if len(points) < 2:
            raise InputError("--target-eps chooses between operating points: give at least two --operating-point.")
        if args.default_operating_point is not None:
            raise InputError("--target-eps chooses the default operating point; drop --default-operating-point.")
        if not args.target_eps >= 0:
            raise InputError(f"--target-eps must be a reward difference >= 0, got {args.target_eps}.")
        if not args.cv_folds:
            raise InputError("--target-eps chooses by cross-validation: --cv-folds must not be 0.")


def run(args: argparse.Namespace) -> int:
    from dataclasses import fields

    from benchgen_router.trainer import TrainConfig, train

    settings = {item.name: getattr(args, item.name) for item in fields(TrainConfig)}
    result = train(TrainConfig(**{**settings, "card_note": read_card_note(args.card_note)}))
    default = result.default_operating_point
    print_report(result.head, result.evaluation, result.cross_validation, args.ensemble_seeds, default)
    if result.frontier is not None:
        print_frontier(result.frontier, result.target, default, result.manifest.get("operating_points"))
    if result.guard is not None:
        print(format_guard(result.guard))
    return 0


def print_frontier(
    frontier: dict[str, Any], target: dict[str, Any] | None, default: str | None, points: dict[str, Any] | None
) -> None:
    from benchgen_router.frontier import format_frontier, frontier_from_dict, headline_text

    print(format_frontier(frontier_from_dict(frontier), knn_ks=(5,)))
    print(headline_text(frontier["headline"]))
    for name, record in (points or {}).items():
        held = record["held_out"]
        print(
            f"operating point {name} (cost weight {record['cost_weight']:g}, latency weight "
            f"{record['latency_weight']:g}): held out ({held['rows']} rows) reward {held['reward']:.4f}, "
            f"{held['cost_per_1k']:.4f} USD per 1,000 queries, {held['latency_s']:.2f} s"
        )
    if target is not None:
        nested = target["nested_cv"]["point"]
        print(
            f"target mode (eps {target['eps']:g}): chose '{target['chosen']}'; the rule's nested-CV estimate "
            f"({target['nested_cv']['outer']} outer, {target['nested_cv']['inner']} inner): reward "
            f"{nested['reward']:.4f} ± {nested['reward_std_repeats']:.4f}, {nested['cost_per_1k']:.4f} USD per "
            f"1,000 queries, {nested['latency_s']:.2f} s"
        )
    if default is not None:
        print(f"default operating point: {default}")


def format_guard(record: dict[str, Any]) -> str:
    """The guard's calibration (and its measurement on the OOD set) as printed lines."""
    fitted = (
        "in-distribution texts (task prompt views and typed questions)" if "n_outside" in record else "task prompts"
    )
    lines = [
        f"out-of-distribution guard: threshold {record['threshold']:.4f}, fallback {record['fallback_agent']}; "
        f"fitted on {record['n_fit']} {fitted}; of {record['n_calibration']} task prompts held out it "
        f"keeps {record['calibration_kept_share']:.3f} (target {record['keep_share']})"
    ]
    if "plain_calibration_kept_share" in record:
        lines.append(
            f"  and {record['plain_calibration_kept_share']:.3f} of {record['n_plain_calibration']} held-out "
            f"in-domain questions (target {record['plain_keep_share']}); fitted against {record['n_outside']} "
            "outside queries"
        )
    if "plain_questions_kept_share" in record:
        lines.append(f"  plain in-domain questions (packaged set) kept: {record['plain_questions_kept_share']:.3f}")
    for form in ("formatted", "plain"):
        if f"labelled_{form}_flagged_share" in record:
            lines.append(f"  labelled tasks {form}: flagged {record[f'labelled_{form}_flagged_share']:.3f} (in-sample)")
    evaluation = record.get("evaluation")
    if evaluation:
        lines.append(
            f"on {evaluation['ood_queries']} OOD queries ({evaluation['ood_queries_file']}): AUROC "
            f"{evaluation['auroc']:.3f}, flagged {evaluation['ood_flagged_share']:.3f}"
        )
        lines += group_lines(evaluation["groups"])
    return "\n".join(lines)


def print_report(
    result: Any,
    evaluation: dict[str, Any],
    cv: dict[str, Any] | None,
    ensemble_seeds: list[int] | None = None,
    default: str | None = None,
) -> None:
    """What the run prints: the search, the held-out table, the cross-validated estimate."""
    from benchgen_router.evaluation import format_cross_validation, format_evaluation

    runs = f"an ensemble of {len(ensemble_seeds)} seeds, " if ensemble_seeds else ""
    print(
        f"train reward {result.train_reward:.4f} after {result.generations_run} generations "
        f"({result.library}, population {result.popsize}, {runs}{result.seconds:.1f} s)"
    )
    print(format_evaluation(evaluation, "held-out evaluation" + (f" of operating point {default}" if default else "")))
    if cv is not None:
        print(format_cross_validation(cv))
    if not evaluation["beats_best_fixed_agent"]:
        logger.warning(
            "warning: the head does not beat the best fixed agent (%s, %.4f) on the held-out rows; "
            "routing adds nothing over always calling it.",
            evaluation["best_fixed_agent_id"],
            evaluation["best_fixed_agent"],
        )
