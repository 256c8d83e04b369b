"""LiteLLM's built-in complexity auto-router beside the probability head, on the same held-out folds and with
the metrics of `benchgen-router bench value` (docs/integrations/litellm.md has the figures).

    benchgen-router import --routellm routellm-evals/gsm8k/gsm8k_responses.csv \
        --contaminated routellm-evals/gsm8k/contaminated_prompts.jsonl --call-cost gpt-4-1106-preview=1 \
        --call-cost mistralai/Mixtral-8x7B-Instruct-v0.1=0 --call-cost-unit calls --output-dir gsm8k/
    python scripts/litellm_autorouter_comparison.py --data routellm/gsm8k=gsm8k/ --calls routellm/gsm8k \
        --data mmlu-pro=mmlu-pro/ --output-dir out/ [--sample routellm/mmlu=3000]

Each matrix: the routing-value benchmark with the probability head alone (fitted on each training fold,
k-fold only), then LiteLLM's classifier on the same held-out rows (bench.litellm_autorouter). Writes
OUTPUT_DIR/litellm-autorouter.md, .json and .png.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM's price map from its wheel, offline


def named_folder(text: str) -> tuple[str, Path]:
    name, separator, folder = text.partition("=")
    if not separator or not name or not folder:
        raise argparse.ArgumentTypeError(f"give NAME=FOLDER (an imported folder), got {text!r}")
    return name, Path(folder)


def named_count(text: str) -> tuple[str, int]:
    name, _, count = text.partition("=")
    if not name or not count.isdigit() or int(count) < 10:
        raise argparse.ArgumentTypeError(f"give NAME=N (N >= 10 rows), got {text!r}")
    return name, int(count)


def main(argv: list[str] | None = None) -> int:
    from benchgen_router.bench.litellm_autorouter import (
        classify,
        compare,
        comparison_to_dict,
        format_comparison,
        plot_comparisons,
    )
    from benchgen_router.bench.value import ValueConfig, read_imported_folder, run_value_benchmark
    from benchgen_router.errors import InputError
    from benchgen_router.files import atomic_output

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=named_folder, action="append", required=True, metavar="NAME=FOLDER")
    parser.add_argument("--calls", action="append", default=[], metavar="NAME", help="a matrix whose cost counts calls")
    parser.add_argument(
        "--sample", type=named_count, action="append", default=[], metavar="NAME=N", help="a seeded sample of N rows"
    )
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not args.output_dir.is_dir():
        print(f"error: --output-dir {args.output_dir} is not a folder; create it first.", file=sys.stderr)
        return 2
    sections, records, panels = [], [], []
    try:
        for name, folder in args.data:
            started = time.perf_counter()
            matrix = read_imported_folder(folder, name=name)
            if name in dict(args.sample):  # the rows kept in their order, so that the folds are drawn alike
                keep = np.random.default_rng(args.seed).choice(len(matrix), dict(args.sample)[name], replace=False)
                matrix = matrix.rows(np.sort(keep))
            if name in args.calls:
                matrix.cost_unit = "strong calls per 1,000 queries"
            config = ValueConfig(
                folds=args.folds, repeats=args.repeats, seed=args.seed, group_folds=0, routers=("probability",)
            )
            result = run_value_benchmark(matrix, config)
            classified = classify(matrix.prompts)
            comparisons = compare(matrix, result, classified)
            sections.append(format_comparison(name, result, comparisons))
            records.append(comparison_to_dict(name, result, comparisons))
            panels.append((name, matrix.cost_unit, comparisons))
            print(f"{name}: {len(matrix)} queries, {time.perf_counter() - started:.0f} s", file=sys.stderr)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    with atomic_output(args.output_dir / "litellm-autorouter.md") as handle:
        handle.write("\n".join(sections))
    with atomic_output(args.output_dir / "litellm-autorouter.json") as handle:
        json.dump(records, handle, indent=1)
    plot_comparisons(panels, args.output_dir / "litellm-autorouter.png")
    print("\n".join(sections))
    return 0


if __name__ == "__main__":
    sys.exit(main())
