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

Out-of-distribution guard (skip it with --no-ood-guard): every prompt of --tasks, labelled or not,
is embedded the same way; the guard's statistics are fitted on a seeded 70% of them and its
threshold calibrated on the other 30% to keep --ood-keep-share of in-distribution queries. Flagged
queries go to the fallback agent, the best fixed agent on the training rows. The statistics are
written as ood_guard.safetensors next to head_weights.npy and the settings recorded in the manifest
(`ood_guard`), with the guard's AUROC and flagged shares on --ood-queries when that file exists.

Held-out rule: rows whose split equals --test-split are held out. If no row has that split and it
is the default 'test', a seeded random 20% is held out (the reference rule); any other split name
that no row carries is an error.

--config FILE reads the reference trainer's JSON keys (model_id, model, rewards_dataset,
tasks_dataset or tasks_path, test_split, head_hidden_dim, cma_seed, cma_sigma0, cma_generations,
cma_population_size, device, output_dir); options given on the command line win over the file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

from benchgen_router.cli.common import (
    EXIT_CODES_HELP,
    add_batching_arguments,
    non_negative_int,
    positive_int,
)
from benchgen_router.data import DEFAULT_TEST_SPLIT
from benchgen_router.manifest import DEFAULT_TRUNCATION_LENGTH
from benchgen_router.ood import group_lines
from benchgen_router.training import CMA_LIBRARIES, DEFAULT_CMA_LIBRARY, MIN_POPSIZE

logger = logging.getLogger("benchgen_router")

HELP = "train a router head with separable CMA-ES on a reward matrix"
DEFAULT_BACKBONE = "Qwen/Qwen3-1.7B"
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
    data.add_argument("--test-split", default=DEFAULT_TEST_SPLIT, help="task split held out (default: test)")
    data.add_argument(
        "--cv-folds",
        type=non_negative_int,
        default=5,
        help="k of the k-fold cross-validation over all labelled rows; 0 skips it (default: 5)",
    )

    model = parser.add_argument_group("backbone and head")
    model.add_argument(
        "--backbone",
        default=DEFAULT_BACKBONE,
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
        default=0,
        help="0: linear head (default); H: tanh MLP with H hidden units",
    )
    model.add_argument(
        "--truncation-length",
        type=positive_int,
        default=DEFAULT_TRUNCATION_LENGTH,
        help="tokens kept per prompt, capped by the backbone's position limit (default: 1024)",
    )
    model.add_argument("--device", default="cpu", help="torch device for the backbone (default: cpu)")
    model.add_argument(
        "--dtype",
        default="float32",
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
    search.add_argument("--sigma0", type=float, default=0.5, help="initial step size (default: 0.5)")
    search.add_argument("--generations", type=int, default=60, help="generations (default: 60)")
    search.add_argument(
        "--seed", type=int, default=42, help="seed of the search, the folds and any random split (default: 42)"
    )
    search.add_argument(
        "--popsize",
        type=positive_int,
        help=f"candidates per generation, >= {MIN_POPSIZE} (default: 4 + 3 ln(n_params))",
    )
    search.add_argument(
        "--cma-library",
        choices=CMA_LIBRARIES,
        default=DEFAULT_CMA_LIBRARY,
        help=f"pycma with CMA_diagonal=True, or cmaes.SepCMA (default: {DEFAULT_CMA_LIBRARY})",
    )

    guard = parser.add_argument_group("out-of-distribution guard")
    guard.add_argument("--no-ood-guard", action="store_true", help="train no out-of-distribution guard (flag no query)")
    guard.add_argument(
        "--ood-keep-share",
        type=float,
        default=0.95,
        help="share of in-distribution queries the guard keeps (calibrated on held-out prompts; default: 0.95)",
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


def read_config(path: Path) -> dict[str, Any]:
    """Option defaults from a reference trainer config file (unknown keys are logged and ignored)."""
    from benchgen_router.errors import UsageError
    from benchgen_router.files import read_json

    config = read_json(path, "config file")
    if not isinstance(config, dict):
        raise UsageError(f"config file {path} must be a JSON object of trainer settings.")
    if "tasks_dataset" in config and "tasks_path" in config:
        raise UsageError(f"config file {path} gives both tasks_dataset and tasks_path; keep one.")
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
            raise UsageError(wrong)
        try:
            defaults[dest] = kind(str(value))
        except ValueError:
            raise UsageError(wrong) from None
    return defaults


def finish_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace, reparse: Any) -> argparse.Namespace:
    """Apply --config (the command line wins over the file), then check what argparse cannot."""
    from benchgen_router.errors import UsageError
    from benchgen_router.training import check_search_settings

    if args.config is not None:
        parser.set_defaults(**read_config(args.config))
        args = reparse()
    missing = [
        f for f, v in (("--rewards", args.rewards), ("--tasks", args.tasks), ("--output-dir", args.output_dir)) if not v
    ]
    if missing:
        raise UsageError(f"missing {', '.join(missing)} (on the command line or in --config).")
    if args.cv_folds == 1:
        raise UsageError("--cv-folds must be 0 (skip) or at least 2.")
    if args.head_hidden_dim < 0 or args.truncation_length < 1:
        raise UsageError("--head-hidden-dim must be >= 0 and --truncation-length >= 1.")
    check_search_settings(args.sigma0, args.generations, args.seed, args.popsize, args.cma_library)
    if not 0.0 < args.ood_keep_share < 1.0:
        raise UsageError(f"--ood-keep-share must lie strictly between 0 and 1, got {args.ood_keep_share}.")
    if args.ood_queries is not None and not args.ood_queries.is_file():
        raise UsageError(f"--ood-queries {args.ood_queries} not found; pass a JSONL file of query, group rows.")
    args.backbone_id = args.backbone_id or args.backbone
    args.output_dir = Path(args.output_dir)
    for flag, folder in (("--output-dir", args.output_dir), ("--export", args.export)):
        if folder is not None and folder.exists() and not folder.is_dir():
            raise UsageError(f"{flag} {folder} is a file; pass a folder.")
    return args


def read_card_note(note: str | None) -> str | None:
    """--card-note text, or the contents of the file named after '@'."""
    from benchgen_router.errors import UsageError

    if note is None or not note.startswith("@"):
        return note
    try:
        return Path(note[1:]).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(
            f"cannot read --card-note file {note[1:]} ({getattr(err, 'strerror', None) or err})."
        ) from None


def model_id(backbone_id: str, agents: list[str], theta: Any) -> str:
    """head-<backbone name>-<10 hex of a hash of the head and pool>, the reference's naming."""
    digest = hashlib.sha256(theta.tobytes() + json.dumps([backbone_id, agents]).encode()).hexdigest()
    return f"head-{backbone_id.rstrip('/').split('/')[-1]}-{digest[:10]}"


def run(args: argparse.Namespace) -> int:
    from functools import partial

    import numpy as np

    from benchgen_router.data import held_out_mask, join_rewards, load_rows
    from benchgen_router.folder import check_output_folder

    progress = not args.no_progress
    card_note = read_card_note(args.card_note)
    if args.export is not None:
        check_output_folder(args.export, overwrite=False)  # before the work, so a bad folder costs nothing
    reward_rows = load_rows(args.rewards, "rewards")  # rewards first: their errors are reported first
    task_rows = load_rows(args.tasks, "tasks")
    data = join_rewards(reward_rows, task_rows)
    test, how = held_out_mask(data, args.test_split, args.seed)

    # The data are good: now the heavy imports (torch, transformers).
    from benchgen_router.convert import convert_release
    from benchgen_router.embeddings import default_cache_dir, embed_prompts
    from benchgen_router.evaluation import evaluate_picks
    from benchgen_router.files import staging_dir, to_json
    from benchgen_router.head import head_picks
    from benchgen_router.ood import GUARD_FILE, save_guard
    from benchgen_router.training import cross_validate, search_head

    logger.info(
        "%d labelled rows, %d agents: %d train, %d held out (%s)",
        len(data),
        len(data.agents),
        int((~test).sum()),
        int(test.sum()),
        how,
    )

    timings: dict[str, float] = {}
    started = time.perf_counter()
    embed = partial(
        embed_prompts,
        backbone=args.backbone,
        agents=data.agents,
        revision=args.backbone_revision,
        dtype=args.dtype,
        truncation_length=args.truncation_length,
        device=args.device,
        batch_size=args.batch_size,
        max_batch_tokens=args.max_batch_tokens,
        cache_dir=None if args.no_cache else (args.cache_dir or default_cache_dir()),
        progress=progress,
        allow_emulated_bf16=args.allow_emulated_bf16,
    )
    embedded = embed(data.prompts)
    timings["embedding_seconds"] = time.perf_counter() - started
    trained_guard = None
    if not args.no_ood_guard:
        started = time.perf_counter()
        trained_guard = fit_task_guard(args, task_rows, data, test, embed)
        timings["ood_guard_seconds"] = time.perf_counter() - started
    embeddings, rewards = embedded.vectors.astype(np.float64), data.rewards
    search = partial(
        search_head,
        hidden_dim=args.head_hidden_dim,
        sigma0=args.sigma0,
        generations=args.generations,
        seed=args.seed,
        popsize=args.popsize,
        library=args.cma_library,
    )
    result = search(embeddings[~test], rewards[~test], progress=progress)
    timings["search_seconds"] = result.seconds
    picks = head_picks(result.theta, embeddings[test], len(data.agents), args.head_hidden_dim)
    evaluation = evaluate_picks(picks, rewards[test], data.agents)
    cv = None
    if args.cv_folds:
        started = time.perf_counter()
        cv = cross_validate(
            embeddings, rewards, data.agents, args.cv_folds, args.seed, args.head_hidden_dim, search, progress=progress
        )
        timings["cross_validation_seconds"] = time.perf_counter() - started

    manifest = build_manifest(args, data, test, how, result, evaluation, cv, embedded, timings)
    if trained_guard is not None:
        manifest["ood_guard"] = trained_guard.record
    with staging_dir(args.output_dir) as staging:
        np.save(staging / "head_weights.npy", result.theta.astype(np.float64), allow_pickle=False)
        if trained_guard is not None:
            save_guard(staging / GUARD_FILE, trained_guard.guard)
        (staging / "manifest.json").write_text(to_json(manifest, indent=2) + "\n", encoding="utf-8")
    logger.info("wrote %s (head_weights.npy, manifest.json)", args.output_dir)
    if args.export is not None:
        convert_release(
            args.output_dir / "manifest.json",
            args.output_dir / "head_weights.npy",
            args.export,
            backbone=args.backbone,
            backbone_revision=args.backbone_revision,
            backbone_id=args.backbone_id,
            card_note=card_note,
        )

    print_report(result, evaluation, cv)
    if trained_guard is not None:
        print(format_guard(trained_guard.record))
    return 0


def fit_task_guard(args: argparse.Namespace, task_rows: list[dict[str, Any]], data: Any, test: Any, embed: Any) -> Any:
    """The out-of-distribution guard of this run (ood.train_guard) on every prompt of the task pool,
    measured on the OOD query set when there is one; None (with a warning) when the pool has too few
    prompts to calibrate the keep share."""
    import numpy as np

    from benchgen_router import ood

    prompts = list(dict.fromkeys(row["prompt"] for row in task_rows if isinstance(row.get("prompt"), str)))
    prompts = [prompt for prompt in prompts if prompt.strip()]
    needed = ood.min_prompts_to_calibrate(args.ood_keep_share)
    if len(prompts) < needed:
        logger.warning(
            "warning: no out-of-distribution guard: %d task prompts cannot calibrate a %.0f%% keep share "
            "(need at least %d); pass a larger --tasks pool or --no-ood-guard.",
            len(prompts),
            100 * args.ood_keep_share,
            needed,
        )
        return None
    vectors = embed(prompts).vectors
    trained = ood.train_guard(
        vectors,
        data.rewards[~test],
        data.agents,
        keep_share=args.ood_keep_share,
        metadata={"backbone": args.backbone_id},
    )
    queries_file = args.ood_queries or ood.PACKAGED_OOD_QUERIES
    if queries_file.is_file():
        queries, groups = ood.read_ood_queries(queries_file)
        _, calibration_rows = ood.split_indices(
            len(vectors), (1.0 - ood.DEFAULT_CALIBRATION_SHARE, ood.DEFAULT_CALIBRATION_SHARE), ood.DEFAULT_SPLIT_SEED
        )
        outside = embed(queries).vectors
        trained.record["evaluation"] = ood.evaluate_guard(
            trained.guard.scores,
            trained.guard.threshold,
            vectors[np.asarray(calibration_rows)],
            outside,
            groups,
            f"the {len(calibration_rows)} task prompts of the calibration split, not used to fit the statistics",
        )
        trained.record["evaluation"]["ood_queries_file"] = queries_file.name
    return trained


def format_guard(record: dict[str, Any]) -> str:
    """The guard's calibration (and its measurement on the OOD set) as printed lines."""
    lines = [
        f"out-of-distribution guard: threshold {record['threshold']:.4f}, fallback {record['fallback_agent']}; "
        f"fitted on {record['n_fit']} task prompts, calibrated on {record['n_calibration']} held out: "
        f"keeps {record['calibration_kept_share']:.3f} of them (target {record['keep_share']})"
    ]
    evaluation = record.get("evaluation")
    if evaluation:
        lines.append(
            f"on {evaluation['ood_queries']} OOD queries ({evaluation['ood_queries_file']}): AUROC "
            f"{evaluation['auroc']:.3f}, flagged {evaluation['ood_flagged_share']:.3f}"
        )
        lines += group_lines(evaluation["groups"])
    return "\n".join(lines)


def build_manifest(
    args: argparse.Namespace,
    data: Any,
    test: Any,
    how: str,
    result: Any,
    evaluation: dict[str, Any],
    cv: dict[str, Any] | None,
    embedded: Any,
    timings: dict[str, float],
) -> dict[str, Any]:
    """The run's manifest: every reference key, plus the evaluation, cross-validation and search settings."""
    from benchgen_router.manifest import make_manifest

    return make_manifest(
        model_id=args.model_id or model_id(args.backbone_id, data.agents, result.theta),
        backbone_model=args.backbone_id,
        backbone_revision=args.backbone_revision,
        rewards_dataset=args.rewards_id or args.rewards,
        agent_order=data.agents,
        embedding_dim=int(embedded.vectors.shape[1]),
        head_hidden_dim=args.head_hidden_dim,
        n_head_params=int(result.theta.size),
        n_total=len(data),
        n_train=int((~test).sum()),
        n_test=int(test.sum()),
        held_out=how,
        train_reward=result.train_reward,
        test_reward=evaluation["router"],
        baselines={key: evaluation[key] for key in ("random_agent", "best_fixed_agent", "oracle")},
        beats_best_fixed_agent=evaluation["beats_best_fixed_agent"],
        cma_generations_run=result.generations_run,
        history=result.history,
        duration_seconds=round(sum(timings.values()), 3),
        truncation_length=embedded.truncation_length,
        evaluation=evaluation,
        cross_validation=cv,
        cma={
            "library": result.library,
            "sigma0": args.sigma0,
            "seed": args.seed,
            "popsize": result.popsize,
            "generations": args.generations,
        },
        timings={key: round(value, 3) for key, value in timings.items()},
    )


def print_report(result: Any, evaluation: dict[str, Any], cv: dict[str, Any] | None) -> None:
    """What the run prints: the search, the held-out table, the cross-validated estimate."""
    from benchgen_router.evaluation import format_cross_validation, format_evaluation

    print(
        f"train reward {result.train_reward:.4f} after {result.generations_run} generations "
        f"({result.library}, population {result.popsize}, {result.seconds:.1f} s)"
    )
    print(format_evaluation(evaluation, "held-out evaluation"))
    if cv is not None:
        print(format_cross_validation(cv))
    if not evaluation["beats_best_fixed_agent"]:
        logger.warning(
            "warning: the head does not beat the best fixed agent (%s, %.4f) on the held-out rows; "
            "routing adds nothing over always calling it.",
            evaluation["best_fixed_agent_id"],
            evaluation["best_fixed_agent"],
        )
