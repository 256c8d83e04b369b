"""bench/value/run.py: every router on the same folds of a matrix whose best routing is known, the references
beside them, and the two-agent figures of RouteLLM for a pool of two."""

from __future__ import annotations

import numpy as np
import pytest

from benchgen_router.bench.value import OutcomeMatrix, ValueConfig, run_value_benchmark
from benchgen_router.bench.value.report import format_result, result_to_dict
from benchgen_router.errors import InputError

AGENTS = ["cheap", "mid", "best"]
PRICES = np.array([0.1, 0.5, 2.0])  # per 1,000 queries


def known_matrix(rows: int = 360, seed: int = 0) -> tuple[OutcomeMatrix, np.ndarray]:
    """(matrix, embeddings): the cheap agent answers every question of group g0 and few others, the best
    agent nearly all, the mid one half; the embedding tells the group (one-hot) under noise."""
    rng = np.random.default_rng(seed)
    group = np.arange(rows) % 3
    rewards = np.stack(
        [
            np.where(group == 0, 1.0, rng.random(rows) < 0.2),
            rng.random(rows) < 0.5,
            rng.random(rows) < 0.9,
        ],
        axis=1,
    ).astype(float)
    embeddings = np.eye(3)[group] + rng.normal(0, 0.2, (rows, 3))
    embeddings = np.hstack([embeddings, rng.normal(0, 1, (rows, 5))]).astype(np.float32)
    matrix = OutcomeMatrix(
        "known",
        AGENTS,
        [f"t{i}" for i in range(rows)],
        [f"question {i}" for i in range(rows)],
        [f"g{g}" for g in group],
        rewards,
        np.tile(PRICES, (rows, 1)) * (1 + 0.1 * rng.random((rows, 3))),
    )
    return matrix, embeddings


@pytest.fixture(scope="module")
def result():
    matrix, embeddings = known_matrix()
    config = ValueConfig(folds=3, repeats=2, group_folds=3, search={"generations": 4}, progress=False)
    return run_value_benchmark(matrix, config, lambda prompts: embeddings)


def test_folds_partition_the_rows_and_every_router_runs_on_each(result):
    kfold = [fold for fold in result.folds if fold.kind == "k-fold"]
    groups = [fold for fold in result.folds if fold.kind == "groups-out"]
    assert len(kfold) == 6 and len(groups) == 3
    for repeat in (0, 1):
        assert sum(fold.rows for fold in kfold if fold.repeat == repeat) == 360
    expected = {f"{name}/{rule}" for name in ("probability", "mf", "knn", "lookup") for rule in ("lambda", "tolerance")}
    for fold in kfold:
        assert expected | {"cmaes", "zero router", "oracle"} == set(fold.curves)
        assert fold.reference == "best"
    for fold in groups:  # a held-out group has no row to look up: the lookup sits these folds out, and says so
        assert "lookup/lambda" not in fold.curves and "nothing to look up" in fold.notes["lookup"]


def test_routers_that_see_the_group_reach_the_best_models_accuracy_for_less(result):
    """The cheap agent answers all of g0 (a third of the rows): sending g0 to it and the rest to the best
    agent keeps the best agent's accuracy at about two thirds of its cost; the oracle needs far less."""
    for fold in (fold for fold in result.folds if fold.kind == "k-fold"):
        zero, oracle = fold.figures["zero router"], fold.figures["oracle"]
        assert zero.share == pytest.approx(1.0)  # only the reference itself reaches its accuracy
        for name in ("probability/lambda", "lookup/lambda", "lookup/tolerance"):
            assert fold.figures[name].share is not None and fold.figures[name].share < 0.85, name
            assert fold.figures[name].aiq > zero.aiq
        assert oracle.share < fold.figures["probability/lambda"].share
        assert oracle.best > max(accuracy for _, accuracy in fold.singles.values())
        assert fold.window[0] == 0.0 and fold.window[1] >= fold.reference_point[0] * 0.99


def test_the_report_and_json_carry_every_curve(result):
    tables = format_result(result)
    assert "| probability head, lambda swept |" in tables and "| per-category lookup, tolerance swept |" in tables
    assert "nothing to look up" in tables and "usd-per-1k" in tables and "`tolerance=T`" in tables
    record = result_to_dict(result)
    assert set(record["summary"]) == {"k-fold", "groups-out"}
    assert record["summary"]["k-fold"]["curves"]["probability/lambda"]["folds"] == 6
    budgets = record["folds"][0]["budgets"]
    assert [row["share"] for row in budgets] == list(ValueConfig().budgets)
    assert all(row["spent"] > 0 for row in budgets)


def test_a_pool_of_two_gets_routellms_figures():
    matrix, embeddings = known_matrix(240, seed=1)
    two = OutcomeMatrix(
        "two", ["cheap", "best"], matrix.task_ids, matrix.prompts, matrix.groups,
        matrix.rewards[:, [0, 2]], matrix.cost_per_1k[:, [0, 2]],
    )  # fmt: skip
    config = ValueConfig(folds=3, repeats=1, group_folds=0, routers=("probability", "knn"), progress=False)
    result = run_value_benchmark(two, config, lambda prompts: embeddings)
    for fold in result.folds:
        figures = fold.gap["figures"]
        assert set(figures) == {"probability", "knn", "oracle", "random"}
        assert 0.45 < figures["random"]["apgr"] < 0.55  # RouteLLM's random router: about 0.5
        assert figures["probability"]["apgr"] > figures["random"]["apgr"]
        assert figures["oracle"]["apgr"] >= figures["probability"]["apgr"]
    assert "RouteLLM's figures" in format_result(result)


def test_bad_settings_are_one_line():
    matrix, embeddings = known_matrix(60)
    with pytest.raises(InputError, match="unknown router 'svm'"):
        run_value_benchmark(matrix, ValueConfig(routers=("svm",), progress=False), lambda p: embeddings)
    ungrouped = OutcomeMatrix(
        "x", AGENTS, matrix.task_ids, matrix.prompts, [None] * 60, matrix.rewards, matrix.cost_per_1k
    )
    with pytest.raises(InputError, match="group_folds=0"):
        run_value_benchmark(ungrouped, ValueConfig(progress=False), lambda p: embeddings)
    with pytest.raises(InputError, match="nothing to run: pass repeats >= 1"):
        run_value_benchmark(matrix, ValueConfig(repeats=0, group_folds=0, progress=False), lambda p: embeddings)


def test_no_repeats_runs_the_groups_out_folds_alone():
    """repeats=0: only the leave-groups-out folds run (a router too slow for both), and the report is theirs."""
    matrix, embeddings = known_matrix(120)
    config = ValueConfig(repeats=0, group_folds=3, routers=("probability",), progress=False)
    result = run_value_benchmark(matrix, config, lambda prompts: embeddings)
    assert [fold.kind for fold in result.folds] == ["groups-out"] * 3
    assert sum(fold.rows for fold in result.folds) == 120
    assert set(result_to_dict(result)["summary"]) == {"groups-out"}
    tables = format_result(result)
    assert "k-fold" not in tables and "### Single models (groups-out folds, held out)" in tables


def test_a_stored_result_renders_the_same_tables_and_its_curves(result, tmp_path):
    """value.json is enough to render the tables and the curves again, without running the folds."""
    import json

    from benchgen_router.bench.value.report import plot_result, result_from_dict

    stored = json.loads(json.dumps(result_to_dict(result)))
    again = result_from_dict(stored)
    assert format_result(again) == format_result(result)
    plot_result(again, tmp_path / "value.png")
    assert (tmp_path / "value.png").read_bytes()[:4] == b"\x89PNG"
