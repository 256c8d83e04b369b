"""importing/writing.py and importing/pricing.py: imported outcomes written as the files train and evaluate
read (read back with the training readers), and each call's cost: a cost column, the pool's prices, a fixed
cost per call, or 1 per call."""

from __future__ import annotations

import numpy as np
import pytest
from test_importing_long import llmrouter_rows, read_jsonl, write_csv, write_jsonl

from benchgen_router.costs import load_cost_data
from benchgen_router.data import join_rewards, load_rows
from benchgen_router.errors import InputError
from benchgen_router.importing import read_long_outcomes, with_call_costs, with_prices, write_outcomes


def test_written_files_are_read_back_by_the_training_readers(tmp_path):
    rows = llmrouter_rows()
    for row in rows:
        row["cost_usd"] = 0.001 * row["output_tokens"]
    outcomes = read_long_outcomes(write_jsonl(tmp_path / "routing.jsonl", rows), dataset="demo")
    written = write_outcomes(outcomes, tmp_path / "out")
    assert [path.name for path in written.paths] == ["tasks.jsonl", "rewards.jsonl", "calls.jsonl"]
    data = join_rewards(
        load_rows(str(tmp_path / "out" / "rewards.jsonl"), "rewards"),
        load_rows(str(tmp_path / "out" / "tasks.jsonl"), "tasks"),
        min_rows=1,
    )
    assert data.task_ids == outcomes.task_ids and data.prompts == outcomes.prompts
    np.testing.assert_array_equal(data.rewards, outcomes.rewards)
    costs = load_cost_data(tmp_path / "out" / "calls.jsonl", tmp_path / "out" / "rewards.jsonl")
    np.testing.assert_allclose(costs.cost_usd, [[0.010, 0.011], [0.010, 0.011]])
    np.testing.assert_allclose(costs.latency_s, [[1.5, 2.5], [1.5, 2.5]])
    rewards = read_jsonl(tmp_path / "out" / "rewards.jsonl")
    assert [row["task_group"] for row in rewards] == ["gsm8k", "mmlu"] and rewards[0]["dataset"] == "demo"
    assert rewards[0]["best_agents"] == ["llama3-70b-instruct"] and rewards[0]["repetitions"] == 1
    assert written.cost_unit == "usd" and not any("cost counts calls" in note for note in written.notes)


def test_without_costs_or_a_pool_each_call_costs_one(tmp_path):
    path = write_csv(tmp_path / "plain.csv", ["prompt", "model", "correct"], [["q", "a", 1], ["q", "b", 0]])
    written = write_outcomes(read_long_outcomes(path), tmp_path / "out")
    calls = read_jsonl(tmp_path / "out" / "calls.jsonl")[0]["calls"]
    assert [call["cost_usd"] for call in calls] == [1.0, 1.0] and written.cost_unit == "calls"
    assert [call["latency_ms"] for call in calls] == [0.0, 0.0]
    assert any("cost counts calls" in note for note in written.notes)
    assert any("latency_ms is written as 0" in note for note in written.notes)


def test_a_pool_without_tokens_to_price_is_refused(tmp_path):
    outcomes = read_long_outcomes(
        write_csv(tmp_path / "plain.csv", ["prompt", "model", "correct"], [["q", "a", 1], ["q", "b", 0]])
    )
    prices = {"a": None, "b": None}
    with pytest.raises(InputError, match=r"model 'a' has no cost and no token counts to price"):
        with_prices(outcomes, prices)


def test_partly_known_costs_are_refused_before_anything_is_written(tmp_path):
    path = write_csv(
        tmp_path / "part.csv", ["prompt", "model", "correct", "cost"], [["q", "a", 1, 0.1], ["q", "b", 0, ""]]
    )
    out = tmp_path / "out"
    out.mkdir()
    (out / "rewards.jsonl").write_text("previous\n")
    with pytest.raises(InputError, match=r"model 'b' has no cost while other calls have one"):
        write_outcomes(read_long_outcomes(path), out)
    assert sorted(p.name for p in out.iterdir()) == ["rewards.jsonl"]
    assert (out / "rewards.jsonl").read_text() == "previous\n"


def test_fixed_costs_per_call_fill_unknown_costs_and_keep_known_ones(tmp_path):
    path = write_csv(
        tmp_path / "mixed.csv",
        ["prompt", "model", "correct", "cost"],
        [["q1", "weak", 1, ""], ["q1", "strong", 1, ""], ["q2", "weak", 0, 0.5], ["q2", "strong", 1, ""]],
    )
    outcomes = with_call_costs(read_long_outcomes(path), {"strong": 1.0, "weak": 0.0}, unit="calls")
    assert outcomes.cost_usd.tolist() == [[0.0, 1.0], [0.5, 1.0]] and outcomes.cost_unit == "calls"
    with pytest.raises(InputError, match=r"call_cost must name every agent .*missing: \['strong'\]"):
        with_call_costs(read_long_outcomes(path), {"weak": 0.0})
    with pytest.raises(InputError, match=r"call_cost of 'weak' is -1"):
        with_call_costs(read_long_outcomes(path), {"weak": -1, "strong": 1.0})


def test_an_output_that_cannot_be_written_leaves_no_temporary_file(tmp_path):
    path = write_csv(tmp_path / "plain.csv", ["prompt", "model", "correct"], [["q", "a", 1], ["q", "b", 0]])
    out = tmp_path / "out"
    (out / "calls.jsonl").mkdir(parents=True)  # the third file's path is a folder
    with pytest.raises(InputError, match=r"output .*calls.jsonl is a folder"):
        write_outcomes(read_long_outcomes(path), out)
    assert [p.name for p in out.iterdir()] == ["calls.jsonl"]
