"""head.py: the flat theta layout (docs/reference.md, "Head"), its state dict, the vectorised numpy head
and the float32 finiteness rule."""

from __future__ import annotations

import numpy as np
import pytest

from benchgen_router.errors import InputError
from benchgen_router.head import check_float32_finite, head_logits, head_param_count, head_picks, theta_to_state_dict


def test_parameter_counts_of_both_head_shapes():
    assert head_param_count(2048, 5, 0) == 10_245  # the release
    assert head_param_count(384, 5, 0) == 1_925  # the committed default router
    assert head_param_count(4, 3, 2) == 4 * 2 + 2 + 2 * 3 + 3


def test_state_dict_is_the_reference_layout_transposed_for_nn_linear():
    theta = np.arange(4 * 3 + 3, dtype=np.float64)
    state = theta_to_state_dict(theta, 4, 3, 0)
    # docs/reference.md: W = theta[:D*N].reshape(D, N) row-major, b = theta[D*N:]; nn.Linear stores W.T
    assert np.array_equal(state["head.weight"].numpy(), theta[:12].reshape(4, 3).T.astype(np.float32))
    assert np.array_equal(state["head.bias"].numpy(), theta[12:].astype(np.float32))
    mlp = theta_to_state_dict(np.arange(head_param_count(4, 3, 2), dtype=np.float64), 4, 3, 2)
    assert [tuple(v.shape) for v in mlp.values()] == [(2, 4), (2,), (3, 2), (3,)]


def test_head_logits_scores_a_population_at_once():
    rng = np.random.default_rng(0)
    thetas, emb = rng.normal(size=(6, 4 * 3 + 3)), rng.normal(size=(10, 4))
    stacked = head_logits(thetas, emb, 3, 0)
    assert stacked.shape == (6, 10, 3)
    for p in range(6):
        assert np.allclose(stacked[p], emb @ thetas[p, :12].reshape(4, 3) + thetas[p, 12:])
    mlp_theta = rng.normal(size=head_param_count(4, 3, 2))
    w1, b1 = mlp_theta[:8].reshape(4, 2), mlp_theta[8:10]
    w2, b2 = mlp_theta[10:16].reshape(2, 3), mlp_theta[16:]
    assert np.allclose(head_logits(mlp_theta, emb, 3, 2)[0], np.tanh(emb @ w1 + b1) @ w2 + b2)
    assert np.array_equal(head_picks(mlp_theta, emb, 3, 2), (np.tanh(emb @ w1 + b1) @ w2 + b2).argmax(axis=1))


@pytest.mark.parametrize("value", [1e300, -4e38, np.inf, np.nan])
def test_values_that_are_not_finite_in_float32_are_refused(value):
    theta = np.zeros(15)
    theta[2] = value
    with pytest.raises(InputError, match="overflow float32"):
        check_float32_finite(theta, "head")
    check_float32_finite(np.full(15, 3.0e38), "head")  # the largest finite float32 values pass
