"""benchgen_router.training: train() from Python, with no command line, gives what the command writes;
its configuration is the command line's (every flag's default is the library's); bad settings fail
before any work."""

from __future__ import annotations

import json
from dataclasses import fields

import numpy as np
import pytest

from benchgen_router.cli.main import build_parser
from benchgen_router.errors import InputError
from benchgen_router.training import TrainConfig, train, train_defaults
from helpers import AGENTS, cli, synthetic_rows, write_jsonl


def test_every_flag_defaults_to_the_librarys_value_and_names_a_config_field():
    parser = build_parser()[1]["train"]
    flags = {action.dest: action.default for action in parser._actions if action.dest not in ("help", "config")}
    config_fields = {item.name for item in fields(TrainConfig)}
    assert set(flags) - {"verbose"} == config_fields
    for name, default in train_defaults().items():
        assert flags[name] == default, name


def test_train_from_python_writes_what_the_command_writes(tmp_path, backbone_dir):
    rewards, tasks = synthetic_rows(14, seed=2)
    rewards_file, tasks_file = write_jsonl(tmp_path / "r.jsonl", rewards), write_jsonl(tmp_path / "t.jsonl", tasks)
    common = {"backbone": str(backbone_dir), "generations": 3, "cv_folds": 0, "no_cache": True, "no_progress": True}
    result = train(TrainConfig(rewards=str(rewards_file), tasks=str(tasks_file), output_dir=tmp_path / "lib", **common))
    argv = ["--rewards", rewards_file, "--tasks", tasks_file, "--output-dir", tmp_path / "cli"]
    argv += ["--backbone", backbone_dir, "--generations", "3", "--cv-folds", "0", "--no-cache", "--no-progress"]
    assert cli("train", *argv) == 0
    theta = np.load(tmp_path / "lib" / "head_weights.npy", allow_pickle=False)
    np.testing.assert_array_equal(theta, np.load(tmp_path / "cli" / "head_weights.npy", allow_pickle=False))
    np.testing.assert_array_equal(theta, result.head.theta)
    written = json.loads((tmp_path / "lib" / "manifest.json").read_text())
    report = result.report
    assert written["agent_order"] == AGENTS and written["test_reward"] == report.evaluation["router"]
    assert result.manifest["model_id"] == written["model_id"] == report.model_id and report.cross_validation is None
    assert report.frontier is None and report.default_operating_point is None
    assert {key: written[key] for key in report.to_dict()} == json.loads(json.dumps(report.to_dict()))


def test_bad_search_settings_fail_before_any_work(tmp_path):
    config = TrainConfig(rewards="absent.jsonl", tasks="absent.jsonl", output_dir=tmp_path / "out", shrink=1.5)
    with pytest.raises(InputError, match=r"shrink 1\.5"):
        train(config)
    assert not (tmp_path / "out").exists()


def test_settings_are_checked_in_the_library_and_named_for_python_callers(tmp_path):
    from benchgen_router.frontier import Tradeoff

    config = TrainConfig(
        rewards="r.jsonl",
        tasks="t.jsonl",
        output_dir=tmp_path / "out",
        operating_points=[("cheap", Tradeoff(1.0, 0.0))],
    )
    with pytest.raises(InputError, match="operating_points train for cost and latency: pass calls") as caught:
        train(config)
    assert "--" not in str(caught.value) and caught.value.for_command_line().startswith("--operating-point train")
    assert not (tmp_path / "out").exists()
