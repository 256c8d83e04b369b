"""benchgen_router.evaluation: evaluate() from Python gives the record the command writes, and its
configuration is the command line's."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from benchgen_router.cli.main import build_parser
from benchgen_router.errors import InputError
from benchgen_router.evaluation import EvaluateConfig, evaluate
from benchgen_router.files import to_json
from helpers import cli, synthetic_rows, write_jsonl


def test_every_flag_names_a_config_field_with_the_same_default():
    parser = build_parser()[1]["evaluate"]
    flags = {action.dest: action.default for action in parser._actions if action.dest not in ("help", "verbose")}
    assert set(flags) - {"output_json"} == {item.name for item in fields(EvaluateConfig)}
    for item in fields(EvaluateConfig):
        if item.name not in ("rewards", "tasks"):
            assert flags[item.name] == item.default, item.name


@pytest.mark.slow  # the default router routes the prompts and its OOD set twice
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


def test_two_agents_get_routellms_figures_and_a_priced_pool_its_gap():
    """routing_gap on a hand-made two-agent table: RouteLLM's APGR and CPT of the logit margin,
    recomputed with RouteLLM's code written out (test_frontier_gap.routellm_literal)."""
    import numpy as np
    from test_frontier_gap import SCORES, STRONG, WEAK, routellm_literal

    from benchgen_router.costs import CostData
    from benchgen_router.evaluation import EvaluateReport, routing_gap

    rewards = np.stack([STRONG, WEAK], axis=1)  # the strong agent first: it is found by its accuracy
    logits = np.stack([SCORES, np.zeros_like(SCORES)], axis=1)
    picks = {("formatted", "a"): (SCORES < 0.5).astype(int), ("plain", "a"): np.zeros(len(SCORES), dtype=int)}
    cost = np.tile([3.0, 0.5], (len(SCORES), 1)) / 1000  # USD per call
    costs = CostData(
        ["s", "w"], [str(i) for i in range(len(SCORES))], rewards, cost, np.ones_like(cost), np.ones_like(cost)
    )
    report = EvaluateReport("t", "a", ["a"], {}, {})
    routing_gap(report, rewards, ["s", "w"], logits, picks, costs)
    two = report.gap["two_agents"]
    _, cpts, apgr = routellm_literal(SCORES, STRONG, WEAK)
    assert (two["best"], two["cheapest"]) == ("s", "w")
    assert two["policies"]["router"]["apgr"] == pytest.approx(apgr, abs=1e-12)
    assert 100 * two["policies"]["router"]["cpt_50"] == pytest.approx(cpts[1], abs=1e-9)
    assert two["policies"]["random"]["apgr"] == pytest.approx(0.5)
    pool = report.gap["pool"]
    # one operating point, at a strong share s: the curve (0, weak), (s, router), (1, strong)
    share = float((SCORES >= 0.5).mean())
    router = float(np.where(SCORES >= 0.5, STRONG, WEAK).mean())
    area = 0.5 * share * (WEAK.mean() + router) + 0.5 * (1 - share) * (router + STRONG.mean())
    assert pool["policies"]["router"]["apgr"] == pytest.approx((area - WEAK.mean()) / (STRONG.mean() - WEAK.mean()))
    assert pool["cheapest_cost"] == pytest.approx(0.5) and pool["best_cost"] == pytest.approx(3.0)
    assert len(report.gap_curves) == 2
