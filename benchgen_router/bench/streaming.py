"""Peak memory of `benchgen-router route --input` against the size of its input: it must stay flat.

Measured in a fresh process per size, with a tiny router unless one is given, so that what grows
(or does not) is the streaming of input and output, not the backbone; see docs/benchmark.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchgen_router.bench.synthetic import AGENTS, convert_router
from benchgen_router.hardware import cpu_summary

DEFAULT_LINES = (10_000, 100_000, 1_000_000)
TINY_ROUTER = "a tiny random BERT (hidden 32, 1 layer) with MiniLM's tokenizer"


def write_input(path: Path, prompts: Sequence[str], lines: int) -> int:
    """`lines` queries, one per line (the prompts' own newlines become spaces), cycling through prompts."""
    flat = [" ".join(prompt.split()) for prompt in prompts]
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(lines):
            handle.write(flat[i % len(flat)] + "\n")
    return path.stat().st_size


def route_and_measure(router: Path | None, source: Path, output: Path, threads: int) -> dict[str, float]:
    """Exit code, wall time and peak RSS (bytes, from wait4: the child's own peak) of routing `source`."""
    command = [sys.executable, "-m", "benchgen_router", "route", "--input", str(source), "--output", str(output)]
    command += ["--quiet", "--threads", str(threads)] + (["--model", str(router)] if router else [])
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    stderr = process.stderr.read().decode(errors="replace") if process.stderr else ""
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):
        raise RuntimeError(f"route exited {code}: {stderr.strip().splitlines()[-1:]}")
    return {"exit": code, "seconds": seconds, "peak_rss_bytes": usage.ru_maxrss * 1024}


def tiny_router(workdir: Path) -> Path:
    """A one-layer, 32-wide random BERT with all-MiniLM-L6-v2's real tokenizer: a million lines route
    in minutes, with a real tokenizer's cost per line."""
    import shutil

    import torch
    from transformers import BertConfig, BertModel

    from benchgen_router.loading import backbone_source

    backbone = workdir / "backbone"
    torch.manual_seed(0)
    config = BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    BertModel(config).save_pretrained(backbone)
    tokenizer_dir = Path(backbone_source("sentence-transformers/all-MiniLM-L6-v2"))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copyfile(tokenizer_dir / name, backbone / name)
    theta = np.random.default_rng(0).normal(size=32 * len(AGENTS) + len(AGENTS))
    return convert_router(workdir, backbone, theta, 32)


def measure_sizes(
    prompts: Sequence[str], sizes: Sequence[int], model: Path | None, threads: int, workdir: Path | None
) -> list[dict[str, Any]]:
    """One row per input size; each input is deleted once routed, so disk use stays one file."""
    rows = []
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        folder = Path(tmp)
        router = model or tiny_router(folder)
        for lines in sizes:
            path = folder / f"queries-{lines}.txt"
            size = write_input(path, prompts, lines)
            figures = route_and_measure(router, path, folder / "picks.jsonl", threads)
            with open(folder / "picks.jsonl", "rb") as picks:
                written = sum(1 for _ in picks)
            rows.append({"lines": lines, "input_bytes": size, "output_lines": written, **figures})
            path.unlink()
    return rows


def table_lines(rows: Sequence[dict[str, Any]], model: Path | None, source: str, threads: int) -> list[str]:
    lines = [
        f"- router: {model or TINY_ROUTER}; workload: {source}",
        f"- CPU: {cpu_summary()}; {threads} torch thread(s)",
        "\n| input lines | input MiB | routed | wall s | lines/s | peak RSS MiB |\n|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['lines']:,} | {row['input_bytes'] / 2**20:.1f} | {row['output_lines']:,} | {row['seconds']:.0f} | "
            f"{row['lines'] / row['seconds']:.0f} | {row['peak_rss_bytes'] / 2**20:.0f} |"
        )
    return lines


if __name__ == "__main__":  # deprecated way in, kept until the next minor version
    from benchgen_router.bench import hand_over_to_command

    hand_over_to_command("benchgen_router.bench.streaming", ["bench", "streaming"])
