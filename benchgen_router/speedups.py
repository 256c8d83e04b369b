"""Ways of routing other than the package default, each measured side by side with the reference
by `benchgen-router bench` (docs/benchmark.md has the numbers).

The default, routing.run_router on a float32 router, already packs a decoder backbone's
queries several to a row (no padding computed) and gives the reference's picks. What a user can opt
into on top (SPEED_MODES, rows (d) of the benchmark) is one thing, asked for the way transformers
users ask for it, with a dtype:

    bf16    the backbone in bfloat16 (the head stays float32): fast where the CPU has AMX or
            avx512_bf16 (hardware.bf16_is_fast()), and on GPUs. Same packing.

            model, tokenizer = load_router(path, dtype="bfloat16")      # or `route --dtype bfloat16`,
            logits, embeddings = run_router(model, tokenizer, queries)   # pick_agent(..., dtype="bfloat16")

Modes that were measured and lost stay in TRIAL_MODES, so that the decision can be re-checked on
other hardware (`benchgen-router bench --modes padded,int8,compile,bf16-compile`); no
user-facing tool offers them.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class SpeedMode:
    """One way of running the router other than the float32 default.

    `dtype` is what to pass as load_router(dtype=...) / from_pretrained(dtype=...): converting
    after loading works too (apply_speed_mode does it) but holds both copies for a moment.
    `packed` False turns the model's packing off (config.pack_queries), so run_router pads.
    `transform` runs after loading (None: dtype only).
    """

    name: str
    dtype: str
    summary: str
    packed: bool = True
    transform: Callable[[Any], Any] | None = None


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
    "bf16": SpeedMode(
        name="bf16",
        dtype="bfloat16",
        summary="backbone in bfloat16 (AMX / avx512_bf16 on CPU, tensor cores on GPU), packed; head in float32",
    ),
}

TRIAL_MODES: dict[str, SpeedMode] = {
    "padded": SpeedMode(
        name="padded",
        dtype="float32",
        summary="float32 in length-sorted padded batches (pack_queries=False: the layout before packing)",
        packed=False,
    ),
    "bf16-padded": SpeedMode(
        name="bf16-padded",
        dtype="bfloat16",
        summary="bfloat16 in length-sorted padded batches (pack_queries=False)",
        packed=False,
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
    """Return the RouterModel `model` switched to `mode` (in place where possible); route it with
    routing.run_router as usual.

    The backbone is converted to the mode's dtype if it was loaded in another one; the head stays
    float32 so the logits are scored as the reference scores them.
    """
    spec = get_mode(mode)
    dtype = getattr(torch, spec.dtype)
    if model.backbone.dtype != dtype:
        model.backbone.to(dtype)
    model.head.float()
    model.config.pack_queries = spec.packed
    if spec.transform is not None:
        model = spec.transform(model)
    return model.eval()
