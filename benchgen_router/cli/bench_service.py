"""benchgen-router bench service: the HTTP routing service under load, against routing in-process, as one table.

    benchgen-router bench service                 # default router, 127.0.0.1, a free port
    benchgen-router bench service --profile       # and where the service's CPU time goes

Rows: in-process run_router (throughput of one call over every query, and one-query latency)
with torch's default threads and with 1, quiet and beside a CPU-burning background process; then,
for each Ray Serve mode (throughput mode, HAProxy in front of the router's deployment, and standard
mode), one after the other on a Ray of its own, the service at 1, 8, 32 and 128 concurrent clients
(one query per request), with batching on and off (max_batch_size 1), with 8 queries per request,
and with batching on beside the CPU burner. "CPU ms/query" is the CPU time of every process involved
(for the service: replicas, proxy, Ray's own processes and the client) per query routed. Each level is
bounded: at most --requests requests and --seconds seconds, after a short warm-up. All traffic goes
to 127.0.0.1.

Targets checked below the table for each mode, against the best quiet in-process figures: at
concurrency >= 32 the service reaches >= 70% of in-process throughput, at CPU per query <= 1.5x
in-process; at concurrency 1 its median latency is within 5 ms of in-process one-query latency; and
no warning repeats 10 times or more in Ray's logs. With --profile: CPU time per query by process,
and py-spy's shares of the replicas' and the proxy's samples.
Load average is printed before and after: on a shared machine other work skews every figure.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from benchgen_router.cli.common import EXIT_CODES_HELP, positive_int
from benchgen_router.serving.engine import STANDARD, THROUGHPUT

HELP = "the HTTP routing service under load, against routing in-process"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    title, _, details = (__doc__ or "").partition("\n\n")
    parser.description, parser.epilog = title, details + "\n" + EXIT_CODES_HELP
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add = parser.add_argument
    add("--requests", type=positive_int, default=1500, help="at most this many requests per load level (default 1500)")
    add("--seconds", type=float, default=12.0, help="at most this long per load level (default 12)")
    add("--queries", type=positive_int, default=256, help="distinct benchmark queries (default 256)")
    add("--samples", type=positive_int, default=50, help="one-query in-process calls timed (default 50)")
    add("--replicas", type=positive_int, default=2, help="service replicas (default 2)")
    add("--threads", type=positive_int, default=1, help="CPUs (= torch threads) per replica (default 1)")
    # serving.replica.DEFAULT_MAX_BATCH_SIZE, named here so that --help imports no torch
    add("--max-batch-size", type=positive_int, default=64, help="dynamic batching's batch size when on (default 64)")
    add("--batch-wait-ms", type=float, default=0.0, help="how long a batch waits for more (default 0)")
    add("--profile", action="store_true", help="add a CPU-time breakdown (and py-spy shares when installed)")
    add("--skip-load", action="store_true", help="leave out the rows beside the CPU burner")
    add(
        "--modes",
        type=modes_list,
        default=(THROUGHPUT, STANDARD),
        help=f"Ray Serve modes to measure, in turn (default: {THROUGHPUT},{STANDARD})",
    )
    add("--output", type=Path, help="also write the report to this markdown file")


def modes_list(text: str) -> tuple[str, ...]:
    modes = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = [mode for mode in modes if mode not in (THROUGHPUT, STANDARD)]
    if unknown or not modes:
        raise argparse.ArgumentTypeError(f"{text!r}: give {THROUGHPUT}, {STANDARD} or both, comma-separated")
    return modes


def run(args: argparse.Namespace) -> int:
    from benchgen_router.bench.service import ServiceBenchOptions, run_service_benchmark
    from benchgen_router.files import atomic_output

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    options = ServiceBenchOptions(
        requests=args.requests,
        seconds=args.seconds,
        queries=args.queries,
        samples=args.samples,
        replicas=args.replicas,
        threads=args.threads,
        max_batch_size=args.max_batch_size,
        batch_wait_ms=args.batch_wait_ms,
        profile=args.profile,
        skip_load=args.skip_load,
        modes=args.modes,
    )
    text = run_service_benchmark(options)
    print(text)
    if args.output:
        with atomic_output(args.output) as handle:
            handle.write(text)
    return 0
