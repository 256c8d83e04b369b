"""benchgen_router.costs: per task and agent cost and latency from the raw calls, the pool prices,
the utility matrix, every bad input, and the facts of the real pilot data."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from benchgen_router.costs import (
    AgentPrice,
    cheapest_of_best,
    cost_data_from_calls,
    costs_for_labelled,
    load_cost_data,
    load_pool,
    pool_prices,
    utility_matrix,
)
from benchgen_router.errors import InputError
from helpers import PILOT, call_record

AGENTS = ["big", "small"]
POOL = [
    {"agent_id": "big", "price_per_1m_prompt_usd": 1.0, "price_per_1m_output_usd": 4.0},
    {"agent_id": "small", "price_per_1m_prompt_usd": 0.1, "price_per_1m_output_usd": 0.2},
]
needs_pilot = pytest.mark.skipif(
    not (PILOT / "rewards.v1-pilot.jsonl").exists(), reason=f"real pilot data not found at {PILOT} (CI has it)"
)


def call(agent: str, correct: bool, cost: float, latency_ms: float) -> dict:
    return call_record(agent, correct, cost, latency_ms, prompt_tokens=100, completion_tokens=50)


def raw_rows() -> list[dict]:
    """Two tasks, two calls per agent: big is right on both tasks, small on t1 once."""
    return [
        {
            "task_id": "t0",
            "agent_order": AGENTS,
            "mean_reward": [1.0, 0.5],
            "calls": [
                call("big", True, 0.002, 1000),
                call("big", True, 0.004, 3000),
                call("small", True, 0.0001, 200),
                call("small", False, 0.0003, 400),
            ],
        },
        {
            "task_id": "t1",
            "agent_order": AGENTS,
            "mean_reward": [1.0, 0.0],
            "calls": [
                call("big", True, 0.001, 2000),
                call("big", True, 0.001, 2000),
                call("small", False, 0.0, 100),
                call("small", False, 0.0002, 300),
            ],
        },
    ]


def from_rows(rows: list[dict], prices=None):
    rewards = np.array([row["mean_reward"] for row in rows])
    return cost_data_from_calls(AGENTS, [row["task_id"] for row in rows], rewards, rows, prices)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def test_means_per_task_and_agent_in_the_documented_units():
    data = from_rows(raw_rows())
    np.testing.assert_allclose(data.cost_usd, [[0.003, 0.0002], [0.001, 0.0001]])
    np.testing.assert_allclose(data.cost_per_1k, [[3.0, 0.2], [1.0, 0.1]])  # USD per 1,000 queries
    np.testing.assert_allclose(data.latency_s, [[2.0, 0.3], [2.0, 0.2]])
    np.testing.assert_array_equal(data.calls, [[2, 2], [2, 2]])
    assert data.zero_cost_calls == 1 and data.estimated_calls == 0
    summary = data.summary()
    assert summary["agents"]["big"]["tied_best_rows"] == 2 and summary["agents"]["small"]["tied_best_rows"] == 0
    assert summary["oracle_cheapest_of_best"]["reward"] == 1.0


def test_utility_is_reward_minus_weighted_cost_and_latency_and_the_same_array_at_zero():
    data = from_rows(raw_rows())
    assert data.utility(0, 0) is data.rewards  # the search sees exactly R
    expected = data.rewards - 0.5 * data.cost_per_1k - 0.1 * data.latency_s
    np.testing.assert_allclose(data.utility(0.5, 0.1), expected)
    with pytest.raises(InputError, match="cost weight -1 must be a number from 0 to 1e\\+06"):
        utility_matrix(data.rewards, data.cost_per_1k, data.latency_s, -1, 0)
    with pytest.raises(InputError, match="latency weight nan"):
        utility_matrix(data.rewards, data.cost_per_1k, data.latency_s, 0, math.nan)


def test_cheapest_of_best_breaks_reward_ties_by_cost():
    rewards = np.array([[1.0, 1.0, 0.0], [0.5, 1.0, 1.0], [0.0, 0.0, 0.0]])
    cost = np.array([[3.0, 1.0, 0.1], [0.1, 2.0, 1.0], [1.0, 0.5, 2.0]])
    np.testing.assert_array_equal(cheapest_of_best(rewards, cost), [1, 2, 1])


def test_pool_fills_a_missing_cost_from_the_token_counts_and_keeps_billed_costs():
    rows = raw_rows()
    rows[0]["calls"][0].pop("cost_usd")  # big: 100 prompt, 50 completion tokens
    data = from_rows(rows, pool_prices(POOL, AGENTS))
    estimate = (100 * 1.0 + 50 * 4.0) / 1e6
    assert data.estimated_calls == 1
    assert data.cost_usd[0, 0] == pytest.approx((estimate + 0.004) / 2)
    assert data.cost_usd[1, 0] == pytest.approx(0.001)  # billed costs stay as billed
    assert AgentPrice(1.0, 4.0).cost_usd(100, 50) == pytest.approx(estimate)


def test_raw_rows_outside_the_labelled_set_are_ignored_and_noted():
    rows = raw_rows()
    data = cost_data_from_calls(AGENTS, ["t1"], np.array([[1.0, 0.0]]), rows)
    assert data.task_ids == ["t1"] and len(data) == 1
    assert any("1 rows of the calls file are not labelled tasks" in note for note in data.notes)


def test_files_published_rows_joined_to_raw_calls_and_raw_alone(tmp_path):
    calls = write_jsonl(tmp_path / "raw.jsonl", raw_rows())
    published = write_jsonl(tmp_path / "rewards.jsonl", [{k: v for k, v in raw_rows()[1].items() if k != "calls"}])
    (tmp_path / "agents.json").write_text(json.dumps(POOL))
    joined = load_cost_data(calls, published, tmp_path / "agents.json")
    alone = load_cost_data(calls)
    assert joined.task_ids == ["t1"] and alone.task_ids == ["t0", "t1"]
    np.testing.assert_array_equal(joined.cost_usd, alone.cost_usd[1:])

    class Labelled:  # the fields of training.LabelledData that costs_for_labelled reads
        agents, task_ids, rewards = AGENTS, ["t1", "t0"], np.array([[1.0, 0.0], [1.0, 0.5]])

    aligned = costs_for_labelled(Labelled, calls)
    assert aligned.task_ids == ["t1", "t0"]  # the labelled order, so embeddings line up
    np.testing.assert_array_equal(aligned.latency_s, alone.latency_s[::-1])


def test_subset_keeps_rows_aligned():
    data = from_rows(raw_rows())
    part = data.subset(np.array([False, True]))
    assert part.task_ids == ["t1"]
    np.testing.assert_array_equal(part.cost_usd, data.cost_usd[1:])
    np.testing.assert_array_equal(data.subset(np.array([1, 0])).rewards, data.rewards[::-1])


def _edit(change) -> list[dict]:
    rows = raw_rows()
    change(rows)
    return rows


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda r: r[0]["calls"][1].update(cost_usd=-0.001),
            "has cost_usd -0.001; a billed cost must be a number from 0 to 10000 USD per call",
        ),
        (lambda r: r[0]["calls"][1].update(cost_usd=math.nan), "has cost_usd nan"),
        (lambda r: r[0]["calls"][1].update(cost_usd="0.1"), "has cost_usd '0.1'"),
        (lambda r: r[0]["calls"][1].pop("cost_usd"), "has no cost_usd; pass the pool file"),
        (lambda r: r[0]["calls"][1].update(cost_usd=None), "has no cost_usd; pass the pool file"),
        (
            lambda r: r[0]["calls"][1].update(cost_usd=1e308),
            "has cost_usd 1e\\+308; a billed cost must be a number from 0",
        ),
        (lambda r: r[1]["calls"][0].update(latency_ms=-5), "has latency_ms -5; latency must be a number from 0"),
        (lambda r: r[1]["calls"][0].update(latency_ms=1e300), "has latency_ms 1e\\+300"),
        (lambda r: r[1]["calls"][0].pop("latency_ms"), "has latency_ms None"),
        (lambda r: r[1]["calls"][0].update(agent="stranger"), "is by agent 'stranger', which is not in agent_order"),
        (lambda r: r[1]["calls"].__delitem__(slice(2, 4)), r"has no calls by \['small'\]"),
        (lambda r: r[1].update(calls=[]), "has no calls list"),
        (lambda r: r[1]["calls"].__setitem__(0, "x"), "is not a JSON object"),
        (lambda r: r.pop(1), "1 labelled tasks have no row in the calls file"),
        (lambda r: r.append(dict(r[0])), "repeats task_id 't0'"),
        (lambda r: r[0]["calls"][3].update(correct=True), r"labelled rewards \[1.0, 0.5\] differ from its calls"),
    ],
)
def test_bad_calls_get_one_line_naming_the_problem(change, message):
    rows = _edit(change)
    labelled = raw_rows()  # the labels as they were: only the calls are damaged
    rewards = np.array([row["mean_reward"] for row in labelled])
    with pytest.raises(InputError, match=message) as caught:
        cost_data_from_calls(AGENTS, [row["task_id"] for row in labelled], rewards, rows)
    assert "\n" not in str(caught.value)


def test_a_missing_cost_without_token_counts_cannot_be_estimated():
    rows = _edit(lambda r: (r[0]["calls"][0].pop("cost_usd"), r[0]["calls"][0].pop("prompt_tokens")))
    with pytest.raises(InputError, match="has no cost_usd and token counts None/50"):
        from_rows(rows, pool_prices(POOL, AGENTS))


@pytest.mark.parametrize(
    ("pool", "message"),
    [
        (POOL[:1], r"do not match agent_order \['big', 'small'\] \(missing: \['small'\], not in agent_order: none\)"),
        (
            [*POOL, {**POOL[0], "agent_id": "extra"}],
            r"\(missing: none, not in agent_order: \['extra'\]\)",
        ),
        ([POOL[0], POOL[0]], "lists agent 'big' twice"),
        ([POOL[0], {**POOL[1], "price_per_1m_output_usd": -1}], "has price_per_1m_output_usd -1; prices must be"),
        ([POOL[0], {**POOL[1], "price_per_1m_output_usd": 1e308}], "prices must be numbers from 0 to 1e\\+06"),
        ([POOL[0], {**POOL[1], "price_per_1m_prompt_usd": None}], "has price_per_1m_prompt_usd None"),
        ([POOL[0], {"price_per_1m_prompt_usd": 1}], "entry 2 has no agent_id"),
        ({"big": 1}, "must be a JSON list of agent objects"),
    ],
)
def test_bad_pool_gets_one_line(pool, message):
    with pytest.raises(InputError, match=message) as caught:
        pool_prices(pool, AGENTS)
    assert "\n" not in str(caught.value)


def test_bad_pool_and_reward_files(tmp_path):
    with pytest.raises(InputError, match="pool file not found"):
        load_pool(tmp_path / "missing.json", AGENTS)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(InputError, match="is not valid JSON"):
        load_pool(tmp_path / "bad.json", AGENTS)
    rows = raw_rows()
    rows[1]["agent_order"] = AGENTS[::-1]
    with pytest.raises(InputError, match=r"has agent_order .* but earlier rows have"):
        load_cost_data(write_jsonl(tmp_path / "order.jsonl", rows))
    rows = raw_rows()
    rows[1]["mean_reward"] = [1.5, 0.0]
    with pytest.raises(InputError, match="mean_reward must be 2 numbers in \\[0, 1\\]"):
        load_cost_data(write_jsonl(tmp_path / "range.jsonl", rows))
    write_jsonl(tmp_path / "empty.jsonl", [])
    with pytest.raises(InputError, match="has no rows"):
        load_cost_data(tmp_path / "empty.jsonl")


# ---------------------------------------------------------------------------------------------
# The real pilot data


def _independent_means(task_ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Mean cost (USD) and latency (s) per task and agent, straight from the JSON."""
    raw = {row["task_id"]: row for row in map(json.loads, (PILOT / "rewards.v1-pilot.jsonl").open())}
    agents = raw[task_ids[0]]["agent_order"]
    cost = [[np.mean([c["cost_usd"] for c in raw[t]["calls"] if c["agent"] == a]) for a in agents] for t in task_ids]
    latency = [
        [np.mean([c["latency_ms"] for c in raw[t]["calls"] if c["agent"] == a]) / 1000 for a in agents]
        for t in task_ids
    ]
    return np.array(cost), np.array(latency)


@needs_pilot
def test_pilot_published_rows_joined_to_the_raw_calls():
    data = load_cost_data(PILOT / "rewards.v1-pilot.jsonl", PILOT / "rewards.jsonl", PILOT / "agents.json")
    assert len(data) == 46 and data.estimated_calls == 0 and data.zero_cost_calls == 2
    assert (data.calls == 3).all()
    cost, latency = _independent_means(data.task_ids)
    np.testing.assert_allclose(data.cost_usd, cost, rtol=1e-12)
    np.testing.assert_allclose(data.latency_s, latency, rtol=1e-12)
    assert any("14 rows" in note for note in data.notes)  # the rlpr tasks, not in the release
    # the figures docs/cost-frontier.md quotes
    summary = data.summary()
    best, cheap = summary["agents"]["frontier_a"], summary["agents"]["open_cheap_reasoning"]
    assert best["tied_best_rows"] == 44
    assert best["reward"] == pytest.approx(0.884, abs=5e-4) and cheap["reward"] == pytest.approx(0.855, abs=5e-4)
    assert best["cost_per_1k_usd"] == pytest.approx(0.1147, abs=1e-4) and best["latency_s"] == pytest.approx(
        21.0, abs=0.05
    )
    assert cheap["cost_per_1k_usd"] == pytest.approx(0.0643, abs=1e-4) and cheap["latency_s"] == pytest.approx(
        3.85, abs=0.01
    )
    oracle = summary["oracle_cheapest_of_best"]
    assert oracle["reward"] == pytest.approx(0.920, abs=5e-4) and oracle["cost_per_1k_usd"] == pytest.approx(
        0.0626, abs=1e-4
    )


@needs_pilot
def test_pilot_raw_file_alone_has_all_60_tasks_including_rlpr():
    data = load_cost_data(PILOT / "rewards.v1-pilot.jsonl")
    assert len(data) == 60 and sum(t.startswith("rlpr/") for t in data.task_ids) == 14
    published = load_cost_data(PILOT / "rewards.v1-pilot.jsonl", PILOT / "rewards.jsonl")
    index = [data.task_ids.index(t) for t in published.task_ids]
    np.testing.assert_array_equal(data.rewards[index], published.rewards)
    np.testing.assert_array_equal(data.cost_usd[index], published.cost_usd)
