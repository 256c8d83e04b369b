"""bench/routing_report.py: the markdown a run prints (facts, one table line per row, profiles) and
the files --output writes, from a report built here (no benchmark is run)."""

from __future__ import annotations

import json

from benchgen_router.bench.routing_report import TABLE_HEADER, render_markdown, write_report

GIB = 1024**3


def make_row(title: str, **overrides: object) -> dict:
    row = {
        "title": title,
        "dtype": "float32",
        "batching": "packed <= 2048 tokens",
        "queries_per_s": 2.5,
        "tokens_per_s": 250.0,
        "gflops": 300.0,
        "pct_fp32_peak": 75.0,
        "pct_bf16_peak": None,
        "agreement": 1.0,
        "emb_rel_err": 1.5e-6,
        "speedup": 1.3,
        "load_seconds": 3.0,
        "load_peak_rss": 2 * GIB,
        "route_peak_rss": 3 * GIB,
        "weight_bytes": 2 * GIB,
        "cpu_share": 0.99,
    }
    return {**row, **overrides}


def make_report(device: str = "cpu", bf16: bool = False) -> dict:
    features = {"avx2": True, "avx512f": True, "amx_bf16": bf16}
    peaks = {"start": {"float32": 342.0}, "end": {"float32": 392.0}}
    if bf16:
        peaks["start"]["bfloat16"], peaks["end"]["bfloat16"] = 2289.0, 2351.0
    machine = {"cpu": "Test CPU", "cpu_count": 2, "cpu_features": features, "threads": 2}
    machine |= {"torch": "2.13", "transformers": "5.24"}
    if device == "cuda":
        machine["gpu"] = "Test GPU"
    geometry = {"hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 2, "num_attention_heads": 4}
    geometry |= {"num_key_value_heads": 2, "head_dim": 16, "vocab_size": 151_936}
    sample = {"queries": 6, "seed": 0, "tokens_total": 1234, "tokens_mean": 82.0, "tokens_min": 49}
    sample |= {"tokens_max": 123, "workload_tokens_mean": 91.2, "workload_tokens_max": 400, "tokenizer": "a BPE"}
    rows = {
        "ref-single": make_row("(a) reference, one query at a time, float32", batching="1 query, input order"),
        "default": make_row("(c) package default: load_router + run_router, float32", warmup_seconds=10.0),
        "bf16": make_row("(d) speed mode bf16: ...", dtype="bfloat16", pct_bf16_peak=48.6, device_peak_bytes=GIB),
    }
    rows["bf16"]["profile"] = [{"op": "aten::mm", "calls": 196, "share": 0.872, "ms": 14134.2}]
    return {
        "command": "benchgen-router bench --tiny",
        "machine": machine,
        "device": device,
        "geometry": geometry,
        "non_embedding_params": 98_688,
        "checkpoint_dtype": "bfloat16",
        "workload": "generated",
        "sample": sample,
        "peaks_gflops": peaks,
        "peak_shape": {"repeats": 3, "shape": [256, 64, 192]},
        "flop_formula": "2 x non-embedding params x real tokens",
        "pick_distribution": [1, 2, 0, 1, 2],
        "loadavg": {"start": [0.97, 1.0, 1.0], "end": [2.0, 1.0, 1.0]},
        "seconds_total": 474.0,
        "rows": rows,
    }


def table(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


def test_markdown_has_the_facts_a_line_per_row_and_the_profiles():
    text = render_markdown(make_report())
    lines = text.splitlines()
    assert lines[:3] == ["# Routing benchmark", "", "- command: `benchgen-router bench --tiny`"]
    assert "(avx2, avx512f); torch 2.13, transformers 5.24; 2 threads; device cpu" in text
    assert "**2 layers**" in text and "98,688 non-embedding parameters" in text
    assert "sample 1,234 total" in text and "total run 7.9 min" in text
    assert "float32 342 at start, 392 at end; bfloat16 not measured (emulated on this CPU)" in text
    assert "{'frontier_a': 1, 'frontier_b': 2, 'frontier_c': 0, 'open_mid': 1, 'open_cheap_reasoning': 2}" in text
    header, rule, *rows = table(text)
    assert header == "| " + " | ".join([*TABLE_HEADER, "CPU share"]) + " |" and rule == "|" + "---|" * 15
    titles = [row.split(" | ")[0] for row in rows]
    assert titles == [
        "| (a) reference, one query at a time, float32",
        "| (c) package default: load_router + run_router, float32",
        "| (d) bf16",
    ]
    assert rows[1].endswith("| 1.5e-06 | 1.30x | 13 | 2.00 / 3.00 | 1.00 / 1.50 | 99% |")
    assert "| n/a |" in rows[0] and "| 48.6% |" in rows[2]
    assert "Profile of row bf16 routing the sample's first 16 queries (self time):" in text
    assert text.endswith("-  87.2%    14134.2 ms    196 calls  aten::mm\n")


def test_a_gpu_run_reports_device_memory_and_bf16_peaks():
    text = render_markdown(make_report(device="cuda", bf16=True))
    assert "- machine: Test GPU; CPU Test CPU" in text
    assert "bfloat16 2289 / 2351; the table uses the larger" in text
    header, _, *rows = table(text)
    assert header.endswith("| peak GPU GiB |")
    assert rows[0].endswith("| 0.00 |") and rows[2].endswith("| 1.00 |")


def test_write_report_writes_json_for_json_names_and_markdown_otherwise(tmp_path):
    report = make_report()
    text = render_markdown(report)
    write_report(report, text, [tmp_path / "run.json", tmp_path / "run.md"])
    assert json.loads((tmp_path / "run.json").read_text()) == report
    assert (tmp_path / "run.md").read_text() == text
