"""Train a router head for any agent pool with separable CMA-ES, and evaluate it on held-out data.

    python train_head.py --rewards rewards.jsonl --tasks tasks.jsonl --backbone Qwen/Qwen3-1.7B \\
        --output-dir run/ [--export router/]

Follows /work/shared/REFERENCE.md: reward rows are joined with task prompts on task_id (rows with
no task are skipped; fewer than 10 joined rows is refused), the rows whose task split is
--test-split are held out, and separable CMA-ES searches the flat head vector from zeros, scoring
each candidate by the mean training reward of its picks and keeping the best candidate ever seen.
Prompts are embedded by the same RouterModel code that serves the converted router, and cached on
disk, so a re-run or a sweep does not embed again.

Writes head_weights.npy (flat float64 theta) and manifest.json into --output-dir, which
convert_npy.py turns into a Hub folder; --export DIR does that conversion in the same run. Prints
the held-out evaluation (router vs best fixed agent, uniform random, per-question oracle, the share
of the routing headroom captured, picks per agent) and a k-fold cross-validated estimate over all
labelled rows, and stores both in the manifest.

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
import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from router_utils import (
    REFERENCE_MAX_LENGTH,
    UsageError,
    add_batching_arguments,
    atomic_output,
    read_json,
    run_cli,
    staging_dir,
)
from training import (
    CMA_LIBRARIES,
    DEFAULT_CMA_LIBRARY,
    DEFAULT_TEST_SPLIT,
    LabelledData,
    SearchResult,
    cross_validate,
    default_cache_dir,
    embed_prompts,
    evaluate_picks,
    format_cross_validation,
    format_evaluation,
    head_picks,
    held_out_mask,
    join_rewards,
    load_rows,
    search_head,
)

logger = logging.getLogger("benchgen_router.train")

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


def build_parser() -> argparse.ArgumentParser:
    summary, _, details = __doc__.partition("\n\n")
    parser = argparse.ArgumentParser(
        description=summary, epilog=details, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    data = parser.add_argument_group("data")
    data.add_argument("--config", type=Path, help="JSON file with the reference trainer's keys (see below)")
    data.add_argument("--rewards", help="rewards: local JSONL file or Hub dataset id (e.g. benchgen/router-pilot)")
    data.add_argument("--tasks", help="task prompts: local JSONL file or Hub dataset id (benchgen/router-pilot-tasks)")
    data.add_argument("--rewards-id", help="what the manifest records as rewards_dataset (default: --rewards)")
    data.add_argument("--test-split", default=DEFAULT_TEST_SPLIT, help="task split held out (default: test)")
    data.add_argument(
        "--cv-folds",
        type=int,
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
        "--head-hidden-dim", type=int, default=0, help="0: linear head (default); H: tanh MLP with H hidden units"
    )
    model.add_argument(
        "--truncation-length",
        type=int,
        default=REFERENCE_MAX_LENGTH,
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
        "--cache-dir", type=Path, default=default_cache_dir(), help="embedding cache folder (default: %(default)s)"
    )
    model.add_argument("--no-cache", action="store_true", help="neither read nor write the embedding cache")

    search = parser.add_argument_group("search (separable CMA-ES)")
    search.add_argument("--sigma0", type=float, default=0.5, help="initial step size (default: 0.5)")
    search.add_argument("--generations", type=int, default=60, help="generations (default: 60)")
    search.add_argument(
        "--seed", type=int, default=42, help="seed of the search, the folds and any random split (default: 42)"
    )
    search.add_argument("--popsize", type=int, help="candidates per generation (default: 4 + 3 ln(n_params))")
    search.add_argument(
        "--cma-library",
        choices=CMA_LIBRARIES,
        default=DEFAULT_CMA_LIBRARY,
        help=f"pycma with CMA_diagonal=True, or cmaes.SepCMA (default: {DEFAULT_CMA_LIBRARY})",
    )

    output = parser.add_argument_group("output")
    output.add_argument("--output-dir", help="folder for head_weights.npy and manifest.json")
    output.add_argument("--model-id", help="manifest model_id (default: head-<backbone name>-<hash of the head>)")
    output.add_argument("--export", type=Path, metavar="DIR", help="also write the converted Hub folder here")
    output.add_argument("--card-note", metavar="TEXT|@FILE", help="markdown appended to the exported model card")
    output.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    return parser


def read_config(path: Path) -> dict[str, Any]:
    """Option defaults from a reference trainer config file (unknown keys are logged and ignored)."""
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


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.config is not None:
        parser.set_defaults(**read_config(args.config))
        args = parser.parse_args(argv)  # the command line overrides the file
    missing = [
        flag
        for flag, value in (("--rewards", args.rewards), ("--tasks", args.tasks), ("--output-dir", args.output_dir))
        if not value
    ]
    if missing:
        raise UsageError(f"missing {', '.join(missing)} (on the command line or in --config).")
    checks = [
        (args.generations >= 1, "--generations must be at least 1"),
        (args.sigma0 > 0, "--sigma0 must be positive"),
        (args.popsize is None or args.popsize >= 2, "--popsize must be at least 2"),
        (args.head_hidden_dim >= 0, "--head-hidden-dim must be 0 (linear) or a positive number of units"),
        (args.cv_folds == 0 or args.cv_folds >= 2, "--cv-folds must be 0 (skip) or at least 2"),
        (args.truncation_length >= 1, "--truncation-length must be at least 1"),
    ]
    for ok, message in checks:
        if not ok:
            raise UsageError(message + ".")
    args.backbone_id = args.backbone_id or args.backbone
    args.output_dir = Path(args.output_dir)
    for flag, folder in (("--output-dir", args.output_dir), ("--export", args.export)):
        if folder is not None and folder.exists() and not folder.is_dir():
            raise UsageError(f"{flag} {folder} is a file; pass a folder.")
    return args


def read_card_note(note: str | None) -> str | None:
    """--card-note text, or the contents of the file named after '@'."""
    if note is None or not note.startswith("@"):
        return note
    try:
        return Path(note[1:]).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"cannot read --card-note file {note[1:]} ({err.strerror or err}).") from None


def build_manifest(
    args: argparse.Namespace,
    data: LabelledData,
    test: np.ndarray,
    how: str,
    result: SearchResult,
    embedding_dim: int,
    evaluation: dict[str, Any],
    cv: dict[str, Any] | None,
    truncation_length: int,
    timings: dict[str, float],
) -> dict[str, Any]:
    """Every REFERENCE.md manifest key, plus the evaluation, cross-validation and search settings."""
    theta = result.theta
    digest = hashlib.sha256(theta.tobytes() + json.dumps([args.backbone_id, data.agents]).encode()).hexdigest()
    return {
        "model_id": args.model_id or f"head-{args.backbone_id.rstrip('/').split('/')[-1]}-{digest[:10]}",
        "backbone_model": args.backbone_id,
        "backbone_revision": args.backbone_revision,
        "rewards_dataset": args.rewards_id or args.rewards,
        "agent_order": data.agents,
        "embedding_dim": embedding_dim,
        "head_hidden_dim": args.head_hidden_dim,
        "n_head_params": int(theta.size),
        "n_total": len(data),
        "n_train": int((~test).sum()),
        "n_test": int(test.sum()),
        "held_out": how,
        "train_reward": result.train_reward,
        "test_reward": evaluation["router"],
        "baselines": {key: evaluation[key] for key in ("random_agent", "best_fixed_agent", "oracle")},
        "beats_best_fixed_agent": evaluation["beats_best_fixed_agent"],
        "cma_generations_run": result.generations_run,
        "history": result.history,
        "duration_seconds": round(sum(timings.values()), 3),
        "truncation_length": truncation_length,
        "evaluation": evaluation,
        "cross_validation": cv,
        "cma": {
            "library": result.library,
            "sigma0": args.sigma0,
            "seed": args.seed,
            "popsize": result.popsize,
            "generations": args.generations,
        },
        "timings": {key: round(value, 3) for key, value in timings.items()},
    }


def export(args: argparse.Namespace, card_note: str | None) -> None:
    """convert_npy.py on the files just written: the recorded backbone id, read from --backbone."""
    from convert_npy import convert

    folder = convert(
        argparse.Namespace(
            manifest=args.output_dir / "manifest.json",
            weights=args.output_dir / "head_weights.npy",
            output_dir=args.export,
            backbone=args.backbone_id,
            backbone_revision=args.backbone_revision,
            bundle_backbone=False,
            push_to_hub=None,
        ),
        load_from=args.backbone,
    )
    if card_note:
        readme = Path(folder) / "README.md"
        card, mode = readme.read_text(encoding="utf-8"), readme.stat().st_mode
        with atomic_output(readme) as handle:
            handle.write(card.rstrip("\n") + "\n\n" + card_note.strip("\n") + "\n")
        readme.chmod(mode)  # the temporary file was private; keep the card as readable as convert left it


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    progress = not args.no_progress
    card_note = read_card_note(args.card_note)
    data = join_rewards(load_rows(args.rewards, "rewards"), load_rows(args.tasks, "tasks"))
    test, how = held_out_mask(data, args.test_split, args.seed)
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
    embedded = embed_prompts(
        data.prompts,
        args.backbone,
        data.agents,
        revision=args.backbone_revision,
        dtype=args.dtype,
        truncation_length=args.truncation_length,
        device=args.device,
        batch_size=args.batch_size,
        max_batch_tokens=args.max_batch_tokens,
        cache_dir=None if args.no_cache else args.cache_dir,
        progress=progress,
    )
    timings["embedding_seconds"] = time.perf_counter() - started
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

    manifest = build_manifest(
        args, data, test, how, result, embeddings.shape[1], evaluation, cv, embedded.truncation_length, timings
    )
    with staging_dir(args.output_dir) as staging:
        np.save(staging / "head_weights.npy", result.theta.astype(np.float64), allow_pickle=False)
        (staging / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    logger.info("wrote %s (head_weights.npy, manifest.json)", args.output_dir)
    if args.export is not None:
        export(args, card_note)

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
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
