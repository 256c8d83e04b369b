"""Faster routing paths, each measured side by side with the reference by bench_routing.py.

The package's default path, router_utils.run_router on a float32 backbone, reproduces the
reference's picks, but pads every query of a batch to the longest one: on mixed-length queries a
third to a half of its work is padding. The modes offered here (SPEED_MODES) won on the benchmark
(docs/benchmark.md has the numbers):

    packed  float32, queries packed several to a row so no padding is computed: the same picks
    bf16    the same packing with the backbone in bfloat16 (the head stays float32): fast where the
            CPU has AMX or avx512_bf16 (bf16_is_fast()), and on GPUs

Use one like this (load in the mode's dtype, so no float32 copy is ever built):

    from router_utils import load_router
    from speedups import SPEED_MODES, apply_speed_mode, run_mode

    model, tokenizer = load_router(path, dtype=SPEED_MODES["bf16"].dtype)
    model = apply_speed_mode(model, "bf16")
    logits, embeddings = run_mode(model, tokenizer, queries, "bf16")

Modes that were measured and lost stay in TRIAL_MODES, so that the decision can be re-checked on
other hardware (`python bench_routing.py --modes int8,compile,bf16-compile,bf16-padded`); no
user-facing tool offers them.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from router_utils import run_router


@dataclass(frozen=True)
class SpeedMode:
    """One way of running the router faster than the padded float32 default.

    `dtype` is what to pass as load_router(dtype=...) / from_pretrained(dtype=...): converting
    after loading works too (apply_speed_mode does it) but holds both copies for a moment.
    `packed`: route with run_packed (several queries per row, no padding computed) in batches of
    at most `max_tokens` positions; otherwise router_utils.run_router with `batch_size` queries.
    `transform` runs after loading (None: dtype only).
    """

    name: str
    dtype: str
    summary: str
    packed: bool = True
    max_tokens: int = 2048
    batch_size: int = 16
    transform: Callable[[Any], Any] | None = None

    def batching(self, max_tokens: int | None = None) -> str:
        """How run_mode batches, for a table: e.g. 'packed <= 4096 tokens'."""
        if self.packed:
            return f"packed <= {max_tokens or self.max_tokens} tokens"
        return f"{max_tokens or self.batch_size} queries"


def _compile_backbone(model: Any) -> Any:
    """torch.compile each decoder layer in place (regional compilation: the layers share one
    compiled graph, so compiling costs seconds instead of minutes for 28 layers; state_dict keys
    are kept). Dynamic shapes, because every batch has another width and row count."""
    layers = getattr(model.backbone, "layers", None)
    for module in layers if isinstance(layers, nn.ModuleList) else [model.backbone]:
        module.compile(dynamic=True)
    return model


def _int8_backbone(model: Any) -> Any:
    """Dynamic int8 quantization of the backbone's Linear layers (weights int8 per tensor,
    activations quantized per batch); CPU only."""
    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():  # torch 2.10+ announces the move of this API to torchao
        warnings.simplefilter("ignore")
        quantize_dynamic(model.backbone, {nn.Linear}, dtype=torch.qint8, inplace=True)
    return model


SPEED_MODES: dict[str, SpeedMode] = {
    "packed": SpeedMode(
        name="packed",
        dtype="float32",
        summary="float32, queries packed several to a row (no padding computed): the reference's picks",
    ),
    "bf16": SpeedMode(
        name="bf16",
        dtype="bfloat16",
        summary="backbone in bfloat16 (AMX / avx512_bf16 on CPU, tensor cores on GPU), packed; head in float32",
        max_tokens=4096,
    ),
}

TRIAL_MODES: dict[str, SpeedMode] = {
    "bf16-padded": SpeedMode(
        name="bf16-padded",
        dtype="bfloat16",
        summary="bfloat16 through run_router's length-sorted padded batches (what dtype=bfloat16 gives today)",
        packed=False,
        batch_size=32,
    ),
    "int8": SpeedMode(
        name="int8",
        dtype="float32",
        summary="dynamic int8 quantization of the backbone's Linear layers (CPU), packed",
        transform=_int8_backbone,
    ),
    "compile": SpeedMode(
        name="compile",
        dtype="float32",
        summary="torch.compile(dynamic=True) of the float32 backbone, packed",
        transform=_compile_backbone,
    ),
    "bf16-compile": SpeedMode(
        name="bf16-compile",
        dtype="bfloat16",
        summary="torch.compile(dynamic=True) of the bfloat16 backbone, packed",
        max_tokens=4096,
        transform=_compile_backbone,
    ),
}


def get_mode(name: str) -> SpeedMode:
    """The SpeedMode called `name`, offered or on trial; ValueError naming the choices otherwise."""
    mode = SPEED_MODES.get(name) or TRIAL_MODES.get(name)
    if mode is None:
        raise ValueError(
            f"unknown speed mode '{name}'; offered: {', '.join(SPEED_MODES)} "
            f"(measured and not offered: {', '.join(TRIAL_MODES)})"
        )
    return mode


def apply_speed_mode(model: Any, mode: str) -> Any:
    """Return the RouterModel `model` switched to `mode` (in place where possible).

    The backbone is converted to the mode's dtype if it was loaded in another one; the head stays
    float32 so the logits are scored as the reference scores them.
    """
    spec = get_mode(mode)
    dtype = getattr(torch, spec.dtype)
    if model.backbone.dtype != dtype:
        model.backbone.to(dtype)
    model.head.float()
    if spec.transform is not None:
        model = spec.transform(model)
    return model.eval()


def run_mode(
    model: Any, tokenizer: Any, texts: Sequence[str], mode: str, max_tokens: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(logits, embeddings) of texts in input order with `mode`'s batching (model already switched
    with apply_speed_mode). max_tokens overrides the mode's packed-batch budget, or is read as
    the number of queries per batch for an unpacked mode."""
    spec = get_mode(mode)
    if spec.packed:
        return run_packed(model, tokenizer, texts, max_tokens=max_tokens or spec.max_tokens)
    return run_router(model, tokenizer, texts, batch_size=max_tokens or spec.batch_size)


def cpu_features() -> dict[str, bool]:
    """Which matrix-unit features this CPU reports (Linux /proc/cpuinfo): bfloat16 is fast only
    with avx512_bf16 or AMX; without them oneDNN emulates it and bf16 can be slower than float32."""
    flags: set[str] = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    names = ("avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "avx512_fp16")
    return {name: name in flags for name in names}


def bf16_is_fast(device: str = "cpu") -> bool:
    """True where bfloat16 matrix products run on hardware made for them (check before choosing
    the bf16 mode): a CUDA GPU with bf16 support, or a CPU with avx512_bf16 / AMX."""
    if device.startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    features = cpu_features()
    return features["avx512_bf16"] or features["amx_bf16"]


# ---------------------------------------------------------------------------------------------
# Packed batches: several queries per row, no padding computed


def is_causal_decoder(backbone: Any) -> bool:
    """True for decoder-only backbones (Qwen, Llama, ...): a query packed behind another one sees
    only its own tokens under a block-diagonal causal mask, exactly as it would alone. Encoders
    (BERT and kin, which also appear in the causal-LM mapping) are not packed."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    model_type = getattr(backbone.config, "model_type", None)
    return model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES


def plan_batches(lengths: Sequence[int], max_tokens: int, min_width: int) -> list[list[list[int]]]:
    """Queries (by index) packed into batches of rows, each batch at most max_tokens positions.

    A batch is as wide as the longest query left (at least min_width) and has max_tokens // width
    rows (at least one), filled first-fit with the longest queries left, so short queries fill the
    tails of long rows and nothing else is padding. max_tokens trades matrix-unit efficiency
    (longer matrices) against activation memory.
    """
    remaining = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[list[int]]] = []
    while remaining:
        width = max(min_width, lengths[remaining[0]])
        rows: list[list[int]] = [[] for _ in range(max(1, max_tokens // width))]
        room = [width] * len(rows)
        left = []
        for index in remaining:
            slot = next((r for r, free in enumerate(room) if free >= lengths[index]), None)
            if slot is None:
                left.append(index)
            else:
                rows[slot].append(index)
                room[slot] -= lengths[index]
        batches.append([row for row in rows if row])
        remaining = left
    return batches


def run_packed(
    model: Any,
    tokenizer: Any,
    texts: Sequence[str],
    max_tokens: int = 2048,
    min_width: int = 256,
) -> tuple[np.ndarray, np.ndarray]:
    """(logits, embeddings) for texts in input order, as router_utils.run_router returns them,
    computing no padding: queries are packed several to a row, each attending only to itself
    (block-diagonal causal mask, positions restarting at 0) and mean-pooled over its own tokens in
    float32, then scored by the model's float32 head. Length-sorted padded batches still waste
    a third to a half of the work on mixed-length queries; packing wastes only a row's tail.

    Falls back to run_router for backbones that are not causal decoders.
    """
    if not is_causal_decoder(model.backbone):
        return run_router(model, tokenizer, texts)
    encoded = tokenizer(list(texts), truncation=True, max_length=model.config.truncation_length)["input_ids"]
    lengths = [len(ids) for ids in encoded]
    empty = [i for i, n in enumerate(lengths) if n == 0]
    if empty:
        raise ValueError(f"Query at position(s) {empty} has no tokens (an empty string?); drop empty queries first.")
    device = next(model.backbone.parameters()).device
    head = next(model.head.parameters())
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    takes_cache = "use_cache" in inspect.signature(model.backbone.forward).parameters
    # Per-query sums of the last hidden state, accumulated in float32 where the backbone runs.
    sums = torch.zeros(len(texts), model.config.embedding_dim, dtype=torch.float32, device=device)
    with torch.inference_mode():
        for batch in plan_batches(lengths, max_tokens, min_width):
            width = max(sum(lengths[i] for i in row) for row in batch)
            ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
            positions = torch.zeros((len(batch), width), dtype=torch.long)
            segment = torch.full((len(batch), width), -1, dtype=torch.long)
            for r, row in enumerate(batch):
                start = 0
                for index in row:
                    end = start + lengths[index]
                    ids[r, start:end] = torch.tensor(encoded[index])
                    positions[r, start:end] = torch.arange(lengths[index])
                    segment[r, start:end] = index
                    start = end
            causal = torch.ones(width, width, dtype=torch.bool).tril()
            mask = (segment[:, :, None] == segment[:, None, :]) & causal
            mask |= torch.eye(width, dtype=torch.bool)  # padding attends to itself: no all-masked row, no NaN
            inputs: dict[str, Any] = {
                "input_ids": ids.to(device),
                "attention_mask": mask[:, None].to(device),
                "position_ids": positions.to(device),
            }
            if takes_cache:  # one forward pass: a KV cache would only hold a copy of every layer's keys and values
                inputs["use_cache"] = False
            hidden = model.backbone(**inputs).last_hidden_state
            real = (segment >= 0).flatten()
            flat = hidden.flatten(0, 1)[real.to(device)].to(torch.float32)
            sums.index_add_(0, segment.flatten()[real].to(device), flat)
        embeddings = sums / torch.tensor(lengths, dtype=torch.float32, device=device)[:, None]
        logits = model.head(embeddings.to(device=head.device, dtype=head.dtype))
    return logits.float().cpu().numpy(), embeddings.cpu().numpy()
