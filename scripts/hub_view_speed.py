"""The Hub view's speed: `pipeline(...)` with this repository's remote code against an older commit's,
on the same router, queries and machine, in one run (docs/routing.md, "With transformers").

    python scripts/hub_view_speed.py --old-commit 7aae08d --prompts tasks.jsonl

The router is a random head over a random Qwen3 backbone (1 layer, 384 wide) with a BPE trained on
the prompts, written by the package's converter; only the two remote-code files differ between the
two folders. Prints the median of three timed passes per batch size and whether every pick agrees.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
REMOTE_CODE = ("configuration_router.py", "modeling_router.py")
GEOMETRY = {"hidden_size": 384, "intermediate_size": 1536, "num_hidden_layers": 1, "num_attention_heads": 6}


def timed_picks(folder: Path, queries: list[str], batch_size: int) -> tuple[float, list[str]]:
    from transformers import pipeline

    router = pipeline("text-classification", model=str(folder), trust_remote_code=True)
    router(queries[:4], batch_size=batch_size)  # warm-up
    seconds = []
    for _ in range(3):
        started = time.perf_counter()
        answers = router(queries, batch_size=batch_size)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), [answer["label"] for answer in answers]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    parser.add_argument("--old-commit", required=True, help="the commit whose remote code is the baseline")
    parser.add_argument("--prompts", type=Path, required=True, help="JSONL with a `prompt` field (a tasks file)")
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from benchgen_router.bench.synthetic import AGENTS, build_backbone, convert_router, install_tokenizer

    torch.set_num_threads(1)
    prompts = [json.loads(line)["prompt"] for line in args.prompts.open(encoding="utf-8")]
    queries = prompts[:: max(1, len(prompts) // args.queries)][: args.queries]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        backbone = work / "backbone"
        build_backbone(backbone, {**GEOMETRY, "num_key_value_heads": 2, "head_dim": 64}, "float32", seed=0)
        install_tokenizer(prompts[:2000], backbone)
        theta = np.random.default_rng(0).normal(size=GEOMETRY["hidden_size"] * len(AGENTS) + len(AGENTS))
        new = convert_router(work, backbone, theta, GEOMETRY["hidden_size"], "new")
        old = work / "old"
        shutil.copytree(new, old)
        for name in REMOTE_CODE:
            code = subprocess.run(["git", "-C", str(ROOT), "show", f"{args.old_commit}:{name}"], check=True,
                                  capture_output=True, text=True).stdout  # fmt: skip
            (old / name).write_text(code, encoding="utf-8")
        for batch_size in (16, 1):
            old_s, old_picks = timed_picks(old, queries, batch_size)
            new_s, new_picks = timed_picks(new, queries, batch_size)
            print(
                f"batch_size {batch_size}: {args.old_commit} {old_s:.3f} s, this code {new_s:.3f} s, "
                f"ratio {new_s / old_s:.2f}x, same picks: {old_picks == new_picks}"
            )


if __name__ == "__main__":
    main()
