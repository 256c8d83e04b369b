"""Peak memory of loading a router, against the size of its backbone's weights.

    python -m benchgen_router.bench.load_memory                 # Qwen3-1.7B geometry, 28 layers
    python -m benchgen_router.bench.load_memory --layers 2 --vocab 32000
    python -m benchgen_router.bench.load_memory --checkpoint-dtype float32

Prints one markdown table (--json: the figures); docs/benchmark.md says how to read the ratio.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from benchgen_router.bench.load_memory import MODES, measure_modes, table_lines
from benchgen_router.cli.common import configure_output


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=28, help="decoder layers (Qwen3-1.7B has 28)")
    parser.add_argument("--vocab", type=int, default=151_936, help="vocabulary size (Qwen3-1.7B: 151,936)")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument(
        "--checkpoint-dtype",
        default="bfloat16",
        choices=["bfloat16", "float32"],
        help="dtype the backbone is saved in; the router loads it in float32 "
        "(default: %(default)s, as Qwen3-1.7B ships)",
    )
    parser.add_argument("--workdir", type=Path, help="where to build the synthetic checkpoints (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m benchgen_router.bench.load_memory`: the table, or with --json the figures."""
    configure_output(verbose=False)
    args = parse_args(argv)
    results = measure_modes(args.layers, args.vocab, args.checkpoint_dtype, args.modes, args.workdir)
    if args.json:
        print(json.dumps(results))
        return 0
    print("\n".join(table_lines(results, args.layers, args.vocab, args.checkpoint_dtype)))
    return 0
