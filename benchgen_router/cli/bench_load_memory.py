"""benchgen-router bench load-memory: peak memory of loading a router, against the size of its backbone's weights.

    benchgen-router bench load-memory                        # Qwen3-1.7B geometry, 28 layers
    benchgen-router bench load-memory --layers 2 --vocab 32000
    benchgen-router bench load-memory --checkpoint-dtype float32

Prints one markdown table (--json: the figures); docs/benchmark.md says how to read the ratio.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchgen_router.cli.common import EXIT_CODES_HELP, positive_int

HELP = "peak memory of loading a router, against its backbone's weights"
MODES = ("head-only", "bundled")  # benchgen_router.bench.load_memory.MODES, named here so --help imports no torch


def add_arguments(parser: argparse.ArgumentParser) -> None:
    title, _, details = (__doc__ or "").partition("\n\n")
    parser.description, parser.epilog = title, details + "\n" + EXIT_CODES_HELP
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add = parser.add_argument
    add("--layers", type=positive_int, default=28, help="decoder layers (Qwen3-1.7B has 28)")
    add("--vocab", type=positive_int, default=151_936, help="vocabulary size (Qwen3-1.7B: 151,936)")
    add("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    add(
        "--checkpoint-dtype",
        default="bfloat16",
        choices=["bfloat16", "float32"],
        help="dtype the backbone is saved in; the router loads it in float32 "
        "(default: %(default)s, as Qwen3-1.7B ships)",
    )
    add("--workdir", type=Path, help="where to build the synthetic checkpoints (default: a temp dir)")
    add("--json", action="store_true", help="print the figures as JSON")


def run(args: argparse.Namespace) -> int:
    from benchgen_router.bench.load_memory import measure_modes, table_lines

    results = measure_modes(args.layers, args.vocab, args.checkpoint_dtype, args.modes, args.workdir)
    if args.json:
        print(json.dumps(results))
        return 0
    print("\n".join(table_lines(results, args.layers, args.vocab, args.checkpoint_dtype)))
    return 0
