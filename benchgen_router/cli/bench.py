"""benchgen-router bench: routing speed side by side with the reference and this machine's matmul peak.

    benchgen-router bench                          # 28 layers on CPU, default sample: under 10 minutes on 2 cores
    benchgen-router bench --layers 4 --queries 16  # a quick look
    benchgen-router bench --device cuda            # GPU: every prompt, float32 and bfloat16 peaks on the GPU
    benchgen-router bench --output table.md        # also write the table (.json: every number as JSON)
    benchgen-router bench service|load-memory|streaming|value --help   # the other benchmarks, each with its own options

One run builds a synthetic backbone with the exact Qwen3-1.7B geometry (random weights, fixed seed;
saved in bfloat16 like the real checkpoint unless --checkpoint-dtype says otherwise) and a
byte-level BPE tokenizer with Qwen's pre-tokenizer trained on the workload, samples the real
prompts of ../shared/benchgen-pilot/tasks.v1.jsonl (beside the repository) by length quantile,
and then runs each row in its own process (so one row's memory never counts towards another's peak):

  (a) ref-single   the reference's pick_agent: one query at a time, float32 (docs/reference.md, literally)
  (b) ref-batch16  the reference trainer's embedding: batches of 16 in input order, padded to the longest
  (c) default      the package: load_router + run_router (float32, packed batches, inference mode)
  (d) <mode>       each speed mode of speedups.SPEED_MODES (trial modes on request: --modes padded,int8,compile)

Achieved GFLOP/s counts 2 x non-embedding parameters x real (unpadded) tokens per second; the
attention score products (4 x layers x tokens^2 x heads x head_dim per query, under 5% here) are
not counted. The matmul peaks are the best of repeated large float32 and bfloat16 products at the
model's shapes, measured at the start and at the end of the run with the same thread count. Where
the CPU has no bfloat16 matrix units (no AMX or avx512_bf16), bfloat16 is emulated, hundreds of
times slower: its peak is not measured and the bf16 rows are left out unless asked for by name.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

from benchgen_router.bench.routing import (
    BASE_ROWS,
    DEFAULT_CPU_QUERIES,
    OFFERED_MODES,
    TRIAL_MODE_NAMES,
    BenchOptions,
)
from benchgen_router.bench.workload import DEFAULT_TASKS
from benchgen_router.cli.common import EXIT_CODES_HELP
from benchgen_router.errors import InputError

HELP = "benchmark routing speed side by side with the reference (or: service, load-memory, streaming, value)"
# the other benchmarks: name -> module of benchgen_router.cli with HELP, add_arguments(parser) and run(args)
BENCHMARKS = {
    "service": "bench_service",
    "load-memory": "bench_load_memory",
    "streaming": "bench_streaming",
    "value": "bench_value",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    summary, _, details = (__doc__ or "").partition("\n\n")
    parser.description, parser.epilog = summary, details + "\n" + EXIT_CODES_HELP
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_sample_arguments(parser)
    add_row_arguments(parser)
    add = parser.add_argument
    add(
        "--output",
        type=Path,
        action="append",
        default=[],
        help="also write the report to this file: markdown, or JSON if the name ends in .json (repeatable)",
    )
    add("--workdir", type=Path, default=None, help="where to build the backbone (default: the system temp dir)")
    add("--tiny", action="store_true", help="tiny geometry (hidden 64, 2 layers) for smoke tests; not Qwen3-1.7B")
    add_benchmark_subcommands(parser)


def add_benchmark_subcommands(parser: argparse.ArgumentParser) -> None:
    """`bench service`, `bench load-memory`, `bench streaming`, `bench value`; without one, `bench` is the routing
    speed benchmark."""
    parser.usage = f"%(prog)s [options]\n       %(prog)s {{{','.join(BENCHMARKS)}}} [options]"
    benchmarks = parser.add_subparsers(
        dest="benchmark",
        metavar="BENCHMARK",
        title="other benchmarks (their options follow their name)",
        action=BenchmarkName,
    )
    for name, module_name in BENCHMARKS.items():
        module = importlib.import_module(f"benchgen_router.cli.{module_name}")
        subparser = benchmarks.add_parser(name, help=module.HELP, prog=f"{parser.prog} {name}")
        module.add_arguments(subparser)
        # SUPPRESS: when not given here, `bench -v service` keeps the -v given before the name
        subparser.add_argument(
            "--verbose", "-v", action="store_true", default=argparse.SUPPRESS, help="tracebacks and library notices"
        )
        subparser.set_defaults(benchmark_module=module)


class BenchmarkName(argparse._SubParsersAction):
    """A benchmark's name. The routing benchmark's options given before it would be dropped without a word
    (or replaced by the benchmark's own defaults of the same name), so they are a usage error."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Sequence[str],
        option_string: str | None = None,
    ) -> None:
        given = [
            action.option_strings[0]
            for action in parser._actions
            if action.option_strings and action.dest not in ("help", "verbose")
            if getattr(namespace, action.dest, action.default) != action.default
        ]
        if given:
            parser.error(f"{', '.join(given)}: options of `bench` alone; give {values[0]}'s own after its name")
        super().__call__(parser, namespace, values, option_string)


def add_sample_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--layers", type=int, default=None, help="backbone layers (default: 28, the real depth; fewer for quick runs)")
    add(
        "--queries",
        type=int,
        default=None,
        help=f"sample size (default: {DEFAULT_CPU_QUERIES} on CPU, every prompt on CUDA)",
    )
    add("--device", default="cpu", help="cpu or cuda (default: cpu)")
    add("--threads", type=int, default=None, help="torch threads in every row (default: torch's default, the cores)")


def add_row_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add(
        "--modes",
        default=None,
        help="rows after (a), comma-separated: ref-batch16, default, speed modes "
        f"({', '.join(OFFERED_MODES)}) and trial modes ({', '.join(TRIAL_MODE_NAMES)}) (default: %(default)s; bf16 "
        "rows are left out where the CPU only emulates bfloat16, unless named)",
    )
    add(
        "--batch-size",
        type=int,
        default=None,
        help="package rows: run_router's batch_size (default: run_router's own: the token budget alone when "
        "packed, at most 16 queries when padded)",
    )
    add(
        "--max-batch-tokens",
        type=int,
        default=None,
        help="package rows: positions per packed batch (default: run_router's own for the device and dtype)",
    )
    add("--tasks", type=Path, default=DEFAULT_TASKS, help="workload JSONL with a 'prompt' field (default: %(default)s)")
    add("--seed", type=int, default=0, help="seed of the sample, the backbone and the head (default: 0)")
    add(
        "--checkpoint-dtype",
        default="bfloat16",
        choices=["bfloat16", "float32"],
        help="dtype the synthetic backbone is saved in (default: bfloat16, as Qwen/Qwen3-1.7B ships)",
    )
    add("--profile", action="store_true", help="profile one batch of each package row and print its top ops")


def normalise_arguments(args: argparse.Namespace) -> argparse.Namespace:
    """Validate before torch is imported, so bad usage fails at once. Not named check_arguments: the
    main command would call that before run, and the other benchmarks share this parser."""
    args.device = args.device.lower()
    if args.device not in ("cpu", "cuda") and not args.device.startswith("cuda:"):
        raise InputError(f"unknown device '{args.device}'; use cpu or cuda.")
    if args.modes is None:
        from benchgen_router.hardware import bf16_is_fast

        fast = args.device.startswith("cuda") or bf16_is_fast("cpu")
        args.modes = ",".join([*BASE_ROWS, *(OFFERED_MODES if fast else ())])
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    known = {*BASE_ROWS, *OFFERED_MODES, *TRIAL_MODE_NAMES}
    unknown = [m for m in args.modes if m not in known]
    if unknown:
        raise InputError(f"unknown row(s) {', '.join(unknown)}; choose from {', '.join(sorted(known))}.")
    for name in ("layers", "queries", "threads", "batch_size", "max_batch_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise InputError(f"--{name.replace('_', '-')} must be at least 1.")
    return args


def bench_options(args: argparse.Namespace) -> BenchOptions:
    return BenchOptions(
        device=args.device,
        modes=args.modes,
        layers=args.layers,
        queries=args.queries,
        threads=args.threads,
        batch_size=args.batch_size,
        max_batch_tokens=args.max_batch_tokens,
        tasks=args.tasks,
        seed=args.seed,
        checkpoint_dtype=args.checkpoint_dtype,
        profile=args.profile,
        workdir=args.workdir,
        tiny=args.tiny,
    )


def command_line() -> str:
    """The run as `benchgen-router bench ...`, however it was started, for the report to quote."""
    given = sys.argv[2:] if sys.argv[1:2] == ["bench"] else sys.argv[1:]
    return "benchgen-router bench " + " ".join(given)


def run(args: argparse.Namespace) -> int:
    if args.benchmark:
        return args.benchmark_module.run(args)
    args = normalise_arguments(args)
    from benchgen_router.bench.routing import run_benchmark
    from benchgen_router.bench.routing_report import render_markdown, write_report

    report = run_benchmark(bench_options(args), command_line())
    text = render_markdown(report)
    print(text, end="")
    write_report(report, text, args.output)
    return 0
