"""benchgen-router bench streaming: peak memory of `benchgen-router route --input` against its input's size.

    benchgen-router bench streaming                          # 10k, 100k and 1M lines
    benchgen-router bench streaming --lines 10000 100000 --model ./router

It must stay flat. Prints one markdown table (--json: the figures); docs/benchmark.md says what is measured.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchgen_router.bench.streaming import DEFAULT_LINES
from benchgen_router.bench.workload import DEFAULT_TASKS
from benchgen_router.cli.common import EXIT_CODES_HELP, positive_int

HELP = "peak memory of `route --input` against the size of its input"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    title, _, details = (__doc__ or "").partition("\n\n")
    parser.description, parser.epilog = title, details + "\n" + EXIT_CODES_HELP
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add = parser.add_argument
    add("--lines", type=positive_int, nargs="+", default=list(DEFAULT_LINES), help="input sizes in lines")
    add("--model", type=Path, help="router to route with (default: a tiny random BERT router with MiniLM's tokenizer)")
    add("--threads", type=positive_int, default=1, help="torch threads of the routing process (default: 1)")
    add("--tasks", type=Path, default=DEFAULT_TASKS, help="workload JSONL (default: %(default)s)")
    add("--workdir", type=Path, help="where to write the inputs (default: a temporary folder)")
    add("--json", action="store_true", help="print the figures as JSON")


def run(args: argparse.Namespace) -> int:
    from benchgen_router.bench.streaming import measure_sizes, table_lines
    from benchgen_router.bench.workload import load_workload
    from benchgen_router.hardware import cpu_summary

    prompts, source = load_workload(args.tasks, seed=0)
    rows = measure_sizes(prompts, args.lines, args.model, args.threads, args.workdir)
    if args.json:
        print(json.dumps({"workload": source, "cpu": cpu_summary(), "rows": rows}))
        return 0
    print("\n".join(table_lines(rows, args.model, source, args.threads)))
    return 0
