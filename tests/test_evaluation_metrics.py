"""evaluation/metrics.py: the reference baselines and the evaluation table, against hand computations."""

from __future__ import annotations

import numpy as np

from benchgen_router.evaluation.metrics import baselines, evaluate_picks, format_cross_validation, format_evaluation

AGENTS = ["a", "b", "c"]
REWARDS = np.array([[1.0, 0.0, 0.5], [0.0, 1.0, 0.5], [1.0, 1.0, 0.0], [0.0, 0.0, 1.0]])


def test_baselines_are_the_reference_definitions():
    # random = mean of R; best fixed = the best column mean (a: 0.5, b: 0.5, c: 0.5 -> 0.5); oracle = mean row max
    assert baselines(REWARDS) == {"random_agent": 6 / 12, "best_fixed_agent": 0.5, "oracle": 1.0}


def test_evaluation_of_picks_and_its_table():
    evaluation = evaluate_picks(np.array([0, 1, 1, 2]), REWARDS, AGENTS)
    assert evaluation["router"] == 1.0 and evaluation["beats_best_fixed_agent"]
    assert evaluation["headroom_share"] == 1.0  # (1.0 - 0.5) / (1.0 - 0.5)
    assert evaluation["picks"] == {"a": 1, "b": 2, "c": 1} and evaluation["best_fixed_agent_id"] == "a"
    table = format_evaluation(evaluation, "test")
    assert table.splitlines()[0] == "test (4 rows)" and "headroom captured" in table and "100.0%" in table
    flat = evaluate_picks(np.array([0, 0]), np.ones((2, 3)), AGENTS)
    assert flat["headroom_share"] is None and "n/a (oracle = best fixed)" in format_evaluation(flat, "flat")


def test_cross_validation_table_shows_mean_and_spread():
    cv = {"folds": 5, "rows": 46}
    for key in ("router", "best_fixed", "random", "oracle"):
        cv[f"{key}_mean"], cv[f"{key}_std"] = 0.5, 0.125
    text = format_cross_validation(cv)
    assert text.startswith("5-fold cross-validation over 46 labelled rows") and text.count("0.5000 ± 0.1250") == 4
