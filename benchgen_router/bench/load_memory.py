"""Peak memory of loading a router, against the size of its backbone's weights.

A ratio near 1 means the backbone is materialised once; what 1.5 and 2 point to is in
docs/benchmark.md ("Memory of loading").
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchgen_router.bench.synthetic import AGENTS, QWEN3_1_7B, build_backbone, convert_router

MODES = ("head-only", "bundled")

# Run in a fresh interpreter so that nothing else this script did counts towards the peak.
# ru_maxrss survives exec (it would report the parent's peak): read VmHWM/VmRSS (KiB) instead.
_CHILD = """
import json, sys
import torch, transformers
from benchgen_router.loading import load_router
def status(key):
    line = next(l for l in open("/proc/self/status") if l.startswith(key + ":"))
    return int(line.split()[1])
before = status("VmRSS")
model, _ = load_router(sys.argv[1])  # the package's load, as every tool loads a router
loaded = status("VmHWM")
with torch.inference_mode():  # read every weight: memory-mapped pages become resident too
    model(input_ids=torch.tensor([[1, 2, 3]]))
    checksum = sum(float(p.sum()) for p in model.parameters())
peak = status("VmHWM")
weights = sum(p.numel() * p.element_size() for p in model.backbone.parameters())
print(json.dumps({"before_kib": before, "loaded_kib": loaded, "peak_kib": peak, "backbone_bytes": weights,
                  "dtype": str(model.backbone.dtype)}))
"""


def build_synthetic_backbone(folder: Path, layers: int, vocab: int, dtype: str) -> None:
    """Qwen3-1.7B geometry with random weights and a minimal tokenizer: loading is measured, not tokenization."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    build_backbone(folder, {**QWEN3_1_7B, "num_hidden_layers": layers}, dtype, seed=0, vocab_size=vocab)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.add_special_tokens(["<|endoftext|>"])
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<|endoftext|>").save_pretrained(folder)


def measure(router: Path) -> dict[str, Any]:
    result = subprocess.run([sys.executable, "-c", _CHILD, str(router)], check=True, capture_output=True, text=True)
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    figures["load_increase_bytes"] = (figures["loaded_kib"] - figures["before_kib"]) * 1024
    figures["increase_bytes"] = (figures["peak_kib"] - figures["before_kib"]) * 1024
    figures["ratio"] = figures["increase_bytes"] / figures["backbone_bytes"]
    return figures


def measure_modes(
    layers: int, vocab: int, checkpoint_dtype: str, modes: Sequence[str], workdir: Path | None
) -> dict[str, dict[str, Any]]:
    """Figures per checkpoint mode, every router converted around one backbone so only the layout differs."""
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        backbone = Path(tmp) / "backbone"
        build_synthetic_backbone(backbone, layers, vocab, checkpoint_dtype)
        theta = np.random.default_rng(0).normal(size=QWEN3_1_7B["hidden_size"] * len(AGENTS) + len(AGENTS))
        results = {}
        for mode in modes:
            router = convert_router(Path(tmp), backbone, theta, QWEN3_1_7B["hidden_size"], mode, mode == "bundled")
            results[mode] = measure(router)
    return results


def table_lines(results: dict[str, dict[str, Any]], layers: int, vocab: int, checkpoint_dtype: str) -> list[str]:
    """The setup line (with this process's own peak, which the children's figures leave out), then the table."""
    import transformers

    lines = [
        f"Qwen3-1.7B geometry, {layers} layers, vocab {vocab:,}, saved in {checkpoint_dtype}, "
        f"loaded in float32; transformers {transformers.__version__}; own peak RSS "
        f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB while building",
        "| checkpoint | backbone weights | peak RSS increase: from_pretrained | + forward, all weights read | ratio |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for mode, figures in results.items():
        lines.append(
            f"| {mode} | {figures['backbone_bytes'] / 2**30:.2f} GiB ({figures['dtype']}) | "
            f"{figures['load_increase_bytes'] / 2**30:.2f} GiB | {figures['increase_bytes'] / 2**30:.2f} GiB | "
            f"{figures['ratio']:.2f} |"
        )
    return lines


if __name__ == "__main__":  # deprecated way in, kept until the next minor version
    from benchgen_router.bench import hand_over_to_command

    hand_over_to_command("benchgen_router.bench.load_memory", ["bench", "load-memory"])
