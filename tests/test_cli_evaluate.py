"""`benchgen-router evaluate`: a converted router checked against reward data prints the trainer's table,
whatever the column order of the rewards, and refuses rewards for another pool."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from helpers import AGENTS, cli, make_queries, run_tool, write_jsonl


@pytest.fixture(scope="module")
def trained(tmp_path_factory, backbone_dir):
    """A router trained and exported on 30 synthetic tasks (8 held out), with its data files."""
    folder = tmp_path_factory.mktemp("evaluate")
    rng = np.random.default_rng(9)
    rewards, tasks = [], []
    for i, prompt in enumerate(make_queries(30, seed=21)):
        split = "test" if i % 4 == 0 else "train"
        rewards.append(
            {
                "task_id": f"q{i}",
                "agent_order": AGENTS,
                "split": split,
                "mean_reward": [float(v) for v in rng.choice([0, 1 / 3, 2 / 3, 1], size=5)],
            }
        )
        tasks.append({"task_id": f"q{i}", "prompt": prompt, "split": split})
    files = {
        "rewards": write_jsonl(folder / "rewards.jsonl", rewards),
        "tasks": write_jsonl(folder / "tasks.jsonl", tasks),
    }
    assert (
        cli(
            "train",
            *[
                "--rewards",
                str(files["rewards"]),
                "--tasks",
                str(files["tasks"]),
                "--backbone",
                str(backbone_dir),
                "--output-dir",
                str(folder / "out"),
                "--export",
                str(folder / "router"),
                "--generations",
                "15",
                "--cv-folds",
                "0",
                "--no-cache",
                "--no-progress",
            ],
        )
        == 0
    )
    manifest = json.loads((folder / "out" / "manifest.json").read_text())
    return folder, files, manifest, rewards, tasks


def evaluate(folder: Path, rewards: Path, tasks: Path, backbone: Path, *extra: str) -> dict:
    out = folder / f"evaluation-{len(list(folder.glob('evaluation-*')))}.json"
    code = cli(
        "evaluate",
        *[
            "--model",
            str(folder / "router"),
            "--rewards",
            str(rewards),
            "--tasks",
            str(tasks),
            "--backbone",
            str(backbone),
            "--output-json",
            str(out),
            "--no-progress",
            *extra,
        ],
    )
    assert code == 0
    return json.loads(out.read_text())


def test_evaluation_of_the_export_equals_the_trainers_held_out_table(trained, backbone_dir, capsys):
    folder, files, manifest, _, _ = trained
    capsys.readouterr()
    result = evaluate(folder, files["rewards"], files["tasks"], backbone_dir, "--split", "test")
    expected = manifest["evaluation"]
    assert result["rows"] == manifest["n_test"] == 8
    assert result["picks"] == expected["picks"]
    for key in ("router", "best_fixed_agent", "random_agent", "oracle"):
        assert result[key] == pytest.approx(expected[key], abs=1e-12)
    assert result["best_fixed_agent_id"] == expected["best_fixed_agent_id"]
    printed = capsys.readouterr().out
    assert "on split 'test' (8 rows)" in printed and f"{expected['router']:.4f}" in printed


def test_every_row_by_default_and_any_column_order(trained, backbone_dir, tmp_path):
    folder, files, _, rewards, _ = trained
    everything = evaluate(folder, files["rewards"], files["tasks"], backbone_dir)
    assert everything["rows"] == 30 and sum(everything["picks"].values()) == 30
    order = [4, 2, 0, 3, 1]  # the same measurements with the pool listed in another order
    shuffled = [
        {**row, "agent_order": [AGENTS[i] for i in order], "mean_reward": [row["mean_reward"][i] for i in order]}
        for row in rewards
    ]
    again = evaluate(folder, write_jsonl(tmp_path / "shuffled.jsonl", shuffled), files["tasks"], backbone_dir)
    assert again["picks"] == everything["picks"]
    for key in ("router", "best_fixed_agent", "random_agent", "oracle", "headroom_share"):
        assert again[key] == pytest.approx(everything[key], abs=1e-12)


def test_rewards_for_another_pool_or_split_are_refused(trained, backbone_dir, tmp_path, capsys):
    folder, files, _, rewards, _ = trained
    other_pool = [{**row, "agent_order": [*AGENTS[:4], "someone_else"]} for row in rewards]
    args = ["--model", str(folder / "router"), "--tasks", str(files["tasks"]), "--backbone", str(backbone_dir)]
    capsys.readouterr()
    assert cli("evaluate", *[*args, "--rewards", str(write_jsonl(tmp_path / "other.jsonl", other_pool))]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("error: the router's pool ") and "someone_else" in line
    assert cli("evaluate", *[*args, "--rewards", str(files["rewards"]), "--split", "validation"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: no joined row has split 'validation' (splits present: ['test', 'train'])."
    )


def test_cli_prints_the_table_and_exits_0(trained, backbone_dir):
    folder, files, manifest, _, _ = trained
    result = run_tool(
        "evaluate",
        "--model",
        folder / "router",
        "--rewards",
        files["rewards"],
        "--tasks",
        files["tasks"],
        "--backbone",
        backbone_dir,
        "--split",
        "test",
        "--no-progress",
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"evaluation of {folder / 'router'} on split 'test' (8 rows)"  # stdout is the table only
    assert lines[3].split() == ["router", f"{manifest['evaluation']['router']:.4f}"]
    assert sum(int(line.split()[-1]) for line in lines if line.startswith("picks: ")) == 8
