"""`benchgen-router bench value` as users run it: RouteLLM's outcomes (a slice of the real files) imported with
RouteLLM's cost (the share of strong calls), then every router on the same folds with a tiny random
backbone, RouteLLM's metrics beside the pool metrics; bad input as one line."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from benchgen_router.bench.value.run import group_assignments
from helpers import SHARED, cli, make_queries

ROUTELLM = SHARED / "routellm-evals"
MMLU = ROUTELLM / "mmlu"
STRONG, WEAK = "gpt-4-1106-preview", "mistralai/Mixtral-8x7B-Instruct-v0.1"
SUBJECTS = ("abstract_algebra", "anatomy", "astronomy")
needs_routellm = pytest.mark.skipif(
    not (MMLU / "responses").is_dir(), reason=f"RouteLLM's evaluation data not found at {ROUTELLM} (CI has it)"
)


@pytest.mark.slow  # imports three subjects and runs every router on 7 folds
@needs_routellm
def test_routellm_slice_through_import_and_bench_value(tmp_path, backbone_dir, capsys):
    files = [MMLU / "responses" / f"mmlu_{subject}.csv" for subject in SUBJECTS]
    data = tmp_path / "mmlu"
    costs = ["--call-cost", f"{STRONG}=1", "--call-cost", f"{WEAK}=0", "--call-cost-unit", "calls"]
    contaminated = MMLU / "contaminated_prompts.jsonl"
    assert cli("import", "--routellm", *files, "--contaminated", contaminated, *costs, "--output-dir", data) == 0
    out = tmp_path / "out"
    out.mkdir()
    args = ["--data", data, "--output-dir", out, "--folds", "2", "--repeats", "2", "--group-folds", "3"]
    args += ["--cost-weights", "0,0.2", "--generations", "3", "--cmaes-splits", "1", "--knn-k", "5", "--no-progress"]
    args += ["--backbone", backbone_dir, "--cache-dir", tmp_path / "cache", "--cost-unit", "strong calls per 1,000"]
    capsys.readouterr()
    assert cli("bench", "value", *args) == 0
    tables = capsys.readouterr().out
    assert "RouteLLM's figures (two agents)" in tables and "strong calls per 1,000" in tables
    stored = json.loads((out / "value.json").read_text())
    # the questions RouteLLM keeps, and each model's accuracy on them, read here with the csv and json modules
    dropped = {json.loads(line)["eval_prompt"] for line in contaminated.open(encoding="utf-8")}
    kept = []
    for path in files:
        with open(path, newline="", encoding="utf-8") as handle:
            kept += [row for row in csv.DictReader(handle) if row["prompt"] not in dropped]
    assert stored["rows"] == len(kept) and stored["agents"] == [WEAK, STRONG]
    kfold = [fold for fold in stored["folds"] if fold["kind"] == "k-fold"]
    assert len(kfold) == 4 and sum(fold["rows"] for fold in kfold if fold["repeat"] == 0) == len(kept)
    strong = np.mean([row[STRONG] == "True" for row in kept])
    assert np.mean([fold["singles"][STRONG][1] for fold in kfold if fold["repeat"] == 0]) == pytest.approx(
        strong, abs=0.02
    )  # the mean of two halves' accuracies, against the whole's
    for fold in kfold:
        figures = fold["routellm"]["figures"]
        assert 0.3 < figures["random"]["apgr"] < 0.7
        assert all(figures["oracle"]["apgr"] > value["apgr"] for name, value in figures.items() if name != "oracle")
        assert fold["singles"][STRONG][0] == pytest.approx(1000.0)  # one strong call per query, per 1,000
    summary = stored["summary"]["k-fold"]["curves"]
    assert np.mean([fold["routellm"]["figures"]["oracle"]["apgr"] for fold in kfold]) >= 1.0
    assert summary["oracle"]["best"] > summary["zero router"]["best"]
    groups_out = [fold for fold in stored["folds"] if fold["kind"] == "groups-out"]
    assert len(groups_out) == 3 and all("lookup" in fold["notes"] for fold in groups_out)
    for png in ("value.png", "value-gap.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def test_a_folder_without_the_imported_files_is_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    assert cli("bench", "value", "--data", tmp_path, "--output-dir", out, "--no-progress") == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: {tmp_path} has no tasks.jsonl; pass a folder with tasks.jsonl, rewards.jsonl and calls.jsonl "
        "(what `benchgen-router import` writes)."
    ]
    assert cli("bench", "value", "--data", tmp_path, "--output-dir", out, "--routers", "svm") == 2
    assert "choose from probability, cmaes, knn, lookup, mf, layers, stats, knn-stack" in capsys.readouterr().err


def test_group_folds_keep_each_group_in_one_fold():
    groups = ["a", "b", "a", "c", "b", "d", "c", "a"]
    folds = group_assignments(groups, 2, seed=1)[0]
    for group in set(groups):
        assert len({folds[i] for i, g in enumerate(groups) if g == group}) == 1
    assert set(folds) == {0, 1}


def test_the_command_computes_what_the_feature_routers_read(tmp_path, backbone_dir, capsys):
    """The probability head beside its three widenings, on a matrix imported as users import theirs: the
    command embeds the layer means (cached beside the embeddings) and the statistics, and every router's
    curves and RouteLLM figures come back."""
    prompts = make_queries(60, seed=9)
    rng = np.random.default_rng(9)
    rows = [
        {"prompt": prompt, "model": model, "correct": int(rng.random() < chance), "task_group": f"g{i % 3}"}
        for i, prompt in enumerate(prompts)
        for model, chance in (("weak", 0.3 + 0.6 * (len(prompt) > 60)), ("strong", 0.9))
    ]
    long = tmp_path / "outcomes.csv"
    with open(long, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    data, out, cache = tmp_path / "data", tmp_path / "out", tmp_path / "cache"
    costs = ["--call-cost", "weak=0", "--call-cost", "strong=1", "--call-cost-unit", "calls"]
    assert cli("import", "--long", long, *costs, "--output-dir", data) == 0
    out.mkdir()
    args = ["--data", data, "--output-dir", out, "--folds", "2", "--repeats", "1", "--group-folds", "0"]
    args += ["--routers", "probability,layers,stats,knn-stack", "--backbone", backbone_dir, "--cache-dir", cache]
    capsys.readouterr()
    assert cli("bench", "value", *args, "--no-progress") == 0
    assert "probability head + layer means, lambda swept" in capsys.readouterr().out
    stored = json.loads((out / "value.json").read_text())
    for fold in stored["folds"]:
        for router in ("probability", "layers", "stats", "knn-stack"):
            assert f"{router}/lambda" in fold["curves"] and router in fold["routellm"]["figures"]
    assert len(list(cache.glob("*.npy"))) == 2  # the embeddings and the layer means, each cached once
