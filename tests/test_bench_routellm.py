"""benchgen_router.bench.routellm and scripts/routellm_benchmark.py: a small slice of RouteLLM's MMLU and
GSM8K outcomes through every router kind on the same folds, with a tiny random backbone."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from benchgen_router.bench import routellm as rb
from helpers import SHARED, build_backbone, build_tokenizer, run_tool

ROUTELLM = SHARED / "routellm-evals"
needs_routellm = pytest.mark.skipif(
    not (ROUTELLM / "mmlu" / "responses").is_dir(), reason=f"RouteLLM's evaluation data not found at {ROUTELLM}"
)


@pytest.fixture(scope="module")
def backbone(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("routellm-bench")
    (root / "tok").mkdir()
    build_tokenizer(root / "tok")
    return build_backbone(root / "backbone", root / "tok")


def config(backbone: Path, tmp_path: Path, **changes) -> rb.RouteLLMBenchConfig:
    settings = dict(
        data_dir=ROUTELLM,
        folds=2,
        repeats=2,
        subject_folds=3,
        cost_weights=(0.0, 0.2),
        search={"generations": 3},
        cmaes_splits=1,
        knn_k=5,
        limit=300,  # MMLU's first files: abstract_algebra, anatomy, astronomy
        backbone=str(backbone),
        cache_dir=tmp_path / "cache",
        progress=False,
    )
    return rb.RouteLLMBenchConfig(**{**settings, **changes})


@pytest.mark.slow
@needs_routellm
def test_every_router_on_the_same_folds_with_routellm_metrics(backbone, tmp_path):
    result = rb.run_benchmark(config(backbone, tmp_path))
    mmlu, gsm8k = result.datasets
    assert (mmlu.name, mmlu.rows, gsm8k.rows) == ("mmlu", 300, 300)
    # the first 300 questions RouteLLM keeps, read here with the csv and json modules
    contaminated = {
        json.loads(line)["eval_prompt"] for line in (ROUTELLM / "mmlu" / "contaminated_prompts.jsonl").open()
    }
    kept = []
    for subject in ("abstract_algebra", "anatomy", "astronomy"):
        with open(ROUTELLM / "mmlu" / "responses" / f"mmlu_{subject}.csv", newline="", encoding="utf-8") as handle:
            kept += [row for row in csv.DictReader(handle) if row["prompt"] not in contaminated]
    assert mmlu.strong == pytest.approx(np.mean([row[rb.STRONG_MODEL] == "True" for row in kept[:300]]))
    assert mmlu.weak == pytest.approx(np.mean([row[rb.WEAK_MODEL] == "True" for row in kept[:300]]))
    # the held-out folds of a repeat cover every row once
    assert sum(s.rows for s in mmlu.splits if s.kind == "k-fold" and s.repeat == 0) == 300
    for data in (mmlu, gsm8k):
        kfold = data.summary("k-fold")
        assert kfold["cmaes_sweep"]["folds"] == 1 and kfold["knn"]["folds"] == 4
        assert kfold["probability"]["folds"] == 4 and kfold["oracle"]["folds"] == 4
        # the oracle recovers more of the gap than any router; random about half of it
        assert all(kfold["oracle"]["apgr"] > stats["apgr"] for m, stats in kfold.items() if m != "oracle")
        assert kfold["oracle"]["apgr"] >= 1.0
        assert 0.3 < kfold["random"]["apgr"] < 0.7
        for split in data.splits:
            # every curve runs from always-weak to always-strong on this fold's own rows
            for name in ("knn", "oracle"):
                curve = split.curves[name]
                assert curve.cost[0] == 0 and curve.cost[-1] == pytest.approx(1)
                assert curve.quality[0] == pytest.approx(split.weak)
            assert split.curves["knn"].quality[-1] == pytest.approx(split.strong)
    assert set(mmlu.summary("subjects-out")) >= {"knn", "probability", "random", "oracle", "cmaes_sweep"}
    assert mmlu.summary("subjects-out")["knn"]["folds"] == 3
    assert not gsm8k.summary("subjects-out")
    record = rb.results_to_dict(result)
    assert record["datasets"][0]["summary"]["k-fold"]["oracle"]["apgr"] == kfold_apgr(mmlu)
    assert "| oracle |" in rb.format_results(result)


def kfold_apgr(data: rb.DatasetResult) -> float:
    return float(np.mean([s.figures["oracle"].area for s in data.splits if s.kind == "k-fold"]))


@pytest.mark.slow
@needs_routellm
def test_the_script_writes_tables_json_and_the_curves(backbone, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    args = ["--data-dir", ROUTELLM, "--output-dir", out, "--datasets", "gsm8k", "--folds", "2", "--repeats", "1"]
    args += ["--cost-weights", "0,0.3", "--generations", "2", "--limit", "120", "--knn-k", "3", "--no-progress"]
    args += ["--backbone", backbone, "--cache-dir", tmp_path / "cache", "--sample", "gsm8k=100"]
    done = run_tool("scripts/routellm_benchmark.py", *args, timeout=600)
    assert done.returncode == 0, done.stderr
    stored = json.loads((out / "routellm.json").read_text())
    assert stored["datasets"][0]["rows"] == 100  # the sample of the first 120
    assert (out / "routellm.png").read_bytes()[:4] == b"\x89PNG"
    assert "CMA-ES heads, cost sweep" in (out / "routellm.md").read_text()
    bad = run_tool("scripts/routellm_benchmark.py", "--data-dir", tmp_path, "--output-dir", out, "--no-progress")
    assert bad.returncode == 2
    missing = tmp_path / "mmlu" / "responses"
    assert bad.stderr.strip().splitlines() == [
        f"error: {missing} not found; pass --data-dir with RouteLLM's evals data (mmlu/, gsm8k/)."
    ]


def test_subject_folds_keep_each_subject_in_one_fold():
    groups = ["a", "b", "a", "c", "b", "d", "c", "a"]
    folds = rb.subject_assignments(groups, 2, seed=1)[0]
    for subject in set(groups):
        assert len({folds[i] for i, g in enumerate(groups) if g == subject}) == 1
    assert set(folds) == {0, 1}
    assert list(rb.sample_rows(10, None, 0)) == list(range(10))
    sample = rb.sample_rows(10, 4, 0)
    assert len(set(sample)) == 4 and list(sample) == sorted(sample)
