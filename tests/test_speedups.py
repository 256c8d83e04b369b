"""speedups.py: the offered bf16 mode keeps the float32 picks on tiny routers; the trial modes the
benchmark can still run do what they say."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchgen_router import speedups
from benchgen_router.loading import load_router
from benchgen_router.routing import run_router
from helpers import make_queries

QUERIES = make_queries(48, seed=7)


@pytest.fixture(scope="module")
def float32_result(converted):
    folder, _ = converted[0]
    model, tokenizer = load_router(folder)
    return run_router(model, tokenizer, QUERIES)


def agreement(logits: np.ndarray, reference: np.ndarray) -> float:
    return float((logits.argmax(axis=1) == reference.argmax(axis=1)).mean())


def relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("loaded_as", ["bfloat16", "float32"])
def test_bf16_mode_keeps_the_picks(converted, float32_result, loaded_as):
    """Loaded in bfloat16 (the recommended way) or converted after a float32 load: same result,
    still packed."""
    folder, _ = converted[0]
    model, tokenizer = load_router(folder, dtype=loaded_as, allow_emulated_bf16=True)  # tiny: fast anyway
    model = speedups.apply_speed_mode(model, "bf16")
    assert model.backbone.dtype == torch.bfloat16 and model.packs_queries
    assert all(p.dtype == torch.float32 for p in model.head.parameters())  # the head scores in float32
    logits, embeddings = run_router(model, tokenizer, QUERIES)
    ref_logits, ref_embeddings = float32_result
    assert logits.dtype == np.float32 and embeddings.dtype == np.float32
    assert relative(embeddings, ref_embeddings) < 2e-2
    assert agreement(logits, ref_logits) >= 0.95


def test_padded_trial_mode_turns_packing_off_with_the_same_result(converted, float32_result):
    folder, _ = converted[0]
    model, tokenizer = load_router(folder)
    model = speedups.apply_speed_mode(model, "padded")
    assert not model.packs_queries
    logits, _ = run_router(model, tokenizer, QUERIES)
    assert np.abs(logits - float32_result[0]).max() < 1e-4


def test_int8_trial_mode_quantizes_the_backbone_only(converted, float32_result):
    folder, _ = converted[0]
    model, tokenizer = load_router(folder)
    model = speedups.apply_speed_mode(model, "int8")
    from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

    kinds = {type(m) for m in model.backbone.modules()}
    assert DynamicQuantizedLinear in kinds and torch.nn.Linear not in kinds
    assert isinstance(model.head, torch.nn.Linear)
    logits, embeddings = run_router(model, tokenizer, QUERIES)
    ref_logits, ref_embeddings = float32_result
    assert relative(embeddings, ref_embeddings) < 0.1
    assert agreement(logits, ref_logits) >= 0.8


def test_modes_are_offered_or_on_trial_never_both():
    assert not set(speedups.SPEED_MODES) & set(speedups.TRIAL_MODES)
    for name, mode in {**speedups.SPEED_MODES, **speedups.TRIAL_MODES}.items():
        assert mode.name == name
        assert isinstance(getattr(torch, mode.dtype), torch.dtype)
    with pytest.raises(ValueError, match="unknown speed mode 'turbo'; offered: bf16"):
        speedups.get_mode("turbo")
