"""LiteLLM's shipped complexity classifier scored on the routing-value benchmark's own folds and metrics."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchgen_router.bench import litellm_autorouter as la
from benchgen_router.bench.value import ValueConfig, run_value_benchmark
from benchgen_router.bench.value import metrics as vm
from benchgen_router.bench.value.data import OutcomeMatrix
from benchgen_router.errors import InputError


def test_the_classifier_is_litellms_as_shipped():
    classified = la.classify(
        [
            "Hello!",
            "Think step by step and explain your reasoning: analyze the pros and cons of our database schema.",
            "Design a distributed microservice architecture on kubernetes",
            "Design a distributed microservice architecture on kubernetes with low latency and encryption",
        ]
    )
    assert classified.tiers.tolist() == ["SIMPLE", "REASONING", "MEDIUM", "COMPLEX"]
    # the shipped boundaries: SIMPLE below 0.15, MEDIUM below 0.35, COMPLEX below 0.60
    assert classified.scores[0] < 0.15 <= classified.scores[2] < 0.35 <= classified.scores[3] < 0.6


def test_tiers_go_to_the_top_agent_and_the_next_one_down_the_frontier():
    rewards = np.array([[0.4, 0.66, 0.72, 0.5, 0.3]] * 4)
    cost = np.array([[0.02, 0.04, 0.5, 0.3, 0.01]] * 4)  # agent 3 is dominated by agent 1
    layout = la.tier_agents(rewards, cost)
    assert layout == {"SIMPLE": 1, "MEDIUM": 1, "COMPLEX": 2, "REASONING": 2}
    two = la.tier_agents(np.array([[0.8, 0.6]] * 2), np.array([[1.0, 0.0]] * 2))
    assert two == {"SIMPLE": 1, "MEDIUM": 1, "COMPLEX": 0, "REASONING": 0}


def test_the_sweep_goes_from_every_query_on_top_to_none():
    picks = la.swept_picks(np.array([0.3, -0.1, 0.3, 0.0]), low=0, high=1)
    assert [p.tolist() for p in picks] == [[1, 1, 1, 1], [1, 0, 1, 1], [1, 0, 1, 0], [0, 0, 0, 0]]


def matrix(rows: int = 150, seed: int = 0) -> OutcomeMatrix:
    rng = np.random.default_rng(seed)
    easy = rng.random(rows) < 0.5
    prompts = [
        ("Hello, what is " if e else "Think step by step about the api of ") + str(i) for i, e in enumerate(easy)
    ]
    strong = (rng.random(rows) < 0.85).astype(float)
    weak = np.where(easy, strong, (rng.random(rows) < 0.3).astype(float))
    rewards = np.stack([weak, strong], axis=1)
    cost = np.tile([0.0, 1000.0], (rows, 1))
    return OutcomeMatrix(
        "toy", ["weak", "strong"], [f"t{i}" for i in range(rows)], prompts, [None] * rows, rewards, cost
    )


def embed(prompts: list[str]) -> np.ndarray:
    """The prompts' words as counts: enough for the probability head to see which kind a prompt is."""
    return np.array([[p.startswith("Hello"), p.startswith("Think"), 1.0] for p in prompts], dtype=np.float32)


@pytest.fixture(scope="module")
def compared():
    data = matrix()
    config = ValueConfig(folds=5, repeats=2, group_folds=0, routers=("probability",), progress=False)
    result = run_value_benchmark(data, config, embed=embed)
    classified = la.classify(data.prompts)
    return data, result, classified, la.compare(data, result, classified)


def test_litellms_curves_are_on_the_benchmarks_held_out_rows(compared):
    data, result, classified, comparisons = compared
    assert len(comparisons) == 10
    tests = la.held_out_rows(result, len(data))
    for comparison, fold, test in zip(comparisons, result.folds, tests, strict=True):
        assert comparison.rows == fold.rows == test.sum()
        picks = np.where(np.isin(classified.tiers[test], ["SIMPLE", "MEDIUM"]), 0, 1)
        expected = vm.points_of_picks(picks, data.rewards[test], data.cost_per_1k[test])
        assert comparison.curves[la.SHIPPED] == [expected]
        assert comparison.curves["probability/lambda"] == fold.curves["probability/lambda"]
        assert comparison.curves[la.SWEPT][0][0] == 1000.0 and comparison.curves[la.SWEPT][-1][0] == 0.0
        assert comparison.layout == {"SIMPLE": "weak", "MEDIUM": "weak", "COMPLEX": "strong", "REASONING": "strong"}
        gap = comparison.gap
        assert gap["probability head, margin swept"] == fold.gap["figures"]["probability"]
        assert 0 <= gap[la.SWEPT]["apgr"] <= 1.5 and gap[la.SHIPPED]["apgr"] == pytest.approx(
            vm_apgr_of_point(comparison, data, test), abs=1e-9
        )


def vm_apgr_of_point(comparison, data, test) -> float:
    """APGR of the shipped point joined to always-weak and always-strong, computed here from its definition."""
    from benchgen_router.frontier import gap as gp

    cost, accuracy = comparison.curves[la.SHIPPED][0]
    pool = gp.PoolGap.of(data.rewards[test], data.cost_per_1k[test], ["0", "1"])
    return pool.figures(pool.curve_of_points("x", [cost], [accuracy])).area


def test_the_summary_the_table_and_the_json(compared, tmp_path):
    _, result, _, comparisons = compared
    table = la.summary(comparisons)
    assert table["curves"][la.SHIPPED]["folds"] == 10 and set(table["tier_shares"]) == set(la.TIERS)
    text = la.format_comparison("toy", result, comparisons)
    assert "| LiteLLM classifier, score swept |" in text and "| probability head, margin swept |" in text
    record = json.loads(json.dumps(la.comparison_to_dict("toy", result, comparisons)))
    assert len(record["folds"]) == 10 and record["folds"][0]["layout"]["SIMPLE"] == "weak"
    la.plot_comparisons([("toy", "strong calls per 1,000 queries", comparisons)], tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_a_result_from_other_folds_is_refused(compared):
    data, result, classified, _ = compared
    with pytest.raises(InputError, match="not this matrix's"):
        la.compare(data.rows(np.arange(100)), result, classified)
