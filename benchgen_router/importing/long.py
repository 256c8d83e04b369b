"""The long format most tools export: one row per (task, model) with the correctness or a score, optionally
tokens, cost and latency, as CSV/TSV or JSON lines. NVIDIA's toolkit CSV
(`question,model,isCorrect,output_tokens`) and LLMRouter's routing JSONL (`query`, `model_name`,
`performance`, `input_tokens`, `output_tokens`, `response_time` in seconds, `task_name`, `response`) are
read with no flags.

Two layouts:
- the prompt on every row: a task is one prompt (within its group, when there is a group column); its
  id is a digest of group and prompt, so it does not depend on the order of the rows;
- the prompt in a file of its own, keyed by an id (`read_prompts`), as per-sample evaluation logs keep
  them (lm-evaluation-harness, HELM, OpenCompass, MMLU-Pro): a task is an id, so two ids with the same
  prompt stay two tasks, and the outcomes name only the id.

A score strictly between 0 and 1 is counted as correct from `correct_at` on; without it such a score is
refused. Latency per call: a latency column, else 0 (said so in the notes).
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchgen_router.costs import MAX_CALL_COST_USD, MAX_LATENCY_MS
from benchgen_router.errors import InputError, setting_error
from benchgen_router.files import TEXT_FIELDS
from benchgen_router.importing.outcomes import Outcomes
from benchgen_router.importing.routellm import read_contaminated
from benchgen_router.importing.tables import (
    choose_column,
    id_cell,
    number_cell,
    parse_correct,
    read_table,
    required_column,
    short,
    text_cell,
)

# Column names tried, in order, when the caller names none.
MODEL_FIELDS = ("model", "model_name", "agent", "llm")
CORRECT_FIELDS = ("correct", "is_correct", "isCorrect", "performance", "score", "reward")
GROUP_FIELDS = ("task_group", "task_name", "subject", "category")
ID_FIELDS = ("question_id", "task_id", "doc_id", "sample_id", "id")
PROMPT_TOKEN_FIELDS = ("prompt_tokens", "input_tokens")
COMPLETION_TOKEN_FIELDS = ("completion_tokens", "output_tokens")
COST_FIELDS = ("cost_usd", "cost")
RESPONSE_FIELDS = ("response", "raw_response")
# Latency columns and the unit each one is in (LLMRouter's response_time is in seconds).
LATENCY_FIELDS = {"latency_ms": "ms", "latency_s": "s", "response_time": "s"}
LATENCY_UNITS = {"ms": 1.0, "s": 1000.0}
# The numbers of a cell, in the order _Cells keeps them.
NUMBERS = ("reward", "cost", "latency_ms", "prompt_tokens", "completion_tokens")


@dataclass(frozen=True)
class LongColumns:
    """Column names of a long-format file; None: found among the usual names (optional ones may be
    absent). `latency_unit` is "ms" or "s" for a latency column named here. `id` is the column a
    prompts file and the outcomes share (read_prompts); `prompt` and `group` are then the prompts
    file's columns."""

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
    id: str | None = None


@dataclass
class Prompts:
    """The tasks of a prompts file, in its order: id, prompt, group, and the line each came from."""

    path: Path
    id_column: str
    ids: list[str]
    prompts: list[str]
    groups: list[str | None]
    lines: list[int]

    def index(self) -> dict[str, int]:
        return {task_id: i for i, task_id in enumerate(self.ids)}


def read_prompts(path: str | os.PathLike, columns: LongColumns | None = None) -> Prompts:
    """The prompts file of a per-sample log (CSV/TSV/JSONL, one row per task): its id column
    (`columns.id`, else the first of ID_FIELDS present), prompt and group. An id given twice is an error
    naming both lines."""
    path = Path(path)
    columns = columns or LongColumns()
    header, rows = read_table(path, "prompts", "one row per task with its id and prompt")
    id_column = choose_column(header, columns.id, ID_FIELDS, "the task id", path)
    if id_column is None:
        raise setting_error(
            f"{path} has no id column (none of {', '.join(ID_FIELDS)}); it has {', '.join(map(repr, header))}. "
            "Pass {id_column=NAME}, the column the prompts and the outcomes share."
        )
    prompt_column = required_column(header, columns.prompt, TEXT_FIELDS, "the prompt", "prompt", "prompt_column", path)
    group_column = choose_column(header, columns.group, GROUP_FIELDS, "the group", path)
    prompts = Prompts(path, id_column, [], [], [], [])
    first_line: dict[str, int] = {}
    for line, row in rows:
        where = f"{path} line {line}"
        if id_column not in row:
            raise InputError(f"{where} has no {id_column!r}; every prompt needs its id.")
        task_id = id_cell(row[id_column], where, id_column)
        if task_id in first_line:
            raise InputError(
                f"{where} repeats id {task_id!r} (first at line {first_line[task_id]}); each id needs one prompt."
            )
        first_line[task_id] = line
        prompts.ids.append(task_id)
        prompts.prompts.append(text_cell(row.get(prompt_column), where, prompt_column))
        group = row.get(group_column) if group_column is not None else None
        prompts.groups.append(None if group in (None, "") else str(group))
        prompts.lines.append(line)
    if not prompts.ids:
        raise InputError(f"{path} has no rows; it needs one row per task with its id and prompt.")
    return prompts


@dataclass(frozen=True)
class _LongLayout:
    """Which column of a long-format file holds what (None: absent), and the latency column's unit."""

    prompt: str | None  # None when the prompts come from a prompts file
    group: str | None
    id: str | None  # the id the prompts file is joined on
    model: str
    correct: str
    prompt_tokens: str | None
    completion_tokens: str | None
    cost: str | None
    response: str | None
    latency: str | None
    latency_unit: str


def _long_layout(header: Sequence[str], columns: LongColumns, path: Path, prompts: Prompts | None) -> _LongLayout:
    """The columns named in `columns`, else recognised by their usual names; a required one missing is one line."""
    if columns.latency_unit not in LATENCY_UNITS:
        raise InputError(f"latency unit {columns.latency_unit!r} must be one of {', '.join(LATENCY_UNITS)}.")
    latency = choose_column(header, columns.latency, tuple(LATENCY_FIELDS), "latency", path)
    if prompts is None:
        prompt = required_column(header, columns.prompt, TEXT_FIELDS, "the prompt", "prompt", "prompt_column", path)
        group = choose_column(header, columns.group, GROUP_FIELDS, "the group", path)
        id_column = None
    else:
        prompt = group = None
        id_column = prompts.id_column
        if id_column not in header:
            raise setting_error(
                f"{path} has no column {id_column!r}, the id of the prompts file {prompts.path}; it has "
                f"{', '.join(map(repr, header))}. Pass {{id_column=NAME}}, a column both files have."
            )
    return _LongLayout(
        prompt=prompt,
        group=group,
        id=id_column,
        model=required_column(header, columns.model, MODEL_FIELDS, "the model", "model", "model_column", path),
        correct=required_column(
            header, columns.correct, CORRECT_FIELDS, "correctness", "correctness", "correct_column", path
        ),
        prompt_tokens=choose_column(header, columns.prompt_tokens, PROMPT_TOKEN_FIELDS, "prompt tokens", path),
        completion_tokens=choose_column(
            header, columns.completion_tokens, COMPLETION_TOKEN_FIELDS, "completion tokens", path
        ),
        cost=choose_column(header, columns.cost, COST_FIELDS, "cost", path),
        response=choose_column(header, columns.response, RESPONSE_FIELDS, "the response", path),
        latency=latency,
        latency_unit=columns.latency_unit if columns.latency is not None else LATENCY_FIELDS.get(latency or "", "ms"),
    )


class _Cells:
    """The (task, model) cells as they are read: flat columns, turned into matrices once at the end (a
    dict per cell would cost far more memory than the numbers themselves)."""

    def __init__(self, with_responses: bool) -> None:
        self.task: list[int] = []
        self.agent: list[int] = []
        self.line: list[int] = []
        self.numbers: list[tuple[float, ...]] = []
        self.responses: list[Any] | None = [] if with_responses else None

    def add(self, task: int, agent: int, line: int, numbers: tuple[float, ...], response: Any) -> None:
        self.task.append(task)
        self.agent.append(agent)
        self.line.append(line)
        self.numbers.append(numbers)
        if self.responses is not None:
            self.responses.append(response)

    def matrices(
        self, tasks: int, agents: list[str], describe: Callable[[int], str], path: Path
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """({number: (tasks, agents) matrix}, (tasks, agents) index of each cell's row here, -1 where none).
        A (task, model) pair given twice is an error naming both lines (`describe(task)` names the task)."""
        task, agent = np.asarray(self.task, dtype=np.int64), np.asarray(self.agent, dtype=np.int64)
        flat = task * len(agents) + agent
        order = np.argsort(flat, kind="stable")
        repeated = np.flatnonzero(flat[order][1:] == flat[order][:-1])
        if len(repeated):
            first, again = int(order[repeated[0]]), int(order[repeated[0] + 1])
            raise InputError(
                f"{path} line {self.line[again]} repeats {describe(int(task[again]))} for model "
                f"{agents[int(agent[again])]!r} (first at line {self.line[first]}); give each (task, model) one row."
            )
        where = np.full(tasks * len(agents), -1, dtype=np.int64)
        where[flat] = np.arange(len(flat))
        values = np.asarray(self.numbers, dtype=np.float64).reshape(len(flat), len(NUMBERS))
        matrices = {}
        for k, name in enumerate(NUMBERS):
            matrix = np.full(tasks * len(agents), np.nan)
            matrix[flat] = values[:, k]
            matrices[name] = matrix.reshape(tasks, len(agents))
        return matrices, where.reshape(tasks, len(agents))


def read_long_outcomes(
    path: str | os.PathLike,
    columns: LongColumns | None = None,
    correct_at: float | None = None,
    contaminated: Iterable[str | os.PathLike] | set[str] = (),
    drop_incomplete: bool = False,
    dataset: str | None = None,
    prompts: Prompts | None = None,
) -> Outcomes:
    """Outcomes of a long-format file (CSV/TSV/JSONL, one row per task and model).

    Without `prompts`, every row carries its prompt; tasks are in the order their prompt first appears.
    With `prompts` (read_prompts), every row names its task's id, and tasks are in the prompts file's
    order; an outcome whose id the prompts file lacks is an error naming the id and the line, and a
    prompt no row names is left out (said so in the notes). Agents are in the order their model first
    appears. A (task, model) pair given twice is an error naming both lines; a task without a row for
    some model is an error naming it, or, with `drop_incomplete`, dropped and counted."""
    path = Path(path)
    columns = columns or LongColumns()
    header, rows = read_table(path)
    layout = _long_layout(header, columns, path, prompts)
    drop = contaminated if isinstance(contaminated, set) else read_contaminated(contaminated)
    unit = LATENCY_UNITS[layout.latency_unit]

    agents: dict[str, int] = {}
    cells = _Cells(layout.response is not None)
    dropped = 0
    if prompts is not None:
        by_id = prompts.index()
        kept_prompt = [prompt not in drop for prompt in prompts.prompts]
        task_prompts, task_groups, task_ids = prompts.prompts, prompts.groups, prompts.ids
        task_lines = [f"{prompts.path.name}:{line}" for line in prompts.lines]
    else:
        by_key: dict[tuple[str | None, str], int] = {}
        task_prompts, task_groups, task_ids, task_lines = [], [], [], []

    def number(row: dict[str, Any], column: str | None, where: str, limit: float, whole: bool = False) -> float:
        return math.nan if column is None else number_cell(row.get(column), where, column, limit, whole=whole)

    for line, row in rows:
        where = f"{path} line {line}"
        if prompts is not None:
            task_id = id_cell(row.get(layout.id), where, layout.id)
            task = by_id.get(task_id)
            if task is None:
                raise InputError(
                    f"{where} has id {task_id!r}, which the prompts file {prompts.path} does not have; every "
                    "outcome needs its prompt there (or leave the row out)."
                )
            if not kept_prompt[task]:
                dropped += 1
                continue
        else:
            prompt = text_cell(row.get(layout.prompt), where, layout.prompt)
            if prompt in drop:
                dropped += 1
                continue
            group = None
            if layout.group is not None and row.get(layout.group) not in (None, ""):
                group = str(row[layout.group])
            task = by_key.setdefault((group, prompt), len(by_key))
            if task == len(task_prompts):
                task_prompts.append(prompt)
                task_groups.append(group)
                task_ids.append(_task_id(group, prompt))
                task_lines.append(f"{path.name}:{line}")
        model = text_cell(row.get(layout.model), where, layout.model)
        agent = agents.setdefault(model, len(agents))
        numbers = (
            parse_correct(row.get(layout.correct), where, layout.correct, correct_at),
            number(row, layout.cost, where, MAX_CALL_COST_USD),
            number(row, layout.latency, where, MAX_LATENCY_MS / unit) * unit,
            number(row, layout.prompt_tokens, where, 1e12, whole=True),
            number(row, layout.completion_tokens, where, 1e12, whole=True),
        )
        cells.add(task, agent, line, numbers, None if layout.response is None else row.get(layout.response))

    names = list(agents)

    def describe(task: int) -> str:
        return f"id {task_ids[task]!r}" if prompts is not None else f"prompt {short(task_prompts[task])}"

    def where_defined(task: int) -> str:
        file, _, line = task_lines[task].rpartition(":")
        return f"line {line}" if prompts is None else f"{file} line {line}"

    matrices, where = cells.matrices(len(task_ids), names, describe, path)

    present = (where >= 0).sum(axis=1)
    incomplete = np.flatnonzero((present > 0) & (present < len(names)))
    if len(incomplete) and not drop_incomplete:
        task = int(incomplete[0])
        absent = names[int(np.flatnonzero(where[task] < 0)[0])]
        raise setting_error(
            f"{path}: {describe(task)} ({where_defined(task)}) has no row for model {absent!r}; every task needs "
            "one row per model, or pass {drop_incomplete} to leave such tasks out."
        )
    keep = np.flatnonzero(present == len(names)) if names else np.zeros(0, dtype=np.int64)
    if not len(keep):
        raise InputError(f"{path}: no task has a row for every model ({', '.join(names)}); nothing to import.")

    notes = []
    if len(incomplete):
        notes.append(f"{len(incomplete)} tasks without a row for every model were left out")
    if prompts is not None:
        unnamed = int(((present == 0) & np.asarray(kept_prompt)).sum())
        if unnamed:
            notes.append(f"{unnamed} prompts of {prompts.path.name} have no outcome rows and were left out")
    responses = None
    if cells.responses is not None:
        responses = [[cells.responses[int(k)] for k in where[task]] for task in keep]
    return Outcomes(
        task_ids=[task_ids[i] for i in keep],
        prompts=[task_prompts[i] for i in keep],
        groups=[task_groups[i] for i in keep],
        agents=names,
        rewards=matrices["reward"][keep],
        cost_usd=matrices["cost"][keep],
        latency_ms=matrices["latency_ms"][keep],
        prompt_tokens=matrices["prompt_tokens"][keep],
        completion_tokens=matrices["completion_tokens"][keep],
        responses=responses,
        sources=[task_lines[i] for i in keep],
        dataset=dataset,
        dropped_contaminated=dropped,
        dropped_incomplete=len(incomplete),
        notes=notes,
    )


def _task_id(group: str | None, prompt: str) -> str:
    digest = hashlib.sha256(f"{group or ''}\x00{prompt}".encode()).hexdigest()
    return f"{group}:{digest[:12]}" if group else digest[:16]
