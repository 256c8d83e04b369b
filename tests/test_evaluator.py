"""benchgen_router.evaluator: evaluate() from Python gives the record the command writes, and its
configuration is the command line's."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from benchgen_router.cli.main import build_parser
from benchgen_router.errors import InputError
from benchgen_router.evaluator import EvaluateConfig, evaluate
from benchgen_router.files import to_json
from helpers import cli, synthetic_rows, write_jsonl


def test_every_flag_names_a_config_field_with_the_same_default():
    parser = build_parser()[1]["evaluate"]
    flags = {action.dest: action.default for action in parser._actions if action.dest not in ("help", "verbose")}
    assert set(flags) - {"output_json"} == {item.name for item in fields(EvaluateConfig)}
    for item in fields(EvaluateConfig):
        if item.name not in ("rewards", "tasks"):
            assert flags[item.name] == item.default, item.name


def test_evaluate_from_python_is_what_the_command_writes(tmp_path):
    rewards, tasks = synthetic_rows(12, seed=6)
    rewards_file, tasks_file = write_jsonl(tmp_path / "r.jsonl", rewards), write_jsonl(tmp_path / "t.jsonl", tasks)
    report = evaluate(EvaluateConfig(rewards=str(rewards_file), tasks=str(tasks_file), no_progress=True))
    assert set(report.by_form) == {"formatted", "plain"} and report.primary in report.points
    assert report.guard is not None and report.frontier is None  # the default router is guarded; no calls given
    out = tmp_path / "evaluation.json"
    argv = ["--rewards", rewards_file, "--tasks", tasks_file, "--output-json", out, "--no-progress"]
    assert cli("evaluate", *argv) == 0
    config = EvaluateConfig(rewards=str(rewards_file), tasks=str(tasks_file), no_progress=True)
    assert json.loads(out.read_text()) == json.loads(to_json(report.record(config)))


def test_a_split_with_no_rows_is_one_line(tmp_path):
    rewards, tasks = synthetic_rows(12, seed=6)
    config = EvaluateConfig(
        rewards=str(write_jsonl(tmp_path / "r.jsonl", rewards)),
        tasks=str(write_jsonl(tmp_path / "t.jsonl", tasks)),
        split="nowhere",
    )
    with pytest.raises(InputError, match="no joined row has split 'nowhere'"):
        evaluate(config)
