"""The shared inference path of the tools: length-sorted batching, the numpy head, theta layout."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import AGENTS, make_queries
from reference_impl import ReferenceRouter
from router_utils import backbone_router, head_logits, load_router, run_router, theta_to_state_dict

QUERIES = make_queries(40, seed=11)


@pytest.mark.parametrize("hidden", [0, 8])
def test_run_router_matches_reference_in_input_order(converted, backbone_dir, hidden):
    folder, theta = converted[hidden]
    ref = ReferenceRouter(str(backbone_dir), theta, AGENTS, hidden)
    model, tokenizer = load_router(folder)
    logits, embeddings = run_router(model, tokenizer, QUERIES, batch_size=7)
    ref_emb = np.concatenate([ref.embed([q]) for q in QUERIES])
    assert np.abs(embeddings - ref_emb).max() <= 1e-4
    assert np.abs(logits - ref.logits(ref_emb)).max() <= 1e-4
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


def test_head_logits_scores_a_population_at_once():
    rng = np.random.default_rng(0)
    thetas, emb = rng.normal(size=(6, 4 * 3 + 3)), rng.normal(size=(10, 4))
    stacked = head_logits(thetas, emb, 3, 0)
    assert stacked.shape == (6, 10, 3)
    for p in range(6):
        assert np.allclose(stacked[p], emb @ thetas[p, :12].reshape(4, 3) + thetas[p, 12:])
