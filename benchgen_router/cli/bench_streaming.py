"""Peak memory of `benchgen-router route --input` against the size of its input: it must stay flat.

    python -m benchgen_router.bench.streaming                       # 10k, 100k and 1M lines
    python -m benchgen_router.bench.streaming --lines 10000 100000 --model ./router

Prints one markdown table (--json: the figures); docs/benchmark.md says what is measured.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from benchgen_router.bench.streaming import DEFAULT_LINES, measure_sizes, table_lines
from benchgen_router.bench.workload import DEFAULT_TASKS, load_workload
from benchgen_router.hardware import cpu_summary


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--lines", type=int, nargs="+", default=list(DEFAULT_LINES), help="input sizes in lines")
    parser.add_argument("--model", type=Path, help="router to route with (default: a tiny random Qwen3 router)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the routing process (default: 1)")
    parser.add_argument("--tasks", type=Path, default=DEFAULT_TASKS, help="workload JSONL (default: %(default)s)")
    parser.add_argument("--workdir", type=Path, help="where to write the inputs (default: a temporary folder)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m benchgen_router.bench.streaming`: the table, or with --json the figures."""
    args = parse_args(argv)
    prompts, source = load_workload(args.tasks, seed=0)
    rows = measure_sizes(prompts, args.lines, args.model, args.threads, args.workdir)
    if args.json:
        print(json.dumps({"workload": source, "cpu": cpu_summary(), "rows": rows}))
        return 0
    print("\n".join(table_lines(rows, args.model, source, args.threads)))
    return 0
