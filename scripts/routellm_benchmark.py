"""RouteLLM's MMLU and GSM8K outcomes as a routing benchmark, in one command (docs/benchmarks/routellm.md).

    python scripts/routellm_benchmark.py --data-dir routellm-evals --output-dir out/

Repeated k-fold on each dataset (and leave-subjects-out on MMLU), every router kind and baseline on the
same folds, RouteLLM's APGR, CPT(50%) and CPT(80%) as mean ± std over folds: see
benchgen_router/bench/routellm.py. Writes OUTPUT_DIR/routellm.json, routellm.md (the tables) and
routellm.png (the curves).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchgen_router.bench.routellm import (
    DATASETS,
    DEFAULT_COST_WEIGHTS,
    DEFAULT_KNN_K,
    RouteLLMBenchConfig,
    format_results,
    plot_results,
    results_to_dict,
    run_benchmark,
)
from benchgen_router.errors import InputError
from benchgen_router.files import atomic_output


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of numbers") from None


def _samples(items: list[str]) -> dict[str, int]:
    samples = {}
    for item in items:
        name, _, count = item.partition("=")
        if not count.isdigit():
            raise SystemExit(f"error: --sample {item!r} is not DATASET=N (e.g. mmlu=4000)")
        samples[name] = int(count)
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True, help="RouteLLM's evals data (mmlu/, gsm8k/)")
    parser.add_argument("--output-dir", type=Path, required=True, help="folder for routellm.json, .md and .png")
    parser.add_argument("--datasets", default="mmlu,gsm8k", help=f"comma-separated, of {', '.join(DATASETS)}")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cv-seed", type=int, default=0)
    parser.add_argument("--subject-folds", type=int, default=5, help="leave-subjects-out folds on MMLU (0: none)")
    parser.add_argument(
        "--cost-weights", type=_floats, default=DEFAULT_COST_WEIGHTS, help="reward per strong call, comma-separated"
    )
    parser.add_argument("--generations", type=int, help="CMA-ES generations (default: the release search's)")
    parser.add_argument("--cmaes-splits", type=int, help="train CMA-ES on the first N splits of each kind only")
    parser.add_argument("--knn-k", type=int, default=DEFAULT_KNN_K)
    parser.add_argument("--limit", type=int, help="the first N questions of each dataset only (a quick try)")
    parser.add_argument(
        "--sample", action="append", default=[], metavar="DATASET=N", help="a seeded random sample of N questions"
    )
    parser.add_argument("--backbone", help="embedding backbone (default: the default router's MiniLM)")
    parser.add_argument("--cache-dir", type=Path, help="embedding cache folder (default: the package's)")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    config = RouteLLMBenchConfig(
        data_dir=args.data_dir,
        datasets=tuple(name.strip() for name in args.datasets.split(",") if name.strip()),
        folds=args.folds,
        repeats=args.repeats,
        cv_seed=args.cv_seed,
        subject_folds=args.subject_folds,
        cost_weights=args.cost_weights,
        search={} if args.generations is None else {"generations": args.generations},
        cmaes_splits=args.cmaes_splits,
        knn_k=args.knn_k,
        limit=args.limit,
        sample=_samples(args.sample),
        cache_dir=args.cache_dir,
        progress=not args.no_progress,
        **({"backbone": args.backbone} if args.backbone else {}),
    )
    try:
        if not args.output_dir.is_dir():
            raise InputError(f"--output-dir {args.output_dir} is not a folder; create it first.")
        result = run_benchmark(config)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    tables = format_results(result)
    print(tables)
    with atomic_output(args.output_dir / "routellm.json") as handle:
        json.dump(results_to_dict(result), handle, indent=1)
    with atomic_output(args.output_dir / "routellm.md") as handle:
        handle.write(tables + "\n")
    plot_results(result, args.output_dir / "routellm.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
