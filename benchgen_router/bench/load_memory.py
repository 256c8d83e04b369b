"""Peak memory of loading a router, against the size of its backbone's weights.

    python -m benchgen_router.bench.load_memory                 # Qwen3-1.7B geometry, 28 layers (~6.9 GB float32)
    python -m benchgen_router.bench.load_memory --layers 2 --vocab 32000
    python -m benchgen_router.bench.load_memory --checkpoint-dtype float32

Builds a synthetic backbone with Qwen3-1.7B's geometry (random weights),
saved in bfloat16 as Qwen/Qwen3-1.7B ships (or float32), converts a random head against it in both
checkpoint modes, then loads each router in float32 through AutoModel.from_pretrained(...,
trust_remote_code=True) in a fresh process and reports the increase in peak RSS over the process's
RSS just before loading, after loading and after a first forward pass plus a read of every weight
(which makes memory-mapped weights resident). Loading that materialised the backbone twice (a
random init overwritten by the checkpoint) would show a ratio of 2 or more; keeping a memory-mapped
bfloat16 checkpoint resident while upcasting it, about 1.5.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benchgen_router.bench.routing import AGENTS, QWEN3_1_7B, build_backbone, convert_router

# Run in a fresh interpreter so that nothing else this script did counts towards the peak.
# ru_maxrss survives exec (it would report the parent's peak): read VmHWM/VmRSS (KiB) instead.
_CHILD = """
import json, sys
import torch, transformers
from transformers import AutoModel
def status(key):
    line = next(l for l in open("/proc/self/status") if l.startswith(key + ":"))
    return int(line.split()[1])
before = status("VmRSS")
model = AutoModel.from_pretrained(sys.argv[1], trust_remote_code=True)
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
    """Qwen3-1.7B geometry with random weights (the routing benchmark's builder), saved like a Hub repo with
    a minimal tokenizer (loading is measured, not tokenization)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    build_backbone(folder, {**QWEN3_1_7B, "num_hidden_layers": layers}, dtype, seed=0, vocab_size=vocab)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.add_special_tokens(["<|endoftext|>"])
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<|endoftext|>").save_pretrained(folder)


def measure(router: Path) -> dict:
    result = subprocess.run([sys.executable, "-c", _CHILD, str(router)], check=True, capture_output=True, text=True)
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    figures["load_increase_bytes"] = (figures["loaded_kib"] - figures["before_kib"]) * 1024
    figures["increase_bytes"] = (figures["peak_kib"] - figures["before_kib"]) * 1024
    figures["ratio"] = figures["increase_bytes"] / figures["backbone_bytes"]
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=28, help="decoder layers (Qwen3-1.7B has 28)")
    parser.add_argument("--vocab", type=int, default=151_936, help="vocabulary size (Qwen3-1.7B: 151,936)")
    parser.add_argument("--modes", nargs="+", default=["head-only", "bundled"], choices=["head-only", "bundled"])
    parser.add_argument(
        "--checkpoint-dtype",
        default="bfloat16",
        choices=["bfloat16", "float32"],
        help="dtype the backbone is saved in; the router loads it in float32 "
        "(default: %(default)s, as Qwen3-1.7B ships)",
    )
    parser.add_argument("--workdir", type=Path, help="where to build the synthetic checkpoints (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)

    import transformers

    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        backbone = Path(tmp) / "backbone"
        build_synthetic_backbone(backbone, args.layers, args.vocab, args.checkpoint_dtype)
        theta = np.random.default_rng(0).normal(size=QWEN3_1_7B["hidden_size"] * len(AGENTS) + len(AGENTS))
        results = {}
        for mode in args.modes:
            router = convert_router(Path(tmp), backbone, theta, QWEN3_1_7B["hidden_size"], mode, mode == "bundled")
            results[mode] = measure(router)
    if args.json:
        print(json.dumps(results))
        return 0
    print(
        f"Qwen3-1.7B geometry, {args.layers} layers, vocab {args.vocab:,}, saved in {args.checkpoint_dtype}, "
        f"loaded in float32; transformers {transformers.__version__}; own peak RSS "
        f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB while building"
    )
    print(
        "| checkpoint | backbone weights | peak RSS increase: from_pretrained | + forward, all weights read | ratio |"
    )
    print("| --- | ---: | ---: | ---: | ---: |")
    for mode, figures in results.items():
        print(
            f"| {mode} | {figures['backbone_bytes'] / 2**30:.2f} GiB ({figures['dtype']}) | "
            f"{figures['load_increase_bytes'] / 2**30:.2f} GiB | {figures['increase_bytes'] / 2**30:.2f} GiB | "
            f"{figures['ratio']:.2f} |"
        )
    return 0


if __name__ == "__main__":
    from benchgen_router.cli.common import configure_output

    configure_output(verbose=False)
    sys.exit(main())
