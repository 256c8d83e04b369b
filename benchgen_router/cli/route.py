"""benchgen-router route: pick which agent of the router's pool should answer each query.

    benchgen-router route "What is the derivative of x^3 + 2x?"          # prints the picked agent id
    benchgen-router route --json "What is the derivative of x^3 + 2x?"   # the pick and every agent's scores
    benchgen-router route --input tasks.jsonl --output picks.jsonl         # a file, streamed, with a progress bar

Each result is {"picked_agent": agent id, "agent_index": its position in the pool, "probabilities":
{agent: softmax of the logits}, "logits": {agent: raw head score}}, agents in the router's pool
order. File work writes one JSON line per routed query, in input order, with "line" (the query's
line number in the input) and, when the input has one, "id" added in front.

Input files: JSON lines (.jsonl/.ndjson; the query is the --text-field of each object, by default
the first of prompt/query/question/text/input that the first object has), CSV or TSV with a header
row (.csv/.tsv; the query is the --column, chosen the same way) or plain text, one query per line
(any other name, and stdin via `--input -`); --format overrides the guess from the extension. Lines
are split on \\n only. Bad lines (empty query, one that tokenizes to nothing, not text, bad JSON,
no query field) are reported on stderr with their line number and skipped; the rest are routed.

The input is streamed: read in chunks, routed in batches and written in order as each chunk
finishes, in bounded memory whatever its size. --output is written to a temporary file next to it
and renamed at the end, so an interrupted run leaves the complete file or the previous one (a
device or pipe such as /dev/stdout is written as a stream); it must not be the input. Without
--output, results go to stdout as they come: the bare agent ids, or JSON lines with --json.
Progress and the closing summary of picks per agent go to stderr. --engine ray routes the file on
Ray Data instead (see the serving docs).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TextIO

from benchgen_router.cli.common import (
    EXIT_CODES_HELP,
    EXIT_OK,
    EXIT_SKIPPED,
    add_batching_arguments,
    add_dtype_arguments,
    positive_int,
)

logger = logging.getLogger("benchgen_router")

HELP = "route queries or a file of queries to the pool's agents"
# Chunks start small so the first results appear at once (`| head -1`), then grow to keep batches full.
FIRST_CHUNK, LAST_CHUNK = 16, 1024


def add_arguments(parser: argparse.ArgumentParser) -> None:
    title, _, details = (__doc__ or "").partition("\n\n")
    parser.description, parser.epilog = title, details + "\n" + EXIT_CODES_HELP
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add = parser.add_argument
    add("queries", nargs="*", metavar="QUERY", help="question(s) to route (or use --input)")
    add("--model", metavar="DIR_OR_HUB_ID", help="router folder or Hub id (default: the committed default router)")
    add("--backbone", metavar="DIR_OR_HUB_ID", help="load the backbone from here (e.g. a local copy of it)")
    add("--revision", metavar="REV", help="router repository revision (branch, tag or commit) on the Hub")
    add("--input", "-i", metavar="FILE", help="route every query of FILE ('-' for stdin)")
    add("--output", "-o", metavar="FILE", help="write JSON lines here instead of stdout")
    add(
        "--format",
        choices=["jsonl", "csv", "tsv", "text", "parquet"],
        help="input format (default: from the extension)",
    )
    add(
        "--text-field", "--column", dest="text_field", metavar="NAME", help="JSONL field / CSV column holding the query"
    )
    add("--id-field", metavar="NAME", help="field / column copied to the output as 'id' (default: id, task_id, ...)")
    add("--engine", choices=["local", "ray"], default="local", help="local (default) or Ray Data for files")
    add("--actors", type=positive_int, default=2, metavar="N", help="--engine ray: router actors (default: 2)")
    add_batching_arguments(parser)
    add("--device", default="auto", help="cpu, cuda, cuda:1, mps, ... (default: cuda if available, else cpu)")
    add_dtype_arguments(parser)
    add(
        "--threads",
        type=positive_int,
        metavar="N",
        help="torch intra-op threads (default: the CPUs this process may use)",
    )
    add(
        "--operating-point",
        metavar="NAME",
        help="for a router trained at several quality/cost/latency trade-offs: the head to route with "
        "(names on its card; default: the router's own default)",
    )
    add(
        "--tradeoff",
        metavar="RULE",
        help="for a probability head: the rule that picks, tolerance=T, lambda=L, budget=X[@AGENT] or "
        "usd-per-1k=Y (docs/tradeoff.md; default: the most likely agent)",
    )
    add(
        "--calibrate-on",
        metavar="FILE",
        help="for a probability head: recalibrate the budget rules on this sample of your traffic (one query a "
        "line) before routing",
    )
    add("--save-calibrated", metavar="DIR", help="with --calibrate-on: also save the recalibrated router here")
    add("--json", action="store_true", help="print JSON lines with the scores, not bare agent ids")
    add("--quiet", "-q", action="store_true", help="no progress bar and no summary")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.queries and args.input:
        parser.error("give queries on the command line or --input FILE, not both")
    if not args.queries and not args.input:
        parser.error("give a query to route, or --input FILE")
    if args.engine == "ray" and not (args.input and args.output):
        parser.error("--engine ray routes files: give --input and --output")
    if args.engine == "ray" and args.calibrate_on:
        parser.error("--calibrate-on routes with --engine local (save the calibrated router, then route it with Ray)")
    if args.save_calibrated and not args.calibrate_on:
        parser.error("--save-calibrated needs --calibrate-on FILE")


def log_summary(counts: Counter, routed: int, agents: Sequence[str], skipped: int, seconds: float) -> None:
    """Picks per agent (every agent, zeros included, so a never-picked agent shows), speed, skips."""
    rate = f" ({routed / seconds:.1f} q/s)" if seconds > 0 and routed else ""
    skips = f"; skipped {skipped} bad line{'s' * (skipped != 1)}" if skipped else ""
    logger.info("routed %d quer%s in %.1f s%s%s", routed, "y" if routed == 1 else "ies", seconds, rate, skips)
    width = max(map(len, agents))
    for agent in agents:
        share = 100 * counts[agent] / routed if routed else 0.0
        logger.info("  %-*s %6d  %5.1f%%", width, agent, counts[agent], share)


def chunks(items: Iterable[Any]) -> Iterator[list[Any]]:
    """Consecutive lists of items, FIRST_CHUNK long at first and doubling up to LAST_CHUNK."""
    size, chunk = FIRST_CHUNK, []
    for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk, size = [], min(2 * size, LAST_CHUNK)
    if chunk:
        yield chunk


def route_chunk(router: Any, tokenizer: Any, queries: list[Any], args: argparse.Namespace) -> tuple[list, list]:
    """(records for the routable queries, Skipped for those that tokenize to nothing), input order."""
    from benchgen_router.files import Skipped
    from benchgen_router.routing import EMPTY_QUERY, query_record, route_results

    texts = [query.text for query in queries]
    results = route_results(
        router,
        tokenizer,
        texts,
        args.batch_size,
        args.max_batch_tokens,
        operating_points=args.operating_point,
        tradeoffs=args.tradeoff,
    )
    records, skipped = [], []
    for query, result in zip(queries, results, strict=True):
        if result is None:
            skipped.append(Skipped(query.line, f"query {EMPTY_QUERY}"))
        else:
            records.append(query_record(query.line, query.id, result))
    return records, skipped


def write_records(handle: TextIO, records: Sequence[dict[str, Any]], as_json: bool) -> None:
    """JSON lines (ASCII, so an id holding undecodable input bytes is still written), or bare agent ids."""
    from benchgen_router.files import to_json

    handle.write("".join((to_json(r) if as_json else r["picked_agent"]) + "\n" for r in records))
    handle.flush()


def route_command_line(args: argparse.Namespace) -> int:
    """Queries given as arguments: each must be routable (else one line, exit 2), printed in order."""
    from benchgen_router.errors import InputError
    from benchgen_router.files import Query, text_problem
    from benchgen_router.routing import EMPTY_QUERY, route_results

    queries = []
    for position, query in enumerate(args.queries, start=1):
        if problem := text_problem(query, f"query {position}"):
            raise InputError(f"{problem}; a router cannot score it.")
        queries.append(Query(position, query))
    router, tokenizer = load(args)
    results = route_results(
        router,
        tokenizer,
        [query.text for query in queries],
        args.batch_size,
        args.max_batch_tokens,
        operating_points=args.operating_point,
        tradeoffs=args.tradeoff,
    )
    empty = [str(query.line) for query, result in zip(queries, results, strict=True) if result is None]
    if empty:
        raise InputError(f"query {', '.join(empty)} {EMPTY_QUERY}; a router cannot score it.")
    write_records(sys.stdout, results, as_json=args.json)
    return EXIT_OK


def load(args: argparse.Namespace) -> tuple[Any, Any]:
    from benchgen_router.hardware import resolve_device, set_threads
    from benchgen_router.loading import load_router
    from benchgen_router.routing import operating_point_of, recalibrate, tradeoff_of

    set_threads(args.threads)
    router, tokenizer = load_router(
        args.model,
        device=resolve_device(args.device),
        dtype=args.dtype,
        backbone=args.backbone,
        revision=args.revision,
        allow_emulated_bf16=args.allow_emulated_bf16,
    )
    operating_point_of(router, args.operating_point)  # a wrong name is reported before any input is read
    if args.calibrate_on:
        recalibrate(router, tokenizer, read_sample(args.calibrate_on), args.batch_size, progress=not args.quiet)
        if args.save_calibrated:
            from benchgen_router.release.folder import save_recalibrated

            save_recalibrated(router, tokenizer, args.model, args.save_calibrated)
    tradeoff_of(router, args.tradeoff)
    return router, tokenizer


def read_sample(path: str) -> list[str]:
    """The queries of a calibration sample: one a line (blank lines skipped)."""
    from benchgen_router.errors import InputError

    try:
        with open(path, encoding="utf-8") as handle:
            return [line.rstrip("\n") for line in handle if line.strip()]
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"cannot read the calibration sample {path}: {err}") from None


def route_file(args: argparse.Namespace) -> int:
    """A whole file, streamed: chunks read, routed and written in order."""
    from tqdm.auto import tqdm

    from benchgen_router.errors import InputError
    from benchgen_router.files import Output, Query, Skipped, input_format, open_input, read_queries

    fmt = input_format(args.input, args.format)
    source = "stdin" if args.input == "-" else args.input
    output = Output(args.output, inputs=[args.input]) if args.output else None
    stream = open_input(args.input)
    try:
        router, tokenizer = load(args)
        agents = router.config.agent_order
        counts: Counter = Counter()
        lines = skipped = 0
        started = time.perf_counter()
        handle = output.handle if output else sys.stdout
        with tqdm(desc="routing", unit="q", disable=args.quiet, file=sys.stderr) as bar:
            for chunk in chunks(read_queries(stream, fmt, args.text_field, args.id_field, source)):
                lines += len(chunk)
                bad = [item for item in chunk if isinstance(item, Skipped)]
                records, empty = route_chunk(
                    router, tokenizer, [item for item in chunk if isinstance(item, Query)], args
                )
                for item in sorted(bad + empty, key=lambda s: s.line):
                    logger.warning("%s line %d: %s; skipped", source, item.line, item.reason)
                skipped += len(bad) + len(empty)
                write_records(handle, records, as_json=bool(output) or args.json)
                counts.update(record["picked_agent"] for record in records)
                bar.update(len(records))
        if lines == 0:
            raise InputError(f"{source} holds no lines; nothing to route.")
        routed = sum(counts.values())
        if output is not None:
            if routed:
                output.commit()
            else:  # every line was skipped: the previous output, if any, stays as it was
                output.discard()
        if not args.quiet:
            log_summary(counts, routed, agents, skipped, time.perf_counter() - started)
        return EXIT_SKIPPED if skipped else EXIT_OK
    finally:
        if output is not None:
            output.discard()
        if stream is not sys.stdin.buffer:
            stream.close()


def route_file_on_ray(args: argparse.Namespace) -> int:
    """--engine ray: the same records, routed by an actor pool of Ray Data (see serving.route_file_with_ray)."""
    from benchgen_router.errors import InputError

    try:
        from benchgen_router.serving import route_file_with_ray
    except ImportError as err:
        raise InputError(
            f"--engine ray needs Ray Data ({err.name} is missing): pip install 'benchgen-router[serving]'."
        ) from None
    result = route_file_with_ray(
        args.input,
        args.output,
        args.model,
        args.text_field,
        args.id_field,
        args.format,
        actors=args.actors,
        threads=args.threads or 1,
        batch_size=args.batch_size or 64,
        revision=args.revision,
        backbone=args.backbone,
        progress=not args.quiet,
        operating_point=args.operating_point,
        tradeoff=args.tradeoff,
    )
    return EXIT_SKIPPED if result.skipped else EXIT_OK


def run(args: argparse.Namespace) -> int:
    if args.engine == "ray":
        return route_file_on_ray(args)
    return route_file(args) if args.input else route_command_line(args)
