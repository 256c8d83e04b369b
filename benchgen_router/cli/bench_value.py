"""benchgen-router bench value: routing value on an imported outcome matrix, every router on the same folds.

    benchgen-router import --long outcomes.csv --prompts questions.jsonl --cost-column cost_usd \
        --drop-incomplete --output-dir mmlu-pro/
    benchgen-router bench value --data mmlu-pro/ --output-dir out/
    benchgen-router bench value --data mmlu-pro/ --output-dir out/ --repeats 1 --routers probability,knn   # quicker
    benchgen-router bench value --data mmlu-pro/ --output-dir out/ --routers probability,layers,stats,knn-stack

Reads the folder `import` (or `collect`) writes: tasks.jsonl (prompt, task_group), rewards.jsonl and
calls.jsonl (each call's cost). Every router (the probability head and kNN, matrix factorisation and the
per-category lookup, each swept by the lambda and tolerance rules; the CMA-ES heads over a cost sweep; on
request the probability head over richer frozen features: per-layer means, query statistics, its neighbours'
outcomes) is fitted on the training rows of each fold and scored on its held-out rows, over k-fold x repeats and
leave-groups-out (the task groups dealt into folds), beside each single model, RouterBench's zero router
and the oracle. Figures, mean ± std over folds: the least share of the reference's cost (the single model
best on the training rows) at which a router matches its accuracy, the best accuracy, RouterBench's AIQ;
with two agents also RouteLLM's APGR and CPT. Writes OUTPUT_DIR/value.md (the tables), value.json (every
fold's points and figures) and value.png (the curves; with two agents also value-gap.png, the gap
recovered against the share of strong calls). Details: docs/benchmarks/mmlu-pro.md and
docs/benchmarks/routellm.md (RouteLLM's outcomes: import them with --call-cost strong=1 weak=0
--call-cost-unit calls).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchgen_router.bench.value.finetuned import BENCH_SETTINGS
from benchgen_router.bench.value.routers import DEFAULT_KNN_K, DEFAULT_ROUTERS, ROUTERS
from benchgen_router.bench.value.run import DEFAULT_BACKBONE, DEFAULT_BUDGETS, DEFAULT_COST_WEIGHTS, RULES
from benchgen_router.cli.common import EXIT_CODES_HELP, EXIT_OK, positive_int

HELP = "routing value on an imported outcome matrix: every router on the same folds, against single models"


def _names(choices: tuple[str, ...]):
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(part.strip() for part in text.split(",") if part.strip())
        unknown = [name for name in names if name not in choices]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(choices)} (comma-separated), got {text!r}")
        return names

    return parse


def _numbers(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None
    if not values or any(value < 0 for value in values):
        raise argparse.ArgumentTypeError(f"{text!r}: give numbers >= 0")
    return values


def _count(text: str) -> int:
    value = int(text) if text.isdigit() else -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    title, _, details = (__doc__ or "").partition("\n\n")
    parser.description, parser.epilog = title, details + "\n" + EXIT_CODES_HELP
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add = parser.add_argument
    add("--data", type=Path, required=True, metavar="DIR", help="an imported folder (tasks, rewards, calls .jsonl)")
    add("--output-dir", type=Path, required=True, metavar="DIR", help="where value.md, value.json and value.png go")
    add("--pool", type=Path, metavar="FILE", help="pool file whose prices cost calls that carry tokens but no cost")
    add("--name", help="the matrix's name in the tables (default: the folder's name)")
    add(
        "--cost-unit",
        default="USD per 1,000 queries",
        help="what the calls' costs count, per 1,000 queries (default: %(default)s; an import with "
        "--call-cost-unit calls counts calls: e.g. 'strong calls per 1,000 queries')",
    )
    add("--folds", type=positive_int, default=5, help="k of k-fold (default: %(default)s)")
    add(
        "--repeats",
        type=_count,
        default=3,
        help="k-fold repeats, 0 for none: the leave-groups-out folds only (default: %(default)s)",
    )
    add("--group-folds", type=_count, default=5, help="leave-groups-out folds, 0 for none (default: %(default)s)")
    add("--seed", type=int, default=0, help="seed of the folds and the fits (default: %(default)s)")
    add(
        "--routers",
        type=_names(ROUTERS),
        default=DEFAULT_ROUTERS,
        help=f"of {', '.join(ROUTERS)} (default: {', '.join(DEFAULT_ROUTERS)}; layers, stats and knn-stack widen "
        "the probability head with frozen features, layers after an embedding pass of its own)",
    )
    add("--rules", type=_names(RULES), default=RULES, help="rules the probability routers are swept by")
    add(
        "--cost-weights",
        type=_numbers,
        default=DEFAULT_COST_WEIGHTS,
        help="CMA-ES: reward per unit of the reference's cost, one head each (default: %(default)s)",
    )
    add(
        "--budgets",
        type=_numbers,
        default=DEFAULT_BUDGETS,
        help="usd-per-1k budgets asked of the probability head, as shares of the reference's cost",
    )
    add("--knn-k", type=positive_int, default=DEFAULT_KNN_K, help="kNN's neighbours (default: %(default)s)")
    add("--generations", type=positive_int, help="CMA-ES generations (default: the release search's)")
    add("--cmaes-splits", type=positive_int, help="fit CMA-ES on the first N folds of each kind only (time)")
    add("--backbone", default=DEFAULT_BACKBONE, help="embedding backbone (default: the default router's)")
    tune = BENCH_SETTINGS
    add("--finetune-epochs", type=positive_int, help=f"finetuned: most epochs per fold (default: {tune.epochs})")
    add("--finetune-layers", type=positive_int, help=f"finetuned: top layers trained (default: {tune.layers})")
    add(
        "--finetune-learning-rate", type=float, help=f"finetuned: AdamW's learning rate (default: {tune.learning_rate})"
    )
    add("--cache-dir", type=Path, help="embedding cache folder (default: the package's)")
    add("--no-progress", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    from benchgen_router.bench.value import ValueConfig, read_imported_folder, run_value_benchmark
    from benchgen_router.bench.value.features import compute_features
    from benchgen_router.bench.value.report import format_result, plot_gap, plot_result, result_to_dict
    from benchgen_router.errors import InputError
    from benchgen_router.files import atomic_output

    if not args.output_dir.is_dir():
        raise InputError(f"--output-dir {args.output_dir} is not a folder; create it first.")
    matrix = read_imported_folder(args.data, args.pool, args.name, args.cost_unit)
    config = ValueConfig(
        folds=args.folds,
        repeats=args.repeats,
        group_folds=args.group_folds,
        seed=args.seed,
        routers=args.routers,
        rules=args.rules,
        cost_weights=args.cost_weights,
        budgets=args.budgets,
        knn_k=args.knn_k,
        search={} if args.generations is None else {"generations": args.generations},
        cmaes_splits=args.cmaes_splits,
        backbone=args.backbone,
        finetune=finetune_settings(args),
        cache_dir=args.cache_dir,
        progress=not args.no_progress,
    )
    features = compute_features(config.routers, matrix.prompts, config)  # what the chosen routers read
    result = run_value_benchmark(matrix, config, features=features)
    tables = format_result(result)
    print(tables)
    with atomic_output(args.output_dir / "value.json") as handle:
        json.dump(result_to_dict(result), handle, indent=1)
    with atomic_output(args.output_dir / "value.md") as handle:
        handle.write(tables + "\n")
    plot_result(result, args.output_dir / "value.png")
    if len(result.agents) == 2:
        plot_gap(result, args.output_dir / "value-gap.png")
    return EXIT_OK


def finetune_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The finetuned router's settings (training.config.FinetuneSettings' fields, plain JSON for value.json): its
    defaults (bench.value.finetuned.BENCH_SETTINGS) with the flags given."""
    from dataclasses import asdict, replace

    from benchgen_router.training.config import check_finetune_settings

    given = {
        "epochs": args.finetune_epochs,
        "layers": args.finetune_layers,
        "learning_rate": args.finetune_learning_rate,
    }
    settings = replace(BENCH_SETTINGS, **{key: value for key, value in given.items() if value is not None})
    check_finetune_settings(settings)
    return asdict(settings)
