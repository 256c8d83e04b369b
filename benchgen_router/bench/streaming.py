"""Peak memory of `benchgen-router route --input` against the size of its input: it must stay flat.

    python -m benchgen_router.bench.streaming                       # 10k, 100k and 1M lines
    python -m benchgen_router.bench.streaming --lines 10000 100000 --model ./router

Writes a plain-text file of the pilot prompts repeated (or a generated workload of the same
lengths when ../shared is absent) at each size, routes it in a fresh process with `--output`, and
reads that process's peak RSS from the kernel (wait4). Without --model the router is a tiny random
BERT (hidden 32, one layer) with all-MiniLM-L6-v2's real tokenizer, so that a million lines route in
minutes: what is measured is the streaming of the input and output, not the backbone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benchgen_router.bench.routing import AGENTS, DEFAULT_TASKS, convert_router, load_workload
from benchgen_router.hardware import cpu_summary

DEFAULT_LINES = (10_000, 100_000, 1_000_000)


def write_input(path: Path, prompts: Sequence[str], lines: int) -> int:
    """`lines` queries, one per line (the prompts' own newlines become spaces), cycling through prompts."""
    flat = [" ".join(prompt.split()) for prompt in prompts]
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(lines):
            handle.write(flat[i % len(flat)] + "\n")
    return path.stat().st_size


def route_and_measure(router: Path | None, source: Path, output: Path, threads: int) -> dict[str, float]:
    """Route `source` in a fresh process; its exit code, wall time and peak RSS (bytes)."""
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
    """A one-layer, 32-wide random BERT with all-MiniLM-L6-v2's tokenizer (from its package): fast
    enough to route a million lines, with a real tokenizer's cost per line."""
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--lines", type=int, nargs="+", default=list(DEFAULT_LINES), help="input sizes in lines")
    parser.add_argument("--model", type=Path, help="router to route with (default: a tiny random Qwen3 router)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the routing process (default: 1)")
    parser.add_argument("--tasks", type=Path, default=DEFAULT_TASKS, help="workload JSONL (default: %(default)s)")
    parser.add_argument("--workdir", type=Path, help="where to write the inputs (default: a temporary folder)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)

    prompts, source = load_workload(args.tasks, seed=0)
    rows = []
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        workdir = Path(tmp)
        router = args.model or tiny_router(workdir)
        for lines in args.lines:
            path = workdir / f"queries-{lines}.txt"
            size = write_input(path, prompts, lines)
            figures = route_and_measure(router, path, workdir / "picks.jsonl", args.threads)
            with open(workdir / "picks.jsonl", "rb") as picks:
                written = sum(1 for _ in picks)
            rows.append({"lines": lines, "input_bytes": size, "output_lines": written, **figures})
            path.unlink()
    if args.json:
        print(json.dumps({"workload": source, "cpu": cpu_summary(), "rows": rows}))
        return 0
    described = args.model or "a tiny random BERT (hidden 32, 1 layer) with MiniLM's tokenizer"
    print(f"- router: {described}; workload: {source}")
    print(f"- CPU: {cpu_summary()}; {args.threads} torch thread(s)")
    print("\n| input lines | input MiB | routed | wall s | lines/s | peak RSS MiB |\n|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['lines']:,} | {row['input_bytes'] / 2**20:.1f} | {row['output_lines']:,} | {row['seconds']:.0f} | "
            f"{row['lines'] / row['seconds']:.0f} | {row['peak_rss_bytes'] / 2**20:.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
