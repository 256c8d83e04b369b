"""The shared inference path of the tools: packed and padded batching, the numpy head, theta layout."""

from __future__ import annotations

import numpy as np
import pytest

import router_utils
from conftest import AGENTS, make_queries
from reference_impl import ReferenceRouter
from router_utils import (
    backbone_router,
    default_batch_tokens,
    head_logits,
    load_router,
    plan_batches,
    run_router,
    theta_to_state_dict,
)

QUERIES = make_queries(40, seed=11)


@pytest.mark.parametrize("hidden", [0, 8])
@pytest.mark.parametrize(
    "batching",
    [{}, {"max_batch_tokens": 300}, {"batch_size": 7}, {"max_batch_tokens": 1}, {"max_batch_tokens": 10**6}],
)
def test_run_router_matches_reference_in_input_order(converted, backbone_dir, hidden, batching):
    """Packed batches of any budget (one query per batch up to one batch for all), a query cap, and
    the default: each query's per-query reference result, in input order."""
    folder, theta = converted[hidden]
    ref = ReferenceRouter(str(backbone_dir), theta, AGENTS, hidden)
    model, tokenizer = load_router(folder)
    assert model.packs_queries
    logits, embeddings = run_router(model, tokenizer, QUERIES, **batching)
    ref_emb = np.concatenate([ref.embed([q]) for q in QUERIES])
    assert np.abs(embeddings - ref_emb).max() <= 1e-4
    assert np.abs(logits - ref.logits(ref_emb)).max() <= 1e-4
    assert len(set(logits.argmax(1))) > 1
    # the numpy head used by the trainer agrees with the torch head on the same embeddings
    assert np.abs(head_logits(theta, ref_emb, len(AGENTS), hidden)[0] - ref.logits(ref_emb)).max() <= 1e-9


@pytest.mark.parametrize("hidden", [0, 8])
def test_backbone_router_with_theta_is_the_converted_router(converted, backbone_dir, hidden):
    folder, theta = converted[hidden]
    model, tokenizer = backbone_router(str(backbone_dir), AGENTS, head_hidden_dim=hidden)
    model.head.load_state_dict(
        {k.removeprefix("head."): v for k, v in theta_to_state_dict(theta, 32, 5, hidden).items()}
    )
    converted_model, _ = load_router(folder)
    a, _ = run_router(model, tokenizer, QUERIES)
    b, _ = run_router(converted_model, tokenizer, QUERIES)
    assert np.array_equal(a, b)


def test_plan_batches_packs_short_queries_into_long_rows():
    lengths = [300, 10, 120, 130, 5, 250, 90]
    # Batch 1 is 300 wide (its longest query) with 600 // 300 = 2 rows, filled first-fit, longest
    # first ([0] and [5, 1, 4]); batch 2 is PACK_WIDTH (256) wide with 2 rows for the rest.
    assert plan_batches(lengths, packed=True, max_batch_tokens=600) == [[0, 5, 1, 4], [3, 2, 6]]
    assert plan_batches(lengths, packed=True, batch_size=2, max_batch_tokens=600) == [[0, 5], [3, 2], [6, 1], [4]]
    # one row per batch: each long query's row topped up with the longest short query that fits
    assert plan_batches(lengths, packed=True, max_batch_tokens=1) == [[0], [5, 4], [3, 2], [6, 1]]
    # padded: length-sorted, 16 per batch unless told otherwise
    assert plan_batches(lengths, packed=False) == [[0, 5, 3, 2, 6, 1, 4]]
    assert plan_batches(lengths, packed=False, batch_size=3) == [[0, 5, 3], [2, 6, 1], [4]]


def test_default_batch_tokens_follow_device_and_dtype():
    import torch

    assert default_batch_tokens("cpu", torch.float32) == 2048
    assert default_batch_tokens("cpu", torch.bfloat16) == 4096
    assert default_batch_tokens("cuda:0", torch.float32) == 32768


def test_emulated_bfloat16_is_warned_about(converted, monkeypatch, caplog):
    """Where the CPU lacks AMX / avx512_bf16 (faked: this machine has them), loading in bfloat16 warns."""
    folder, _ = converted[0]
    monkeypatch.setattr(router_utils, "cpu_features", lambda: {"avx512_bf16": False, "amx_bf16": False})
    load_router(folder, dtype="bfloat16")
    assert "bfloat16 is emulated" in caplog.text
    caplog.clear()
    load_router(folder, dtype="float32")
    assert "emulated" not in caplog.text


def test_head_logits_scores_a_population_at_once():
    rng = np.random.default_rng(0)
    thetas, emb = rng.normal(size=(6, 4 * 3 + 3)), rng.normal(size=(10, 4))
    stacked = head_logits(thetas, emb, 3, 0)
    assert stacked.shape == (6, 10, 3)
    for p in range(6):
        assert np.allclose(stacked[p], emb @ thetas[p, :12].reshape(4, 3) + thetas[p, 12:])
