"""frontier/pareto.py's headline on degenerate but valid input: a pool whose calls all took 0 ms (or
cost nothing) has no saving to report against the reference, and `evaluate --calls` and `train --calls
--cv-folds` say so instead of dividing by zero."""

from __future__ import annotations

import json

import pytest

from benchgen_router.frontier.pareto import headline_text
from helpers import AGENTS, call_record, calls_row, cli, synthetic_rows, write_jsonl


def zero_latency_files(folder):
    """Rewards, tasks and calls of 14 tasks whose every call took 0 ms (a replayed or cached pool) and
    was answered correctly, so that every router point is at equal quality with the reference."""
    rewards, tasks = synthetic_rows(14, seed=3)
    calls = []
    for row in rewards:
        made = [call_record(agent, True, 1e-4 * (j + 1), 0.0) for j, agent in enumerate(AGENTS) for _ in range(3)]
        calls.append(calls_row(row["task_id"], AGENTS, made))
        row["mean_reward"] = calls[-1]["mean_reward"]
    return (
        write_jsonl(folder / "rewards.jsonl", rewards),
        write_jsonl(folder / "tasks.jsonl", tasks),
        write_jsonl(folder / "calls.jsonl", calls),
    )


def test_evaluate_calls_with_every_latency_zero(converted, tmp_path, capsys):
    folder, _ = converted[0]
    rewards, tasks, calls = zero_latency_files(tmp_path)
    out = tmp_path / "evaluation.json"
    args = ["--model", folder, "--rewards", rewards, "--tasks", tasks, "--calls", calls, "--output-json", out]
    code = cli("evaluate", "--no-progress", *map(str, args))
    err = capsys.readouterr().err
    assert code == 0, err
    stored = json.loads(out.read_text())["cost_frontier"]
    assert all(point["latency_s"] == 0 for point in stored["points"])
    best = stored["headline"]["cheapest_router_by_cost"]
    # every point is at equal quality; the latency saving is undefined against 0 s, the cost saving is not
    assert best["latency_saving"] is None and best["cost_saving"] == pytest.approx(1 - best["cost_per_1k"] / 0.1)


def test_train_calls_cv_folds_with_every_latency_zero(backbone_dir, tmp_path, capsys):
    rewards, tasks, calls = zero_latency_files(tmp_path)
    args = ["--rewards", rewards, "--tasks", tasks, "--calls", calls, "--backbone", backbone_dir]
    args += ["--output-dir", tmp_path / "out", "--cv-folds", "2", "--cv-repeats", "1", "--generations", "2"]
    code = cli("train", "--no-cache", "--no-progress", *map(str, args))
    assert code == 0, capsys.readouterr().err


@pytest.mark.parametrize("figures", [True, False])
def test_a_saving_against_nothing_is_not_a_figure(figures):
    best = {
        "name": "router lc0_ll0", "reward": 0.9, "delta_reward": 0.0, "delta_se": 0.01, "cost_per_1k": 0.1,
        "latency_s": 0.0, "cost_saving": 0.5, "latency_saving": None,
    }  # fmt: skip
    summary = {"reference": "always a", "eps": 0.01, "cheapest_router_by_cost": best}
    text = headline_text(summary, figures=figures)
    assert "router lc0_ll0" in text and "None" not in text
    if figures:
        assert "at 50% of its cost and no share of its latency (which is 0);" in text
