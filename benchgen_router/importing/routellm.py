"""RouteLLM's response CSVs (lm-sys/RouteLLM, routellm/evals): a `prompt` column and one True/False column
per model; `<model>_response` columns are the models' answers. Several files at once (MMLU's 57 subject
files): a file's stem becomes its tasks' group, so a split can leave whole subjects out.

A task id is `<file stem>:<row>`, its 1-based data row in the file before decontamination: MMLU repeats
105 prompts (some across subjects, with other outcomes), so a hash of the prompt would merge tasks that
the data keeps apart, and numbering before the drop keeps every other id the same when the
contamination list changes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from benchgen_router.errors import InputError
from benchgen_router.importing.outcomes import Outcomes
from benchgen_router.importing.tables import parse_correct, read_jsonl_table, read_table, refuse_pickle, text_cell

RESPONSE_SUFFIX = "_response"  # RouteLLM: `<model>_response` holds that model's answer


def read_contaminated(paths: Iterable[str | os.PathLike]) -> set[str]:
    """The prompts of RouteLLM's contamination lists (JSON lines with `eval_prompt`)."""
    prompts: set[str] = set()
    for path in map(Path, paths):
        refuse_pickle(path)
        _, rows = read_jsonl_table(path, "one JSON object with an eval_prompt per line")
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
            prompt = text_cell(row["prompt"], where, "prompt")
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
