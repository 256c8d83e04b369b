"""Bulk routing of files with Ray Data: what `benchgen-router route --input FILE --output OUT`
writes, with the router run by a pool of Ray actors that each load it once (route_file_with_ray).
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import os
import signal
import threading
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray

from benchgen_router.errors import InputError, first_line, raise_terminated
from benchgen_router.files import (
    Query,
    atomic_output,
    choose_id_field,
    choose_text_field,
    input_format,
    open_input,
    read_queries,
    text_problem,
)
from benchgen_router.routing import EMPTY_QUERY, Router, query_record
from benchgen_router.serving.replica import set_torch_threads
from benchgen_router.serving.service import start_ray
from benchgen_router.serving.service_settings import check_cpus, check_positive, check_router_point

logger = logging.getLogger("benchgen_router.serving")


@dataclass
class BulkResult:
    """What route_file_with_ray did: queries routed, lines skipped (line, reason), picks per agent."""

    routed: int
    skipped: list[tuple[int, str]]
    picks: Counter
    seconds: float


class BulkRouter:
    """A Ray Data actor: loads the router once, then routes batches of rows at one operating point (or,
    for a probability head, under one trade-off rule).

    In: "text" (and "line", "id" passed through). Out: "result" (the result dict as JSON, empty
    when skipped) and "problem" (why the row was skipped, empty when routed)."""

    def __init__(
        self,
        model: str | None,
        revision: str | None,
        backbone: str | None,
        threads: int,
        text_name: str,
        operating_point: str | None = None,
        tradeoff: str | None = None,
    ) -> None:
        set_torch_threads(threads)
        self.router = Router.load(model, revision=revision, backbone=backbone)
        self.text_name = text_name
        self.operating_point = self.router.check_point(operating_point)  # checked once, here
        self.tradeoff = self.router.check_tradeoff(tradeoff)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        texts = list(batch.pop("text"))
        problems = [text_problem(text, self.text_name) for text in texts]
        readable = [i for i, problem in enumerate(problems) if problem is None]
        results = [""] * len(texts)
        outcomes = self.router.route([texts[i] for i in readable], self.operating_point, self.tradeoff, checked=True)
        for i, outcome in zip(readable, outcomes, strict=True):
            if outcome is None:
                problems[i] = f"{self.text_name} {EMPTY_QUERY}"
            else:
                results[i] = json.dumps(outcome)
        batch["result"] = np.array(results, dtype=object)
        batch["problem"] = np.array([problem or "" for problem in problems], dtype=object)
        return batch


def bulk_format(path: str, fmt: str | None) -> str:
    if fmt:
        return fmt
    return "parquet" if Path(path).suffix.lower() == ".parquet" or Path(path).is_dir() else ""


def json_value(value: Any) -> Any:
    """An id as read from Arrow/numpy, as a plain JSON-able value."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


@contextlib.contextmanager
def ray_for_bulk(address: str | None, num_cpus: int, progress: bool) -> Iterator[Any]:
    """Ray Data's context for one run (rows kept in order, progress shown or not) on this process's
    Ray, a cluster's, or a local Ray started and stopped here."""
    connected = start_ray(address, num_cpus)
    previous_handler = None
    if threading.current_thread() is threading.main_thread():
        # After ray.init, whose own handler aborts the process (SIGABRT and a stack dump): SIGTERM
        # unwinds as Ctrl-C does, removing the temporary output and stopping Ray.
        previous_handler = signal.signal(signal.SIGTERM, raise_terminated)
    from ray import data  # Ray Data needs pandas: imported only for bulk routing

    context = data.DataContext.get_current()
    previous_order = context.execution_options.preserve_order
    previous = {name: getattr(context, name) for name in ("enable_progress_bars", "print_on_execution_start")}
    context.execution_options.preserve_order = True
    for name in previous:
        setattr(context, name, progress)
    try:
        yield data
    finally:
        context.execution_options.preserve_order = previous_order
        for name, value in previous.items():
            setattr(context, name, value)
        if connected:
            ray.shutdown()
        if previous_handler is not None:
            signal.signal(signal.SIGTERM, previous_handler)


def route_file_with_ray(
    input: str | os.PathLike,
    output: str | os.PathLike,
    model: str | None = None,
    text_field: str | None = None,
    id_field: str | None = None,
    fmt: str | None = None,
    *,
    actors: int = 1,
    threads: int = 1,
    batch_size: int = 64,
    address: str | None = None,
    revision: str | None = None,
    backbone: str | None = None,
    progress: bool = False,
    operating_point: str | None = None,
    tradeoff: str | None = None,
) -> BulkResult:
    """Write what `benchgen-router route --input FILE --output OUT` writes, the router run by Ray actors
    that each load it once (inputs, order and skipped lines: docs/service.md); `tradeoff`: a probability
    head's rule for every row (docs/tradeoff.md)."""
    for name, value in (("actors", actors), ("threads", threads), ("batch_size", batch_size)):
        check_positive(name, value)
    if not address and not ray.is_initialized():
        check_cpus("actors", actors * threads)
    check_router_point(model, revision, operating_point)
    check_router_tradeoff(model, revision, tradeoff)
    source = str(input)
    started = time.perf_counter()
    parquet = bulk_format(source, fmt) == "parquet"
    router = {
        "model": model,
        "revision": revision,
        "backbone": backbone,
        "operating_point": operating_point,
        "tradeoff": tradeoff,
    }
    settings = ActorSettings(actors, threads, batch_size)
    picks: Counter = Counter()
    with atomic_output(output, inputs=[input]) as handle:  # refuses a bad output path before any work
        if parquet and not Path(source).exists():
            raise InputError(f"input file not found: {source}")
        lines = ReadLines([], {}, []) if parquet else read_lines(source, fmt, text_field, id_field)
        if parquet or lines.rows:
            with ray_for_bulk(address, max(os.cpu_count() or 1, actors * threads), progress) as data:
                check_ray_cpus(threads)
                if parquet:
                    dataset, text_name, id_name = parquet_dataset(data, source, text_field, id_field)
                else:
                    dataset, text_name, id_name = rows_dataset(data, lines.rows, settings), "the query", None
                routed = routed_rows(route_dataset(data, dataset, router, text_name, settings, grows=parquet), id_name)
                picks = write_records(handle, routed, None if parquet else lines.ids, lines.skipped)
    skipped = sorted(lines.skipped)
    for line, reason in skipped:
        logger.warning("%s line %d: %s; skipped", source, line, reason)
    return BulkResult(routed=sum(picks.values()), skipped=skipped, picks=picks, seconds=time.perf_counter() - started)


def check_router_tradeoff(model: str | None, revision: str | None, tradeoff: str | None) -> None:
    """A trade-off rule checked against config.json before Ray starts, as check_router_point checks a
    point; a config.json only the cluster's nodes can read is left to the actors, which check again."""
    if tradeoff is None:
        return
    from benchgen_router.loading import declared_config
    from benchgen_router.model_code import RouterConfig, default_router_dir

    try:
        declared = declared_config(str(default_router_dir() if model is None else model), revision)
    except InputError:
        return
    try:
        RouterConfig.from_dict(copy.deepcopy(declared)).check_tradeoff(tradeoff)  # from_dict may consume it
    except ValueError as err:
        raise InputError(first_line(err)) from None


@dataclass(frozen=True)
class ActorSettings:
    count: int
    threads: int  # CPUs, and torch threads, per actor
    batch_size: int  # rows per call


@dataclass
class ReadLines:
    """A text input read on the driver, as the local engine reads it."""

    rows: list[dict[str, Any]]  # {"line", "text"} per query
    ids: dict[int, Any]  # by line; kept here: ids of mixed types do not fit one Arrow column
    skipped: list[tuple[int, str]]  # (line, reason)


def read_lines(source: str, fmt: str | None, text_field: str | None, id_field: str | None) -> ReadLines:
    with open_input(source) as stream:
        items = list(read_queries(stream, input_format(source, fmt), text_field, id_field, source))
    if not items:
        raise InputError(f"{source} holds no lines; nothing to route.")
    read = ReadLines([], {}, [])
    for item in items:
        if isinstance(item, Query):
            read.rows.append({"line": item.line, "text": item.text})
            if item.id is not None:
                read.ids[item.line] = item.id
        else:
            read.skipped.append((item.line, item.reason))
    return read


def check_ray_cpus(threads: int) -> None:
    available = ray.cluster_resources().get("CPU", 0)
    if available < threads:
        raise InputError(f"this Ray has {available:g} CPUs and each actor asks for {threads}; lower threads.")


def rows_dataset(data: Any, rows: list[dict[str, Any]], actors: ActorSettings) -> Any:
    # A few blocks per actor, so that every actor has work and results stream back.
    blocks = max(1, min(math.ceil(len(rows) / actors.batch_size), 4 * actors.count))
    return data.from_items(rows, override_num_blocks=blocks)


def route_dataset(
    data: Any, dataset: Any, router: dict[str, Any], text_name: str, actors: ActorSettings, grows: bool
) -> Any:
    """The dataset mapped through BulkRouter actors (lazily: rows are routed as they are read back)."""
    with warnings.catch_warnings():
        # max_restarts=0 is how Ray Data's own code says to turn restarts off, though its
        # extra-arguments path warns of deprecation: no named parameter exists yet.
        warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
        return dataset.map_batches(
            BulkRouter,
            batch_size=actors.batch_size,
            batch_format="numpy",
            # Parquet is read by Ray tasks that need CPUs too: a pool that starts with one actor
            # and grows leaves them room (a fixed pool holding every CPU would wait forever for
            # rows the reads cannot produce).
            compute=data.ActorPoolStrategy(min_size=1 if grows else actors.count, max_size=actors.count),
            num_cpus=actors.threads,
            fn_constructor_kwargs={**router, "threads": actors.threads, "text_name": text_name},
            # Ray Data keeps an actor's constructor in its object store, where a restart could not
            # find it once freed (Ray logs an error line at start for each pool that allows
            # restarts): a dead actor fails the run instead, which writes nothing and can be rerun.
            max_restarts=0,
        )


def write_records(
    handle: Any, rows: Iterator[tuple[int, Any, str, str]], ids: dict[int, Any] | None, skipped: list[tuple[int, str]]
) -> Counter:
    """Write a record per routed row, in order, and add the rows the actors skipped to `skipped`; the picks.
    `ids`: by line, for a text input (None: each row carries its id)."""
    picks: Counter = Counter()
    for line, row_id, result, problem in rows:
        if problem:
            skipped.append((line, problem))
            continue
        identifier = json_value(row_id) if ids is None else ids.get(line)
        record = query_record(line, identifier, json.loads(result))
        picks[record["picked_agent"]] += 1
        handle.write(json.dumps(record, default=str) + "\n")
    return picks


def routed_rows(routed: Any, id_name: str | None) -> Iterator[tuple[int, Any, str, str]]:
    """(line, id, result JSON, problem) per row, in input order. Rows without a "line" column
    (Parquet) are numbered here, from 1, as they stream back in order."""
    numbered = 0
    for batch in routed.iter_batches(batch_format="numpy", batch_size=None):
        count = len(batch["result"])
        lines = batch["line"].tolist() if "line" in batch else range(numbered + 1, numbered + 1 + count)
        numbered += count
        row_ids = batch[id_name].tolist() if id_name else [None] * count
        yield from zip(lines, row_ids, batch["result"], batch["problem"], strict=True)


def parquet_dataset(
    data: Any, source: str, text_field: str | None, id_field: str | None
) -> tuple[Any, str, str | None]:
    """(dataset with the query as "text" and the id column, how reasons name the query, the id column)."""
    try:
        dataset = data.read_parquet(source)
        names = list(dataset.schema().names)
    except (OSError, ValueError) as err:
        raise InputError(f"cannot read Parquet input {source} ({first_line(err)}).") from None
    text_column = choose_text_field(names, text_field, source)
    id_column = choose_id_field(names, id_field, source)
    if id_column == text_column:
        id_column = None
    dataset = dataset.select_columns([text_column] + ([id_column] if id_column else []))
    return dataset.rename_columns({text_column: "text"}), f"'{text_column}'", id_column
