"""speedups.py: packing computes what run_router computes; the offered bf16 mode keeps the float32
picks on tiny routers; the trial modes the benchmark can still run do what they say."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import speedups
from conftest import make_queries
from router_utils import load_router, run_router

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


@pytest.mark.parametrize(("max_tokens", "min_width"), [(2048, 256), (40, 8), (100_000, 1)])
def test_packed_matches_run_router(converted, float32_result, max_tokens, min_width):
    """Any packing (one row per query, many per row, one batch or many) gives run_router's result."""
    folder, _ = converted[0]
    model, tokenizer = load_router(folder)
    logits, embeddings = speedups.run_packed(model, tokenizer, QUERIES, max_tokens=max_tokens, min_width=min_width)
    ref_logits, ref_embeddings = float32_result
    assert logits.dtype == np.float32 and embeddings.dtype == np.float32
    assert np.abs(logits - ref_logits).max() < 1e-4
    assert relative(embeddings, ref_embeddings) < 1e-5
    assert agreement(logits, ref_logits) == 1.0


def test_packed_mlp_head_and_mode(converted):
    folder, _ = converted[8]
    model, tokenizer = load_router(folder)
    ref_logits, _ = run_router(model, tokenizer, QUERIES[:10])
    logits, _ = speedups.run_mode(model, tokenizer, QUERIES[:10], "packed")
    assert np.abs(logits - ref_logits).max() < 1e-4


def test_packed_refuses_an_empty_query(converted):
    folder, _ = converted[0]
    model, tokenizer = load_router(folder)
    with pytest.raises(ValueError, match=r"position\(s\) \[1\] has no tokens"):
        speedups.run_packed(model, tokenizer, ["a query", ""])


def test_plan_batches_packs_short_queries_into_long_rows():
    lengths = [300, 10, 120, 130, 5, 250, 90]
    batches = speedups.plan_batches(lengths, max_tokens=600, min_width=256)
    # Batch 1 is 300 wide (its longest query) with 600 // 300 = 2 rows, filled first-fit, longest
    # first; batch 2 is min_width wide with 2 rows for what is left.
    assert batches == [[[0], [5, 1, 4]], [[3, 2], [6]]]
    one_row = speedups.plan_batches(lengths, max_tokens=1, min_width=256)
    assert all(len(batch) == 1 for batch in one_row)  # never an empty batch
    assert sorted(i for batch in one_row for row in batch for i in row) == list(range(len(lengths)))


def test_only_causal_decoders_are_packed(converted):
    from transformers import BertConfig, BertModel

    folder, _ = converted[0]
    model, _ = load_router(folder)
    assert speedups.is_causal_decoder(model.backbone)  # Qwen3
    bert = BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64))
    assert not speedups.is_causal_decoder(bert)  # an encoder would see its pack neighbours


@pytest.mark.parametrize("loaded_as", ["bfloat16", "float32"])
def test_bf16_mode_keeps_the_picks(converted, float32_result, loaded_as):
    """Loaded in bfloat16 (the recommended way) or converted after a float32 load: same result."""
    folder, _ = converted[0]
    model, tokenizer = load_router(folder, dtype=loaded_as)
    model = speedups.apply_speed_mode(model, "bf16")
    assert model.backbone.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in model.head.parameters())  # the head scores in float32
    logits, embeddings = speedups.run_mode(model, tokenizer, QUERIES, "bf16")
    ref_logits, ref_embeddings = float32_result
    assert logits.dtype == np.float32 and embeddings.dtype == np.float32
    assert relative(embeddings, ref_embeddings) < 2e-2
    assert agreement(logits, ref_logits) >= 0.95


def test_int8_trial_mode_quantizes_the_backbone_only(converted, float32_result):
    folder, _ = converted[0]
    model, tokenizer = load_router(folder)
    model = speedups.apply_speed_mode(model, "int8")
    from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

    kinds = {type(m) for m in model.backbone.modules()}
    assert DynamicQuantizedLinear in kinds and torch.nn.Linear not in kinds
    assert isinstance(model.head, torch.nn.Linear)
    logits, embeddings = speedups.run_mode(model, tokenizer, QUERIES, "int8")
    ref_logits, ref_embeddings = float32_result
    assert relative(embeddings, ref_embeddings) < 0.1
    assert agreement(logits, ref_logits) >= 0.8


def test_modes_are_offered_or_on_trial_never_both():
    assert not set(speedups.SPEED_MODES) & set(speedups.TRIAL_MODES)
    for name, mode in {**speedups.SPEED_MODES, **speedups.TRIAL_MODES}.items():
        assert mode.name == name and mode.batch_size >= 1 and mode.max_tokens >= 1
        assert isinstance(getattr(torch, mode.dtype), torch.dtype)
    assert speedups.SPEED_MODES["bf16"].batching() == "packed <= 4096 tokens"
    with pytest.raises(ValueError, match="unknown speed mode 'turbo'; offered: packed, bf16"):
        speedups.get_mode("turbo")


def test_bf16_is_fast_follows_the_cpu_flags():
    features = speedups.cpu_features()
    assert set(features) >= {"avx512_bf16", "amx_bf16"} and all(isinstance(v, bool) for v in features.values())
    assert speedups.bf16_is_fast("cpu") == (features["avx512_bf16"] or features["amx_bf16"])
