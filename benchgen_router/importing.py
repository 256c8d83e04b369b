"""Public outcome matrices read into the files `train`, `evaluate` and `frontier` read (docs/import.md).

Two sources:
- RouteLLM's response CSVs (`read_routellm_csvs`): a `prompt` column and one True/False column per
  model; `<model>_response` columns are the models' answers. Several files at once (MMLU's 57 subject
  files): a file's stem becomes its tasks' group, so a split can leave whole subjects out.
- The long format most tools export (`read_long_outcomes`): one row per (prompt, model) with the
  correctness or a score, optionally tokens, cost and latency, as CSV/TSV or JSON lines. NVIDIA's
  toolkit CSV (`question,model,isCorrect,output_tokens`) and LLMRouter's routing JSONL (`query`,
  `model_name`, `performance`, `input_tokens`, `output_tokens`, `response_time` in seconds,
  `task_name`, `response`) are read with no flags.

Task ids are deterministic. A RouteLLM row is `<file stem>:<row>`, its 1-based data row in the file
before decontamination: MMLU repeats 105 prompts (some across subjects, with other outcomes), so a
hash of the prompt would merge tasks that the data keeps apart, and numbering before the drop keeps
every other id the same when the contamination list changes. A long-format task is one prompt (within
its group, when there is a group column); its id is a digest of group and prompt, so it does not
depend on the order of the rows (or the id column the caller names).

Rewards are per call correct (1) or wrong (0), the pilot's definition, so that the calls file's
`correct` and the rewards file's `mean_reward` agree. A score strictly between 0 and 1 is counted as
correct from `correct_at` on; without it such a score is refused.

Cost per call: a cost column when the source has one (billed cost wins, as in costs.py); else the
tokens at the pool's prices (`with_prices`) or a fixed cost per call of each agent (`with_call_costs`);
else, with none of these, 1 per call, so that the cost of a routing is the count of calls each agent
gets (RouteLLM's own measure is the share of strong calls: `with_call_costs` with strong 1, weak 0).
Latency per call: a latency column, else 0 (said so in the notes).
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from benchgen_router.collect.formats import Task, calls_row, dump_row, pool_digest, rewards_row
from benchgen_router.costs import MAX_CALL_COST_USD, MAX_LATENCY_MS, AgentPrice
from benchgen_router.errors import InputError, setting_error
from benchgen_router.files import TEXT_FIELDS, Output, split_lines, text_problem

# Files written by write_outcomes, in an output folder.
TASKS_FILE, REWARDS_FILE, CALLS_FILE = "tasks.jsonl", "rewards.jsonl", "calls.jsonl"
RESPONSE_SUFFIX = "_response"  # RouteLLM: `<model>_response` holds that model's answer
TRUE_WORDS, FALSE_WORDS = {"true", "1", "1.0", "yes"}, {"false", "0", "0.0", "no"}
# Column names tried, in order, when the caller names none (the long format).
MODEL_FIELDS = ("model", "model_name", "agent", "llm")
CORRECT_FIELDS = ("correct", "is_correct", "isCorrect", "performance", "score", "reward")
GROUP_FIELDS = ("task_group", "task_name", "subject", "category")
PROMPT_TOKEN_FIELDS = ("prompt_tokens", "input_tokens")
COMPLETION_TOKEN_FIELDS = ("completion_tokens", "output_tokens")
COST_FIELDS = ("cost_usd", "cost")
RESPONSE_FIELDS = ("response", "raw_response")
# Latency columns and the unit each one is in (LLMRouter's response_time is in seconds).
LATENCY_FIELDS = {"latency_ms": "ms", "latency_s": "s", "response_time": "s"}
LATENCY_UNITS = {"ms": 1.0, "s": 1000.0}
TABLE_SUFFIXES = {".csv": ",", ".tsv": "\t"}
JSONL_SUFFIXES = (".jsonl", ".ndjson")
PICKLE_SUFFIXES = (".pkl", ".pickle")


@dataclass
class Outcomes:
    """Labelled outcomes: row i is task_ids[i] (prompts[i], groups[i]); column j is agents[j].

    `rewards[i, j]` is 1.0 when agent j answered task i correctly, else 0.0. The per-call arrays have
    the same shape and hold NaN where the source does not say: cost in USD (or 1 per call, see
    `cost_unit`), latency in milliseconds, token counts."""

    task_ids: list[str]
    prompts: list[str]
    groups: list[str | None]
    agents: list[str]
    rewards: np.ndarray  # (n, agents) float64, 0.0 or 1.0
    cost_usd: np.ndarray  # (n, agents) float64, NaN where unknown
    latency_ms: np.ndarray  # (n, agents) float64, NaN where unknown
    prompt_tokens: np.ndarray  # (n, agents) float64 (whole numbers), NaN where unknown
    completion_tokens: np.ndarray  # (n, agents) float64 (whole numbers), NaN where unknown
    responses: list[list[str | None]] | None = None  # [task][agent] answer text, when the source has it
    sources: list[str] = field(default_factory=list)  # "<file>:<line>" of each task's first row
    dataset: str | None = None
    dropped_contaminated: int = 0  # rows dropped because their prompt is on a contamination list
    dropped_incomplete: int = 0  # prompts dropped for a missing (prompt, model) cell (drop_incomplete)
    cost_unit: str = "usd"  # "usd", or "calls": a count of calls (1 per call, or a fixed cost per call in calls)
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.task_ids)

    def head(self, count: int) -> Outcomes:
        """The first `count` tasks (a small slice to try things on)."""
        keep = slice(0, count)
        return replace(
            self,
            task_ids=self.task_ids[keep],
            prompts=self.prompts[keep],
            groups=self.groups[keep],
            rewards=self.rewards[keep],
            cost_usd=self.cost_usd[keep],
            latency_ms=self.latency_ms[keep],
            prompt_tokens=self.prompt_tokens[keep],
            completion_tokens=self.completion_tokens[keep],
            responses=None if self.responses is None else self.responses[keep],
            sources=self.sources[keep],
            notes=list(self.notes),
        )


# ---------------------------------------------------------------------------------------------
# Reading tables: CSV/TSV and JSON lines, as rows with the line each starts on


def refuse_pickle(path: Path) -> None:
    """Pickles run code when loaded: refused by name and by their magic bytes, never opened further."""
    if path.suffix.lower() in PICKLE_SUFFIXES:
        raise InputError(f"{path} is a pickle, which can run code when loaded and is never read; export CSV or JSONL.")
    try:
        with open(path, "rb") as handle:
            start = handle.read(2)
    except FileNotFoundError:
        raise InputError(f"outcomes file not found: {path}") from None
    except OSError as err:
        raise InputError(f"cannot read {path} ({err.strerror}); pass a CSV or JSONL file.") from None
    if len(start) == 2 and start[0] == 0x80 and 2 <= start[1] <= 5:  # pickle protocols 2 to 5 open with PROTO
        raise InputError(
            f"{path} holds a pickle, which can run code when loaded and is never read; export CSV or JSONL."
        )


def _decode_error(path: Path, line: int) -> InputError:
    return InputError(f"{path} line {line} is not UTF-8 text; save the file as UTF-8.")


def read_table(path: Path) -> tuple[list[str], list[tuple[int, dict[str, Any]]]]:
    """(column names, [(line, row)]) of a CSV/TSV (header row; a quoted field may span lines, so a
    row is numbered by the line it starts on) or JSON-lines file (columns: the first object's keys)."""
    refuse_pickle(path)
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        return _read_jsonl_table(path)
    if suffix not in TABLE_SUFFIXES:
        raise InputError(
            f"{path}: outcomes are read from .csv, .tsv, .jsonl or .ndjson files; rename it or export one of those."
        )
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise _decode_error(path, data[: err.start].count(b"\n") + 1) from None
    previous_limit = csv.field_size_limit(2**31 - 1)  # answers can pass csv's 128 KiB default
    try:
        reader = csv.reader(io.StringIO(text, newline=""), delimiter=TABLE_SUFFIXES[suffix])
        header = next(reader, None)
        if not header:
            raise InputError(f"{path} is empty; it needs a header row and one row per outcome.")
        if len(set(header)) != len(header):
            repeated = sorted({name for name in header if header.count(name) > 1})
            raise InputError(f"{path} line 1 repeats column {repeated[0]!r}; every column needs its own name.")
        rows = []
        while True:
            start = reader.line_num + 1
            cells = next(reader, None)
            if cells is None:
                break
            if not any(cell.strip() for cell in cells):
                continue
            if len(cells) != len(header):
                raise InputError(
                    f"{path} line {start} has {len(cells)} fields for {len(header)} columns; quote fields that "
                    "hold the delimiter or a line break."
                )
            rows.append((start, dict(zip(header, cells, strict=True))))
    except csv.Error as err:
        raise InputError(f"{path} line {reader.line_num} is not valid CSV ({err}); fix its quoting.") from None
    finally:
        csv.field_size_limit(previous_limit)
    return header, rows


def _read_jsonl_table(
    path: Path, needs: str = "one JSON object per (prompt, model) outcome"
) -> tuple[list[str], list[tuple[int, dict[str, Any]]]]:
    rows: list[tuple[int, dict[str, Any]]] = []
    for number, line in split_lines(path.read_bytes()):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputError(f"{path} line {number} is not valid JSON ({err.msg}); fix or remove it.") from None
        except UnicodeError:
            raise _decode_error(path, number) from None
        if not isinstance(row, dict):
            raise InputError(f"{path} line {number} is not a JSON object; each line must be one outcome object.")
        rows.append((number, row))
    if not rows:
        raise InputError(f"{path} has no rows; it needs {needs}.")
    return list(rows[0][1]), rows


def _text_cell(value: Any, where: str, column: str) -> str:
    problem = "is empty" if value is None else text_problem(value, f"'{column}'")
    if problem:
        raise InputError(f"{where}: {problem}; every row needs the prompt text and the model name.")
    return value


def parse_correct(value: Any, where: str, column: str, correct_at: float | None) -> float:
    """1.0 or 0.0 from a boolean, True/False text, 0/1, or a score in [0, 1] (>= correct_at is correct)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in TRUE_WORDS:
            return 1.0
        if word in FALSE_WORDS:
            return 0.0
        try:
            value = float(word)
        except ValueError:
            raise InputError(
                f"{where}: '{column}' is {value!r}; it must be True/False, 1/0 or a score from 0 to 1."
            ) from None
    if not isinstance(value, int | float) or not math.isfinite(value) or not 0 <= value <= 1:
        raise InputError(f"{where}: '{column}' is {value!r}; it must be True/False, 1/0 or a score from 0 to 1.")
    if value in (0, 1):
        return float(value)
    if correct_at is None:
        raise setting_error(
            f"{where}: '{column}' is the score {value!r}; rewards count calls as correct or wrong, so pass "
            "{correct_at=SCORE} to count a score from SCORE up as correct (e.g. 0.5)."
        )
    return 1.0 if value >= correct_at else 0.0


def _number_cell(value: Any, where: str, column: str, maximum: float, whole: bool = False) -> float:
    """A number >= 0 (empty or null: NaN, unknown)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return math.nan
    number = value
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = None
    if (
        not isinstance(number, int | float)
        or isinstance(number, bool)
        or not math.isfinite(number)
        or not 0 <= number <= maximum
        or (whole and number != int(number))
    ):
        kind = "a whole number" if whole else "a number"
        raise InputError(f"{where}: '{column}' is {value!r}; it must be {kind} from 0 to {maximum:g}.")
    return float(number)


# ---------------------------------------------------------------------------------------------
# RouteLLM's response CSVs


def read_contaminated(paths: Iterable[str | os.PathLike]) -> set[str]:
    """The prompts of RouteLLM's contamination lists (JSON lines with `eval_prompt`)."""
    prompts: set[str] = set()
    for path in map(Path, paths):
        refuse_pickle(path)
        _, rows = _read_jsonl_table(path, "one JSON object with an eval_prompt per line")
        for number, row in rows:
            prompt = row.get("eval_prompt")
            if not isinstance(prompt, str) or not prompt:
                raise InputError(
                    f"contamination list {path} line {number} has no eval_prompt; pass RouteLLM's "
                    "contaminated_prompts.jsonl (eval_prompt per line)."
                )
            prompts.add(prompt)
    return prompts


def csv_files(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Files as given, and a folder's *.csv files in name order."""
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted(path.glob("*.csv"))
            if not found:
                raise InputError(f"folder {path} has no .csv files; pass RouteLLM's response CSVs or their folder.")
            files.extend(found)
        else:
            files.append(path)
    if not files:
        raise InputError("no outcome files given; pass RouteLLM's response CSVs or their folder.")
    stems = [file.stem for file in files]
    repeated = sorted({stem for stem in stems if stems.count(stem) > 1})
    if repeated:
        raise InputError(f"two files are named {repeated[0]!r}; a file's stem names its tasks, so stems must differ.")
    return files


def read_routellm_csvs(
    paths: Iterable[str | os.PathLike],
    contaminated: Iterable[str | os.PathLike] | set[str] = (),
    models: Sequence[str] | None = None,
    dataset: str | None = None,
) -> Outcomes:
    """Outcomes of RouteLLM's response CSVs (files or folders of *.csv; each file's stem is its
    tasks' group). `contaminated`: contamination-list files, or a set of prompts, whose rows are
    dropped. `models`: the correctness columns, in the order wanted (default: every column but
    `prompt` and `*_response`, in the first file's order); all files must have them."""
    files = csv_files(paths)
    drop = contaminated if isinstance(contaminated, set) else read_contaminated(contaminated)
    agents: list[str] | None = list(models) if models is not None else None
    task_ids, prompts, groups, sources, rewards, responses = [], [], [], [], [], []
    dropped = 0
    has_responses = False
    for path in files:
        if path.suffix.lower() != ".csv":
            refuse_pickle(path)
            raise InputError(f"{path} is not a .csv file; RouteLLM's responses are CSV files.")
        header, rows = read_table(path)
        if "prompt" not in header:
            raise InputError(f"{path} has no 'prompt' column; RouteLLM's response CSVs have prompt and one per model.")
        columns = [name for name in header if name != "prompt" and not name.endswith(RESPONSE_SUFFIX)]
        if agents is None:
            agents = columns
            if not agents:
                raise InputError(f"{path} has no model columns; each model needs a True/False column.")
        missing = [agent for agent in agents if agent not in header]
        if missing:
            raise InputError(
                f"{path} has no column {missing[0]!r} (it has {', '.join(map(repr, header))}); every file must "
                "score the same models (pass models= / --models to choose them)."
            )
        if models is None and sorted(columns) != sorted(agents):
            extra = sorted(set(columns) - set(agents))
            raise InputError(
                f"{path} has model column {extra[0]!r}, which earlier files lack; pass models= / --models to "
                "choose the columns every file has."
            )
        has_responses |= any(agent + RESPONSE_SUFFIX in header for agent in agents)
        for index, (line, row) in enumerate(rows, start=1):
            where = f"{path} line {line}"
            prompt = _text_cell(row["prompt"], where, "prompt")
            if prompt in drop:
                dropped += 1
                continue
            rewards.append([parse_correct(row[agent], where, agent, None) for agent in agents])
            responses.append([row.get(agent + RESPONSE_SUFFIX) for agent in agents])
            task_ids.append(f"{path.stem}:{index}")
            prompts.append(prompt)
            groups.append(path.stem)
            sources.append(f"{path.name}:{line}")
    if not task_ids:
        raise InputError("no outcome rows are left to import (every row was empty or contaminated).")
    assert agents is not None
    shape = (len(task_ids), len(agents))
    unknown = np.full(shape, np.nan)
    return Outcomes(
        task_ids=task_ids,
        prompts=prompts,
        groups=groups,
        agents=agents,
        rewards=np.asarray(rewards, dtype=np.float64),
        cost_usd=unknown.copy(),
        latency_ms=unknown.copy(),
        prompt_tokens=unknown.copy(),
        completion_tokens=unknown.copy(),
        responses=responses if has_responses else None,
        sources=sources,
        dataset=dataset,
        dropped_contaminated=dropped,
    )


# ---------------------------------------------------------------------------------------------
# The long format: one row per (prompt, model)


@dataclass(frozen=True)
class LongColumns:
    """Column names of a long-format file; None: found among the usual names (optional ones may be
    absent). `latency_unit` is "ms" or "s" for a latency column named here."""

    prompt: str | None = None
    model: str | None = None
    correct: str | None = None
    group: str | None = None
    prompt_tokens: str | None = None
    completion_tokens: str | None = None
    cost: str | None = None
    latency: str | None = None
    latency_unit: str = "ms"
    response: str | None = None


def _choose(header: Sequence[str], chosen: str | None, usual: Sequence[str], what: str, path: Path) -> str | None:
    if chosen is not None:
        if chosen not in header:
            raise InputError(f"{path} has no column {chosen!r} for {what}; it has {', '.join(map(repr, header))}.")
        return chosen
    return next((name for name in usual if name in header), None)


def _required(
    header: Sequence[str], chosen: str | None, usual: Sequence[str], described: str, what: str, flag: str, path: Path
) -> str:
    """_choose's column, which must exist: none of the usual names is one line naming the flag to pass."""
    name = _choose(header, chosen, usual, described, path)
    if name is None:
        raise setting_error(
            f"{path} has none of the usual {what} columns ({', '.join(usual)}); it has "
            f"{', '.join(map(repr, header))}. Pass {{{flag}=NAME}}."
        )
    return name


def _task_id(group: str | None, prompt: str) -> str:
    digest = hashlib.sha256(f"{group or ''}\x00{prompt}".encode()).hexdigest()
    return f"{group}:{digest[:12]}" if group else digest[:16]


def _short(prompt: str) -> str:
    text = " ".join(prompt.split())
    return repr(text if len(text) <= 60 else text[:57] + "...")


@dataclass(frozen=True)
class _LongLayout:
    """Which column of a long-format file holds what (None: absent), and the latency column's unit."""

    prompt: str
    model: str
    correct: str
    group: str | None
    prompt_tokens: str | None
    completion_tokens: str | None
    cost: str | None
    response: str | None
    latency: str | None
    latency_unit: str


def _long_layout(header: Sequence[str], columns: LongColumns, path: Path) -> _LongLayout:
    """The columns named in `columns`, else recognised by their usual names; a required one missing is one line."""
    if columns.latency_unit not in LATENCY_UNITS:
        raise InputError(f"latency unit {columns.latency_unit!r} must be one of {', '.join(LATENCY_UNITS)}.")
    latency = _choose(header, columns.latency, tuple(LATENCY_FIELDS), "latency", path)
    return _LongLayout(
        prompt=_required(header, columns.prompt, TEXT_FIELDS, "the prompt", "prompt", "prompt_column", path),
        model=_required(header, columns.model, MODEL_FIELDS, "the model", "model", "model_column", path),
        correct=_required(
            header, columns.correct, CORRECT_FIELDS, "correctness", "correctness", "correct_column", path
        ),
        group=_choose(header, columns.group, GROUP_FIELDS, "the group", path),
        prompt_tokens=_choose(header, columns.prompt_tokens, PROMPT_TOKEN_FIELDS, "prompt tokens", path),
        completion_tokens=_choose(
            header, columns.completion_tokens, COMPLETION_TOKEN_FIELDS, "completion tokens", path
        ),
        cost=_choose(header, columns.cost, COST_FIELDS, "cost", path),
        response=_choose(header, columns.response, RESPONSE_FIELDS, "the response", path),
        latency=latency,
        latency_unit=columns.latency_unit if columns.latency is not None else LATENCY_FIELDS.get(latency or "", "ms"),
    )


def _long_cell(row: dict[str, Any], layout: _LongLayout, line: int, where: str, correct_at: float | None) -> dict:
    """One (prompt, model) row's reward, cost, latency (ms), tokens and response; NaN where a column is absent."""

    def number(column: str | None, limit: float, whole: bool = False) -> float:
        return math.nan if column is None else _number_cell(row.get(column), where, column, limit, whole=whole)

    unit = LATENCY_UNITS[layout.latency_unit]
    return {
        "line": line,
        "reward": parse_correct(row.get(layout.correct), where, layout.correct, correct_at),
        "cost": number(layout.cost, MAX_CALL_COST_USD),
        "latency_ms": number(layout.latency, MAX_LATENCY_MS / unit) * unit,
        "prompt_tokens": number(layout.prompt_tokens, 1e12, whole=True),
        "completion_tokens": number(layout.completion_tokens, 1e12, whole=True),
        "response": None if layout.response is None else row.get(layout.response),
    }


def read_long_outcomes(
    path: str | os.PathLike,
    columns: LongColumns | None = None,
    correct_at: float | None = None,
    contaminated: Iterable[str | os.PathLike] | set[str] = (),
    drop_incomplete: bool = False,
    dataset: str | None = None,
) -> Outcomes:
    """Outcomes of a long-format file (CSV/TSV/JSONL, one row per prompt and model).

    Tasks are in the order their prompt first appears, agents in the order their model first
    appears. A (prompt, model) pair given twice is an error naming both lines; a prompt without a
    row for some model is an error naming it, or, with `drop_incomplete`, dropped and counted."""
    path = Path(path)
    header, rows = read_table(path)
    layout = _long_layout(header, columns or LongColumns(), path)
    drop = contaminated if isinstance(contaminated, set) else read_contaminated(contaminated)

    agents: list[str] = []
    tasks: dict[tuple[str | None, str], dict[str, Any]] = {}  # (group, prompt) -> first line and cells
    dropped = 0
    for line, row in rows:
        where = f"{path} line {line}"
        prompt = _text_cell(row.get(layout.prompt), where, layout.prompt)
        if prompt in drop:
            dropped += 1
            continue
        model = _text_cell(row.get(layout.model), where, layout.model)
        group = None
        if layout.group is not None and row.get(layout.group) not in (None, ""):
            group = str(row[layout.group])
        if model not in agents:
            agents.append(model)
        task = tasks.setdefault((group, prompt), {"line": line, "cells": {}})
        if model in task["cells"]:
            raise InputError(
                f"{where} repeats prompt {_short(prompt)} for model {model!r} (first at line "
                f"{task['cells'][model]['line']}); give each (prompt, model) one row."
            )
        task["cells"][model] = _long_cell(row, layout, line, where, correct_at)

    kept = []
    dropped_incomplete = 0
    for (group, prompt), task in tasks.items():
        absent = [agent for agent in agents if agent not in task["cells"]]
        if not absent:
            kept.append((group, prompt, task))
        elif drop_incomplete:
            dropped_incomplete += 1
        else:
            raise setting_error(
                f"{path}: prompt {_short(prompt)} (line {task['line']}) has no row for model {absent[0]!r}; every "
                "prompt needs one row per model, or pass {drop_incomplete} to leave such prompts out."
            )
    if not kept:
        raise InputError(f"{path}: no prompt has a row for every model ({', '.join(agents)}); nothing to import.")

    def matrix(key: str) -> np.ndarray:
        return np.array([[task["cells"][agent][key] for agent in agents] for _, _, task in kept], dtype=np.float64)

    left_out = f"{dropped_incomplete} prompts without a row for every model were left out"
    return Outcomes(
        task_ids=[_task_id(group, prompt) for group, prompt, _ in kept],
        prompts=[prompt for _, prompt, _ in kept],
        groups=[group for group, _, _ in kept],
        agents=agents,
        rewards=matrix("reward"),
        cost_usd=matrix("cost"),
        latency_ms=matrix("latency_ms"),
        prompt_tokens=matrix("prompt_tokens"),
        completion_tokens=matrix("completion_tokens"),
        responses=None
        if layout.response is None
        else [[task["cells"][agent]["response"] for agent in agents] for _, _, task in kept],
        sources=[f"{path.name}:{task['line']}" for _, _, task in kept],
        dataset=dataset,
        dropped_contaminated=dropped,
        dropped_incomplete=dropped_incomplete,
        notes=[left_out] if dropped_incomplete else [],
    )


# ---------------------------------------------------------------------------------------------
# Costs


def with_prices(outcomes: Outcomes, prices: Mapping[str, AgentPrice]) -> Outcomes:
    """Outcomes whose unknown costs are the calls' tokens at the pool's prices (USD per 1M tokens); a
    known cost is kept (the billed figure is the truth). A call with no cost and no completion token
    count is an error naming it; unknown prompt tokens count 0 (said so in the notes)."""
    cost = outcomes.cost_usd.copy()
    unknown = np.isnan(cost)
    estimated = prompt_unknown = 0
    for i, j in zip(*np.nonzero(unknown), strict=True):
        completion = outcomes.completion_tokens[i, j]
        if np.isnan(completion):
            raise setting_error(
                f"task {outcomes.task_ids[i]!r} ({outcomes.sources[i] if outcomes.sources else 'no source'}), model "
                f"{outcomes.agents[j]!r} has no cost and no token counts to price; pass a file with token counts "
                "(or a cost column), or leave out {pool} to count calls instead."
            )
        prompt = outcomes.prompt_tokens[i, j]
        if np.isnan(prompt):
            prompt_unknown += 1
            prompt = 0.0
        cost[i, j] = prices[outcomes.agents[j]].cost_usd(int(prompt), int(completion))
        estimated += 1
    notes = list(outcomes.notes)
    if estimated:
        notes.append(f"{estimated} calls priced from their tokens at the pool's prices")
    if prompt_unknown:
        notes.append(f"{prompt_unknown} calls had no prompt token count; only their completion tokens were priced")
    return replace(outcomes, cost_usd=cost, cost_unit="usd", notes=notes)


def with_call_costs(outcomes: Outcomes, per_call: Mapping[str, float], unit: str = "usd") -> Outcomes:
    """Outcomes whose unknown costs are a fixed cost per call of each agent (a known cost is kept).
    With strong 1 and weak 0 (unit "calls"), a routing's cost is its share of strong calls, RouteLLM's
    own measure; with USD figures, a price per call where the source has no token counts."""
    missing = [agent for agent in outcomes.agents if agent not in per_call]
    extra = sorted(set(per_call) - set(outcomes.agents))
    if missing or extra:
        raise setting_error(
            f"{{call_cost}} must name every agent {outcomes.agents} once (missing: {missing or 'none'}, "
            f"not an agent: {extra or 'none'})."
        )
    for agent, value in per_call.items():
        if not isinstance(value, int | float) or not math.isfinite(value) or not 0 <= value <= MAX_CALL_COST_USD:
            raise setting_error(f"{{call_cost}} of {agent!r} is {value!r}; it must be from 0 to {MAX_CALL_COST_USD:g}.")
    fixed = np.array([float(per_call[agent]) for agent in outcomes.agents])
    unknown = np.isnan(outcomes.cost_usd)
    cost = np.where(unknown, fixed[None, :], outcomes.cost_usd)
    notes = [*outcomes.notes, f"{int(unknown.sum())} calls cost their agent's fixed cost per call"]
    return replace(outcomes, cost_usd=cost, cost_unit=unit, notes=notes)


def call_costs(outcomes: Outcomes) -> tuple[np.ndarray, str]:
    """(cost per call, unit): the known costs in USD, or 1 per call ("calls") when none is known."""
    unknown = np.isnan(outcomes.cost_usd)
    if unknown.all():
        return np.ones_like(outcomes.cost_usd), "calls"
    if unknown.any():
        i, j = (int(k[0]) for k in np.nonzero(unknown))
        raise setting_error(
            f"task {outcomes.task_ids[i]!r} ({outcomes.sources[i] if outcomes.sources else 'no source'}), model "
            f"{outcomes.agents[j]!r} has no cost while other calls have one; give every row a cost, or pass "
            "{pool} with token counts to price the rest."
        )
    return outcomes.cost_usd, outcomes.cost_unit


# ---------------------------------------------------------------------------------------------
# Writing: the tasks, rewards and calls files


def task_row(task: Task, source: str | None) -> dict[str, Any]:
    """A task's row of the tasks file train and evaluate join on task_id: its prompt, split and group,
    and where it came from. Imported tasks carry no answer or grader (the sources hold only whether
    each model was right), so `collect` cannot re-ask them."""
    return {
        "prompt": task.prompt,
        "source": {"dataset": task.dataset, "line": source},
        "split": task.split,
        "task_group": task.task_group,
        "task_id": task.task_id,
    }


def _call(
    agent: str,
    correct: bool,
    cost: float,
    latency_ms: float,
    prompt_tokens: float,
    completion_tokens: float,
    response: str | None,
) -> dict[str, Any]:
    """One call in the pilot's call fields (collect/formats.py CALL_FIELDS): one repetition, no error."""
    return {
        "agent": agent,
        "completion_tokens": None if math.isnan(completion_tokens) else int(completion_tokens),
        "correct": correct,
        "cost_usd": float(cost),
        "empty": response is not None and not response.strip(),
        "error": None,
        "extracted": None,
        "generation_id": None,
        "latency_ms": 0.0 if math.isnan(latency_ms) else float(latency_ms),
        "prompt_tokens": None if math.isnan(prompt_tokens) else int(prompt_tokens),
        "raw_response": response,
        "repetition": 0,
        "role": None,
    }


@dataclass
class Written:
    """What write_outcomes wrote, for the summary."""

    tasks: int
    agents: list[str]
    mean_reward: list[float]
    cost_unit: str
    mean_cost: list[float]  # per call, per agent, in cost_unit
    paths: list[Path]
    notes: list[str]


def _rows(outcomes: Outcomes, pool_version: str) -> Iterator[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    cost, _ = call_costs(outcomes)
    for i, task_id in enumerate(outcomes.task_ids):
        # answer and grader are not known for imported tasks; rewards_row reads only the fields it copies.
        task = Task(task_id, outcomes.prompts[i], "", "", task_group=outcomes.groups[i], dataset=outcomes.dataset)
        calls = [
            _call(
                agent,
                bool(outcomes.rewards[i, j]),
                cost[i, j],
                outcomes.latency_ms[i, j],
                outcomes.prompt_tokens[i, j],
                outcomes.completion_tokens[i, j],
                None if outcomes.responses is None else outcomes.responses[i][j],
            )
            for j, agent in enumerate(outcomes.agents)
        ]
        calls_file_row = calls_row(task_id, outcomes.agents, calls, 1, pool_version)
        source = outcomes.sources[i] if outcomes.sources else None
        yield task_row(task, source), rewards_row(calls_file_row, task), calls_file_row


def write_outcomes(outcomes: Outcomes, output_dir: str | os.PathLike, pool_version: str | None = None) -> Written:
    """Write tasks.jsonl, rewards.jsonl and calls.jsonl into output_dir (created if need be), in the
    formats collect writes (collect/formats.py): `train --rewards rewards.jsonl --tasks tasks.jsonl
    --calls calls.jsonl` reads them. Each file is written to a temporary file beside it, and the three
    are moved into place only once all are complete: a bad input leaves the folder as it was."""
    folder = Path(output_dir)
    if folder.exists() and not folder.is_dir():
        raise InputError(f"output folder {folder} is a file; pass a folder path.")
    if len(set(outcomes.task_ids)) != len(outcomes.task_ids):
        raise InputError("task ids repeat; each task must appear once.")
    pool_version = pool_version or pool_digest(outcomes.agents, outcomes.agents)
    cost, unit = call_costs(outcomes)  # refused before any file is made
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError(f"cannot create {folder} ({err.strerror}); pass another folder.") from None
    outputs: list[Output] = []
    done = False
    try:
        outputs.extend(Output(folder / name) for name in (TASKS_FILE, REWARDS_FILE, CALLS_FILE))
        for rows in _rows(outcomes, pool_version):
            for output, row in zip(outputs, rows, strict=True):
                output.handle.write(dump_row(row))
        for output in outputs:
            output.commit()
        done = True
    finally:
        for output in outputs:
            output.discard()  # nothing left once committed; removes the temporary files otherwise
        if not done and created:
            with contextlib.suppress(OSError):
                folder.rmdir()  # a folder this call made and left empty
    notes = list(outcomes.notes)
    if np.isnan(outcomes.cost_usd).all():
        notes.append("no cost or prices known: each call costs 1, so cost counts calls (not USD)")
    if np.isnan(outcomes.latency_ms).all():
        notes.append("no latency known: latency_ms is written as 0")
    return Written(
        tasks=len(outcomes),
        agents=list(outcomes.agents),
        mean_reward=outcomes.rewards.mean(axis=0).tolist(),
        cost_unit=unit,
        mean_cost=cost.mean(axis=0).tolist(),
        paths=[output.path for output in outputs],
        notes=notes,
    )
