"""train --calls --cv-folds on calls whose every latency is 0 (what importing RouteLLM's files writes:
they record no latency): the run finishes, and a latency saving against a reference of 0 is reported
as no figure, not a division by zero."""

from __future__ import annotations

import json

import pytest

from helpers import SHARED, call_record, calls_row, cli, make_queries, write_jsonl

MMLU = SHARED / "routellm-evals" / "mmlu"
AGENTS = ["strong", "weak"]


def zero_latency_files(folder, rows: int = 24):
    """Both agents answer every task correctly, 'weak' at a tenth of the price, and every call took 0 ms:
    the router is at equal quality with the best fixed agent, so its latency saving is asked for."""
    calls = [
        calls_row(
            f"t{i}",
            AGENTS,
            [call_record("strong", True, 1e-3, latency_ms=0.0), call_record("weak", True, 1e-4, latency_ms=0.0)],
        )
        for i in range(rows)
    ]
    tasks = [{"task_id": f"t{i}", "prompt": prompt} for i, prompt in enumerate(make_queries(rows, seed=4))]
    return write_jsonl(folder / "tasks.jsonl", tasks), write_jsonl(folder / "calls.jsonl", calls)


def train_args(folder, backbone_dir, tasks, rewards, calls):
    return [
        "train", "--tasks", tasks, "--rewards", rewards, "--calls", calls, "--backbone", backbone_dir,
        "--operating-point", "quality=0", "--operating-point", "fast=0:0.01", "--cv-folds", "2",
        "--cv-repeats", "2", "--generations", "4", "--no-ood-guard", "--no-progress",
        "--cache-dir", folder / "cache", "--output-dir", folder / "out",
    ]  # fmt: skip


def test_train_with_the_frontier_cv_on_zero_latencies_reports_no_latency_share(tmp_path, backbone_dir, capsys):
    tasks, calls = zero_latency_files(tmp_path)
    code = cli(*train_args(tmp_path, backbone_dir, tasks, calls, calls), "--target-eps", "0.05")
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "no share of its latency (which is 0)" in out
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert {point["latency_s"] for point in manifest["frontier"]["points"]} == {0.0}
    assert manifest["operating_points"]["fast"]["held_out"]["latency_s"] == 0.0


@pytest.mark.skipif(not (MMLU / "responses").is_dir(), reason=f"RouteLLM's evaluation data not found at {MMLU}")
def test_train_with_the_frontier_cv_reads_an_imported_routellm_slice(tmp_path, backbone_dir, capsys):
    """The real case: RouteLLM's files imported (no latency in them, so 0 ms per call), then trained on."""
    source = MMLU / "responses" / "mmlu_machine_learning.csv"
    assert cli("import", "--routellm", source, "--limit", "40", "--output-dir", tmp_path / "data") == 0
    data = tmp_path / "data"
    calls = [json.loads(line) for line in (data / "calls.jsonl").read_text().splitlines()]
    assert {call["latency_ms"] for row in calls for call in row["calls"]} == {0.0}
    capsys.readouterr()
    code = cli(*train_args(tmp_path, backbone_dir, data / "tasks.jsonl", data / "rewards.jsonl", data / "calls.jsonl"))
    out, err = capsys.readouterr()
    assert code == 0, err
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["frontier"]["rows"] == 40 and "router lc0_ll0.01" in out
