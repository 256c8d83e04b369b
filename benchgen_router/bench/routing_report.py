"""The routing benchmark's report as markdown (the printed table) or JSON (every number)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from benchgen_router.bench.routing import ROW_TITLES
from benchgen_router.bench.synthetic import AGENTS
from benchgen_router.files import atomic_output

GIB = 1024**3
TABLE_HEADER = [
    "row",
    "dtype",
    "batching",
    "queries/s",
    "tokens/s",
    "GFLOP/s",
    "% fp32 peak",
    "% bf16 peak",
    "picks = (a)",
    "emb rel err",
    "speed vs (a)",
    "setup s",
    "peak RSS GiB load / route",
    "RSS ÷ weights load / route",
]
TABLE_NOTE = (
    "Weights: each row's backbone weight bytes in its dtype (tied embeddings once). Peak RSS is the process's "
    "VmHWM after loading, then restarted and read again after routing. Setup: loading plus the package "
    "rows' warm-up (routing the calibration prompts; includes torch.compile). CPU share: CPU time of the "
    "row's process over wall time x threads while routing (well under 100% means other processes took the "
    "cores)."
)


def write_report(report: dict[str, Any], markdown: str, paths: Iterable[Path]) -> None:
    """Each path gets the markdown, or the whole report where its name ends in .json."""
    for path in paths:
        with atomic_output(path) as handle:
            handle.write(json.dumps(report, indent=1) if path.suffix == ".json" else markdown)


def render_markdown(report: dict[str, Any]) -> str:
    """The run's facts, then one table with a line per row, then any profiles."""
    lines = ["# Routing benchmark", "", *fact_lines(report), ""]
    lines += table_lines(report)
    lines += ["", TABLE_NOTE]
    lines += profile_lines(report)
    return "\n".join(lines) + "\n"


def fact_lines(report: dict[str, Any]) -> list[str]:
    """What the figures depend on, so that two reports can be compared: machine, model, sample, peaks, load."""
    return [
        f"- command: `{report['command']}`",
        machine_line(report),
        backbone_line(report),
        workload_line(report),
        tokens_line(report["sample"]),
        peak_line(report),
        f"- achieved GFLOP/s = {report['flop_formula']}",
        f"- head: random, seeded, bias centred on 6 calibration prompts outside the sample; (a)'s picks per agent "
        f"{dict(zip(AGENTS, report['pick_distribution'], strict=True))}",
        load_line(report),
    ]


def machine_line(report: dict[str, Any]) -> str:
    machine = report["machine"]
    features = ", ".join(name for name, present in machine["cpu_features"].items() if present) or "none"
    return (
        f"- machine: {machine.get('gpu', machine['cpu'])}; CPU {machine['cpu']}, {machine['cpu_count']} CPUs "
        f"({features}); torch {machine['torch']}, transformers {machine['transformers']}; "
        f"{machine['threads']} threads; device {report['device']}"
    )


def backbone_line(report: dict[str, Any]) -> str:
    geometry, seed, params = report["geometry"], report["sample"]["seed"], report["non_embedding_params"]
    return (
        f"- backbone: synthetic Qwen3, random weights (seed {seed}), "
        f"**{geometry['num_hidden_layers']} layers**, "
        f"hidden {geometry['hidden_size']}, intermediate {geometry['intermediate_size']}, "
        f"{geometry['num_attention_heads']}/{geometry['num_key_value_heads']} heads x {geometry['head_dim']}, "
        f"vocab {geometry['vocab_size']:,}; {params:,} non-embedding parameters "
        f"({2 * params / 1e9:.3g} GFLOP/token); "
        f"checkpoint saved in {report['checkpoint_dtype']}"
    )


def workload_line(report: dict[str, Any]) -> str:
    sample = report["sample"]
    return (
        f"- workload: {report['workload']}; length-stratified sample of {sample['queries']} (seed {sample['seed']}), "
        f"random order"
    )


def tokens_line(sample: dict[str, Any]) -> str:
    return (
        f"- tokens ({sample['tokenizer']}): "
        f"sample {sample['tokens_total']:,} total, mean {sample['tokens_mean']:.1f}, min {sample['tokens_min']}, "
        f"max {sample['tokens_max']}; whole workload mean {sample['workload_tokens_mean']:.1f}, "
        f"max {sample['workload_tokens_max']}"
    )


def peak_line(report: dict[str, Any]) -> str:
    peaks, shape = report["peaks_gflops"], report["peak_shape"]
    if "bfloat16" in peaks["start"]:
        bf16 = f"bfloat16 {peaks['start']['bfloat16']:.0f} / {peaks['end']['bfloat16']:.0f}"
    else:
        bf16 = "bfloat16 not measured (emulated on this CPU)"
    return (
        f"- matmul peak (best of {shape['repeats']} products of {shape['shape']}), "
        f"GFLOP/s: float32 {peaks['start']['float32']:.0f} at start, {peaks['end']['float32']:.0f} at end; "
        f"{bf16}; the table uses the larger"
    )


def load_line(report: dict[str, Any]) -> str:
    loadavg, threads = report["loadavg"], report["machine"]["threads"]
    return (
        f"- load average at start {loadavg['start'][0]:.2f}, at end {loadavg['end'][0]:.2f} "
        f"(the 1-min average, which lags; this run's own rows add up to {threads}, more means other "
        f"processes); total run {report['seconds_total'] / 60:.1f} min"
    )


def table_lines(report: dict[str, Any]) -> list[str]:
    """A GPU run's last column is device memory, a CPU run's the CPU share (which shows contention)."""
    gpu = report["device"].startswith("cuda")
    header = [*TABLE_HEADER, "peak GPU GiB" if gpu else "CPU share"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, row in report["rows"].items():
        lines.append("| " + " | ".join(row_cells(name, row, gpu)) + " |")
    return lines


def row_cells(name: str, row: dict[str, Any], gpu: bool) -> list[str]:
    weights = row["weight_bytes"]
    cells = [
        f"{row['title']}" if name in ROW_TITLES else f"(d) {name}",
        row["dtype"],
        row["batching"],
        f"{row['queries_per_s']:.3g}",
        f"{row['tokens_per_s']:.4g}",
        f"{row['gflops']:.4g}",
        f"{row['pct_fp32_peak']:.1f}%",
        "n/a" if row["pct_bf16_peak"] is None else f"{row['pct_bf16_peak']:.1f}%",
        f"{100 * row['agreement']:.1f}%",
        f"{row['emb_rel_err']:.1e}",
        f"{row['speedup']:.2f}x",
        f"{row['load_seconds'] + row.get('warmup_seconds', 0):.0f}",
        f"{row['load_peak_rss'] / GIB:.2f} / {row['route_peak_rss'] / GIB:.2f}",
        f"{row['load_peak_rss'] / weights:.2f} / {row['route_peak_rss'] / weights:.2f}",
    ]
    cells.append(f"{row.get('device_peak_bytes', 0) / GIB:.2f}" if gpu else f"{100 * row['cpu_share']:.0f}%")
    return cells


def profile_lines(report: dict[str, Any]) -> list[str]:
    lines = []
    for name, row in report["rows"].items():
        if row.get("profile"):
            lines += ["", f"Profile of row {name} routing the sample's first 16 queries (self time):", ""]
            lines += [
                f"- {op['share'] * 100:5.1f}%  {op['ms']:9.1f} ms  {op['calls']:5d} calls  {op['op']}"
                for op in row["profile"]
            ]
    return lines
