"""Route queries: pick which agent of the router's pool should answer each one.

    python route.py "What is the derivative of x^3 + 2x?"          # prints the picked agent id
    python route.py --json "What is the derivative of x^3 + 2x?"   # the pick and every agent's scores
    python route.py --input tasks.jsonl --output picks.jsonl         # a file, batched, with a progress bar

Output: each result is {"picked_agent": agent id, "agent_index": its position in the pool,
"probabilities": {agent: softmax of the logits}, "logits": {agent: raw head score}}, agents in the
router's pool order. File work writes one JSON line per routed query, in input order, with "line"
(the query's line number in the input) and, when the input has one, "id" added in front.

Input files: JSON lines (.jsonl/.ndjson; the query is the --text-field of each object, by default
the first of prompt/query/question/text/input that the file has), CSV or TSV with a header row
(.csv/.tsv; the query is the --column, chosen the same way) or plain text, one query per line
(any other name, and stdin via `--input -`); --format overrides the guess from the extension. Bad
lines (empty query, not text, bad JSON, no query field) are reported on stderr with their line
number and skipped; the rest are still routed.

Results go to --output (JSON lines, written to a temporary file and renamed at the end, so an
interrupted run leaves either the complete file or the previous one) or to stdout: the bare agent
ids, one per routed query, or JSON lines with --json. Progress and the closing summary of picks
per agent go to stderr, so stdout pipes cleanly.

Exit codes: 0 every query routed; 1 some lines were skipped (the rest were routed and written);
2 bad usage or unusable input (nothing written); 130 interrupted (nothing written).

From Python (a drop-in for the original release's `router_head.pick_agent`):

    from route import pick_agent
    pick_agent("What is the derivative of x^3 + 2x?")["picked_agent"]   # e.g. "frontier_a"
    pick_agent(["q1", "q2"], model="path/or/hub-id")                      # a list in, a list out
"""

from __future__ import annotations

import argparse
import csv
import functools
import io
import json
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from router_utils import (
    UsageError,
    add_batching_arguments,
    atomic_output,
    check_output_path,
    load_router,
    run_cli,
    run_router,
)

logger = logging.getLogger("benchgen_router.route")

# Field / column names a query is commonly stored under, in the order they are tried when the user
# names none: "prompt" first because BenchGen's own task files (router-pilot-tasks) use it.
TEXT_FIELDS = ("prompt", "query", "question", "text", "input")
# An input row's identifier, copied to the output so picks can be joined back to the input.
ID_FIELDS = ("id", "task_id", "query_id", "uid")
FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".tsv": "tsv"}


# ---------------------------------------------------------------------------------------------
# Python API


def resolve_device(device: str | None) -> str:
    """None / 'auto' -> 'cuda' when a GPU is visible, else 'cpu'; anything else is taken as given."""
    if device not in (None, "auto"):
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@functools.lru_cache(maxsize=4)
def _cached_router(
    model: str | None, device: str, dtype: str | None, backbone: str | None, revision: str | None
) -> tuple[Any, Any]:
    """One load per (router, device, dtype, backbone, revision): loading a 1.7B backbone takes
    seconds to minutes, routing one query milliseconds. Bounded so a long-lived process that
    tries many routers does not keep all of them in memory."""
    return load_router(model, device=device, dtype=dtype, backbone=backbone, revision=revision)


def get_router(
    model: Any = None,
    device: str | None = None,
    dtype: str | None = None,
    backbone: str | None = None,
    revision: str | None = None,
) -> tuple[Any, Any]:
    """(model, tokenizer) for pick_agent's `model=`: a folder or Hub id (loaded once, then reused),
    None for the default router, or something already loaded: a (model, tokenizer) pair or any
    object with .model and .tokenizer (a text-classification pipeline, for instance), used as it
    is (device, dtype, backbone and revision only apply to loading)."""
    if model is None or isinstance(model, str | os.PathLike):
        key = None
        if model is not None:
            key = str(Path(model).resolve()) if os.path.isdir(model) else str(model)
        return _cached_router(key, resolve_device(device), None if dtype == "auto" else dtype, backbone, revision)
    if isinstance(model, tuple) and len(model) == 2:
        return model
    if hasattr(model, "model") and hasattr(model, "tokenizer"):
        return model.model, model.tokenizer
    raise TypeError(
        f"model= takes a router folder or Hub id, None (the default router), a (model, tokenizer) pair "
        f"or an object with .model and .tokenizer; got {type(model).__name__}."
    )


def results_from_logits(logits: np.ndarray, agents: Sequence[str]) -> list[dict[str, Any]]:
    """One result dict per row of logits: the argmax agent (first on ties, as the reference's
    np.argmax), its index, and softmax probabilities and raw logits keyed by agent id."""
    scores = logits.astype(np.float64)
    shifted = np.exp(scores - scores.max(axis=1, keepdims=True))
    probabilities = shifted / shifted.sum(axis=1, keepdims=True)
    results = []
    for row_logits, row_probabilities in zip(scores, probabilities, strict=True):
        index = int(np.argmax(row_logits))
        results.append(
            {
                "picked_agent": agents[index],
                "agent_index": index,
                "probabilities": {agent: float(p) for agent, p in zip(agents, row_probabilities, strict=True)},
                "logits": {agent: float(x) for agent, x in zip(agents, row_logits, strict=True)},
            }
        )
    return results


def pick_agent(
    query_or_list: str | Sequence[str],
    model: Any = None,
    *,
    device: str | None = None,
    dtype: str | None = None,
    batch_size: int | None = None,
    max_batch_tokens: int | None = None,
    progress: bool = False,
    backbone: str | None = None,
    revision: str | None = None,
) -> dict[str, Any] | list[dict[str, Any]]:
    """Pick the agent that should answer a query (a dict) or each query of a list (a list of dicts,
    same order). A list is routed in batches as router_utils.run_router makes them: packed up to
    `max_batch_tokens` positions for a decoder backbone, `batch_size` queries otherwise.

    Each dict: `picked_agent` (agent id, as in the original release), `agent_index`,
    `probabilities` and `logits` ({agent id: value}, pool order). `model`: see get_router; loads
    are cached, so calling this in a loop does not reload the router. `device` defaults to a GPU
    when there is one; `dtype` to the router's own (float32 for converted releases, the reference's
    picks); `dtype="bfloat16"` is the fast path on GPUs and on CPUs with AMX or avx512_bf16.

    Raises ValueError for an empty (or whitespace-only) query, which no router can score, and
    router_utils.UsageError when the router cannot be loaded.
    """
    single = isinstance(query_or_list, str)
    queries = [query_or_list] if single else list(query_or_list)
    for position, query in enumerate(queries):
        name = "the query" if single else f"query {position}"
        if not isinstance(query, str):
            raise TypeError(f"{name} is {type(query).__name__}, not a string.")
        if not query.strip():
            raise ValueError(f"{name} is empty; a router cannot score an empty query.")
    if not queries:
        return []
    router, tokenizer = get_router(model, device=device, dtype=dtype, backbone=backbone, revision=revision)
    logits, _ = run_router(
        router, tokenizer, queries, batch_size=batch_size, max_batch_tokens=max_batch_tokens, progress=progress
    )
    results = results_from_logits(logits, router.config.agent_order)
    return results[0] if single else results


# ---------------------------------------------------------------------------------------------
# Reading query files: every line either becomes a Query or a Skipped line with its reason.


@dataclass
class Query:
    line: int
    text: str
    id: Any = None


@dataclass
class Skipped:
    line: int
    reason: str


def text_problem(value: Any, name: str) -> str | None:
    """Why `value` cannot be routed as a query, or None when it can."""
    if not isinstance(value, str):
        return f"{name} is not text (got {type(value).__name__})"
    if not value.strip():
        return f"{name} is empty"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # undecodable input bytes (surrogateescape) or a lone \ud800 escape
        return f"{name} is not valid UTF-8 text"
    return None


def choose_text_field(names: Sequence[str], chosen: str | None, source: str) -> str:
    """The field/column holding the query: the user's, or the first usual name the input has.
    Either must exist somewhere in the input: a misspelt name is a usage error, not N bad lines."""
    if chosen is None:
        chosen = next((name for name in TEXT_FIELDS if name in names), None)
        if chosen is None:
            raise UsageError(
                f"{source} has none of the usual query fields ({', '.join(TEXT_FIELDS)}); it has "
                f"{', '.join(map(repr, names)) or 'none'}. Pass --text-field NAME."
            )
    elif chosen not in names:
        raise UsageError(f"{source} has no field '{chosen}'; it has {', '.join(map(repr, names)) or 'none'}.")
    return chosen


def choose_id_field(names: Sequence[str], chosen: str | None, source: str) -> str | None:
    """The field/column copied to the output as "id": the user's, or the first usual one, if any."""
    if chosen is None:
        return next((name for name in ID_FIELDS if name in names), None)
    if chosen not in names:
        raise UsageError(f"{source} has no field '{chosen}' for --id-field; it has {', '.join(map(repr, names))}.")
    return chosen


def read_text_lines(data: str) -> Iterator[Query | Skipped]:
    """Plain text: every line is one query, used as written (only the line break is dropped)."""
    for number, line in enumerate(data.splitlines(), start=1):
        problem = text_problem(line, "line")
        yield Skipped(number, problem) if problem else Query(number, line)


def read_jsonl_lines(data: str, text_field: str | None, id_field: str | None, source: str) -> Iterator[Query | Skipped]:
    """JSON lines: one object per line; the query is its text field, the id (if any) is kept."""
    rows: list[tuple[int, Any]] = []
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            rows.append((number, "empty line"))
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            rows.append((number, f"not valid JSON ({err.msg})"))
            continue
        rows.append((number, row if isinstance(row, dict) else "not a JSON object"))
    objects = [row for _, row in rows if isinstance(row, dict)]
    seen = list(dict.fromkeys(key for row in objects for key in row))
    if objects:
        text_field = choose_text_field(seen, text_field, source)
        id_field = choose_id_field(seen, id_field, source)
    for number, row in rows:
        if not isinstance(row, dict):
            yield Skipped(number, row)
        elif text_field not in row:
            yield Skipped(number, f"no '{text_field}' field")
        else:
            problem = text_problem(row[text_field], f"'{text_field}'")
            yield Skipped(number, problem) if problem else Query(number, row[text_field], row.get(id_field))


def read_csv_lines(
    data: str, delimiter: str, column: str | None, id_column: str | None, source: str
) -> Iterator[Query | Skipped]:
    """CSV/TSV with a header row; a quoted field may span lines, so a row is numbered by the line
    it starts on (line 1 is the header)."""
    reader = csv.reader(io.StringIO(data, newline=""), delimiter=delimiter)
    header = next(reader, None)
    if header is None:
        return
    column = choose_text_field(header, column, source)
    id_column = choose_id_field(header, id_column, source)
    text_at = header.index(column)
    id_at = header.index(id_column) if id_column is not None else None
    while True:
        start = reader.line_num + 1
        row = next(reader, None)
        if row is None:
            return
        if not row or not any(cell.strip() for cell in row):
            yield Skipped(start, "empty line")
        elif text_at >= len(row):
            yield Skipped(start, f"row has {len(row)} fields, no '{column}' column")
        else:
            problem = text_problem(row[text_at], f"'{column}'")
            identifier = row[id_at] if id_at is not None and id_at < len(row) else None
            yield Skipped(start, problem) if problem else Query(start, row[text_at], identifier)


def input_format(path: str, chosen: str | None) -> str:
    """The --format, or the one the file name says; stdin and unknown extensions are plain text."""
    if chosen:
        return chosen
    suffix = Path(path).suffix.lower()
    if suffix == ".json":
        raise UsageError(
            f"{path}: a .json file is one JSON document, not one query per line; convert it to "
            "JSON lines (.jsonl), or pass --format jsonl if it already is."
        )
    return FORMATS.get(suffix, "text")


def read_queries(path: str, fmt: str | None, text_field: str | None, id_field: str | None) -> list[Query | Skipped]:
    """Every line of the input file (or stdin for '-') as a Query or a Skipped line.

    Bytes that are not UTF-8 are kept as surrogates (surrogateescape) so that only the lines
    holding them are skipped, not the whole file.
    """
    fmt = input_format(path, fmt)
    source = "stdin" if path == "-" else path
    try:
        raw = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except FileNotFoundError:
        raise UsageError(f"input file not found: {path}") from None
    except (IsADirectoryError, PermissionError) as err:
        raise UsageError(f"cannot read {path} ({err.strerror}); pass a query file.") from None
    data = raw.decode("utf-8", errors="surrogateescape").removeprefix("\ufeff")  # BOM from spreadsheet exports
    if fmt == "jsonl":
        return list(read_jsonl_lines(data, text_field, id_field, source))
    if fmt in ("csv", "tsv"):
        # csv refuses fields over 128 KiB by default; a long query is fine (the router truncates it).
        previous_limit = csv.field_size_limit(2**31 - 1)
        try:
            return list(read_csv_lines(data, "\t" if fmt == "tsv" else ",", text_field, id_field, source))
        finally:
            csv.field_size_limit(previous_limit)
    return list(read_text_lines(data))


# ---------------------------------------------------------------------------------------------
# Command line


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    title, _, details = (__doc__ or "").partition("\n\n")
    parser = argparse.ArgumentParser(
        description=title, epilog=details.split("From Python")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("queries", nargs="*", metavar="QUERY", help="question(s) to route (or use --input)")
    add("--model", metavar="DIR_OR_HUB_ID", help="router folder or Hub id (default: the bundled default router)")
    add("--backbone", metavar="DIR_OR_HUB_ID", help="load the backbone from here (e.g. a local copy of it)")
    add("--revision", metavar="REV", help="router repository revision (branch, tag or commit) on the Hub")
    add("--input", "-i", metavar="FILE", help="route every query of FILE ('-' for stdin)")
    add("--output", "-o", metavar="FILE", help="write JSON lines here instead of stdout")
    add(
        "--format",
        choices=["jsonl", "csv", "tsv", "text"],
        help="input format (default: from the extension; plain text otherwise)",
    )
    add(
        "--text-field",
        "--column",
        dest="text_field",
        metavar="NAME",
        help=f"JSONL field / CSV column holding the query (default: first of {', '.join(TEXT_FIELDS)})",
    )
    add(
        "--id-field",
        metavar="NAME",
        help=f"field / column copied to the output as 'id' (default: first of {', '.join(ID_FIELDS)})",
    )
    add_batching_arguments(parser)
    add("--device", default="auto", help="cpu, cuda, cuda:1, mps, ... (default: cuda if available, else cpu)")
    add(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="backbone dtype (default: the router's own, float32 for converted releases: the reference's "
        "picks); bfloat16 is the fast path on GPUs and on CPUs with AMX or avx512_bf16",
    )
    add("--json", action="store_true", help="print JSON lines with the scores, not bare agent ids")
    add("--quiet", "-q", action="store_true", help="no progress bar and no summary")
    args = parser.parse_args(argv)
    if args.queries and args.input:
        parser.error("give queries on the command line or --input FILE, not both")
    if not args.queries and not args.input:
        parser.error("give a query to route, or --input FILE")
    return args


def log_summary(picks: Sequence[str], agents: Sequence[str], skipped: int, seconds: float) -> None:
    """Picks per agent (every agent, zeros included, so a never-picked agent shows), speed, skips."""
    rate = f" ({len(picks) / seconds:.1f} q/s)" if seconds > 0 and picks else ""
    skips = f"; skipped {skipped} bad line{'s' * (skipped != 1)}" if skipped else ""
    logger.info("routed %d quer%s in %.1f s%s%s", len(picks), "y" if len(picks) == 1 else "ies", seconds, rate, skips)
    counts = Counter(picks)
    width = max(map(len, agents))
    for agent in agents:
        share = 100 * counts[agent] / len(picks) if picks else 0.0
        logger.info("  %-*s %6d  %5.1f%%", width, agent, counts[agent], share)


def write_results(handle: TextIO, records: Sequence[dict[str, Any]], as_json: bool) -> None:
    """JSON lines, or bare agent ids. JSON stays ASCII (non-ASCII escaped), so an id holding
    undecodable input bytes is still written rather than failing the whole file."""
    for record in records:
        handle.write((json.dumps(record) if as_json else record["picked_agent"]) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    file_work = args.input is not None
    source = "stdin" if args.input == "-" else args.input
    if file_work:
        lines = read_queries(args.input, args.format, args.text_field, args.id_field)
        if not lines:
            raise UsageError(f"{source} holds no lines; nothing to route.")
    else:
        lines = []
        for position, query in enumerate(args.queries, start=1):
            problem = text_problem(query, f"query {position}")
            if problem:
                raise UsageError(f"{problem}; a router cannot score it.")
            lines.append(Query(position, query))
    if args.output:
        check_output_path(args.output)
    queries = [item for item in lines if isinstance(item, Query)]
    skipped = [item for item in lines if isinstance(item, Skipped)]
    for item in skipped:
        logger.warning("%s line %d: %s; skipped", source, item.line, item.reason)

    router, tokenizer = get_router(
        args.model, device=args.device, dtype=args.dtype, backbone=args.backbone, revision=args.revision
    )
    agents = router.config.agent_order
    started = time.perf_counter()
    logits = np.zeros((0, len(agents)), dtype=np.float32)
    if queries:
        logits, _ = run_router(
            router,
            tokenizer,
            [q.text for q in queries],
            batch_size=args.batch_size,
            max_batch_tokens=args.max_batch_tokens,
            progress=file_work and not args.quiet,
        )
    seconds = time.perf_counter() - started

    records = results_from_logits(logits, agents)
    if file_work:
        records = [
            {"line": q.line, **({"id": q.id} if q.id is not None else {}), **result}
            for q, result in zip(queries, records, strict=True)
        ]
    if args.output:
        with atomic_output(args.output) as handle:
            write_results(handle, records, as_json=True)
    else:
        write_results(sys.stdout, records, as_json=args.json)
        sys.stdout.flush()
    if file_work and not args.quiet:
        log_summary([r["picked_agent"] for r in records], agents, len(skipped), seconds)
    return 1 if skipped else 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
