"""bench/routing.py: a smoke run at a tiny geometry (every row and column present, the default path
agrees with the reference, peaks measured at the tiny shapes), the bench command's checks, and the
columns each row gets against row (a)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchgen_router import speedups
from benchgen_router.bench.routing import OFFERED_MODES, TRIAL_MODE_NAMES, row_metrics, table_rows
from benchgen_router.bench.synthetic import qwen3_tokenizer_dir
from benchgen_router.hardware import bf16_is_fast
from helpers import run_tool

COLUMNS = [
    "queries_per_s",
    "tokens_per_s",
    "gflops",
    "pct_fp32_peak",
    "pct_bf16_peak",
    "agreement",
    "load_peak_rss",
    "route_peak_rss",
    "weight_bytes",
    "speedup",
]


@pytest.mark.slow
def test_smoke_run_has_every_row_and_column(tmp_path):
    """The whole benchmark end to end at hidden 64 / 2 layers, on the generated workload (so it
    does not depend on the pilot data being present)."""
    out = tmp_path / "bench.json"
    table = tmp_path / "bench.md"
    common = ["--tiny", "--queries", "6", "--tasks", str(tmp_path / "absent.jsonl"), "--workdir", str(tmp_path)]
    result = run_tool("bench", *common, "--output", str(out), "--output", str(table), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    fast_bf16 = bf16_is_fast("cpu")
    assert list(report["rows"]) == ["ref-single", "ref-batch16", "default", *(["bf16"] if fast_bf16 else [])]
    for name, row in report["rows"].items():
        for column in COLUMNS if fast_bf16 else [c for c in COLUMNS if c != "pct_bf16_peak"]:
            assert np.isfinite(row[column]) and row[column] > 0, (name, column, row[column])
    # peaks at the tiny model's own shapes, never the full-size products (minutes where bf16 is emulated)
    assert report["peak_shape"]["shape"] == [256, 64, 192]
    assert report["rows"]["default"]["agreement"] == 1.0
    assert report["rows"]["ref-batch16"]["agreement"] == 1.0
    assert report["rows"]["default"]["emb_rel_err"] < 1e-5
    assert report["rows"]["default"]["batching"] == "packed <= 2048 tokens"
    if fast_bf16:
        assert report["rows"]["bf16"]["dtype"] == "bfloat16"
    assert report["geometry"]["num_hidden_layers"] == 2
    assert report["geometry"]["vocab_size"] == 151_936
    assert report["workload"].startswith("generated")
    assert report["sample"]["queries"] == 6 and report["sample"]["tokens_total"] > 0
    assert sum(report["pick_distribution"]) == 6
    assert report["peaks_gflops"]["used"]["float32"] > 0
    assert ("bfloat16" in report["peaks_gflops"]["used"]) == fast_bf16
    # The printed markdown table: one line per row, with the layer count and the token counts.
    assert "| (a) reference" in result.stdout and ("| (d) bf16 |" in result.stdout) == fast_bf16
    assert "avx" in result.stdout or "no avx2/avx512/amx" in result.stdout  # the CPU's features are named
    real_tokenizer = qwen3_tokenizer_dir() is not None
    assert "**2 layers**" in result.stdout
    assert ("tokens (Qwen3's own tokenizer" in result.stdout) == real_tokenizer
    assert ("tokens (byte-level BPE" in result.stdout) == (not real_tokenizer)
    assert table.read_text() == result.stdout
    assert not list(tmp_path.glob("bench-routing-*")), "the temporary backbone was left behind"


def test_bad_arguments_fail_with_one_line():
    result = run_tool("bench", "--modes", "default,warp-drive")
    assert result.returncode == 2
    assert result.stderr.startswith("error: unknown row(s) warp-drive")
    assert run_tool("bench", "--layers", "0").returncode == 2


def test_the_mode_names_offered_without_importing_torch_are_the_speed_modes():
    assert set(OFFERED_MODES) == set(speedups.SPEED_MODES) and set(TRIAL_MODE_NAMES) == set(speedups.TRIAL_MODES)


def fake_row(seconds: float, picks: list[int], scale: float = 1.0) -> dict:
    logits = np.full((len(picks), 5), -1.0)
    logits[np.arange(len(picks)), picks] = 1.0
    embeddings = np.arange(len(picks) * 4, dtype=np.float32).reshape(len(picks), 4) * scale
    arrays = {"logits": logits, "embeddings": embeddings}
    return {"seconds": seconds, "cpu_seconds": seconds, "load_seconds": 1.0, "arrays": arrays}


def test_row_metrics_are_against_row_a_and_the_peaks():
    ref = fake_row(4.0, [0, 1, 2, 3])
    row = fake_row(2.0, [0, 1, 2, 4], scale=1.01)
    metrics = row_metrics(row, ref, tokens=400, flops=8e9, peaks={"float32": 2.0, "bfloat16": 8.0}, threads=2)
    assert metrics["speedup"] == 2.0 and metrics["queries_per_s"] == 2.0 and metrics["tokens_per_s"] == 200.0
    assert metrics["gflops"] == 4.0 and metrics["pct_fp32_peak"] == 200.0 and metrics["pct_bf16_peak"] == 50.0
    assert metrics["agreement"] == 0.75 and metrics["picks"] == [0, 1, 2, 4]
    assert abs(metrics["emb_rel_err"] - 0.01) < 1e-6
    assert metrics["cpu_share"] == 0.5
    assert row_metrics(row, ref, 400, 8e9, {"float32": 2.0}, 2)["pct_bf16_peak"] is None


def test_table_rows_drop_the_arrays_and_title_each_row():
    rows = {"ref-single": fake_row(4.0, [0, 1]), "default": fake_row(2.0, [0, 1]), "bf16": fake_row(1.0, [0, 2])}
    table = table_rows(rows, tokens=100, flops=1e9, peaks={"float32": 1.0}, threads=1)
    assert list(table) == ["ref-single", "default", "bf16"]
    assert all("arrays" not in entry for entry in table.values())
    assert table["ref-single"]["title"].startswith("(a) reference") and table["ref-single"]["speedup"] == 1.0
    assert table["bf16"]["title"].startswith("(d) speed mode bf16: ") and table["bf16"]["agreement"] == 0.5
