"""training/matrix_factorisation.py: the MF router learns which agent answers which query, from the query
embedding alone, deterministically for a seed, and refuses what it cannot fit."""

from __future__ import annotations

import numpy as np
import pytest

from benchgen_router.errors import InputError
from benchgen_router.training.matrix_factorisation import fit_matrix_factorisation


def known_pool(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(embeddings, sampled outcomes, true probabilities): 4 agents, each right on its own direction of a
    16-d embedding (a low-rank truth, what factorisation can learn)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 16)).astype(np.float32)
    directions = rng.normal(size=(4, 16))
    p = 1 / (1 + np.exp(-3 * (x @ directions.T) / np.sqrt(16)))
    return x, (rng.random(p.shape) < p).astype(np.float64), p


def test_it_learns_the_agents_strengths_and_is_deterministic():
    x, y, p = known_pool(3000)
    router = fit_matrix_factorisation(x[:2500], y[:2500], seed=0)
    predicted = router.predict(x[2500:])
    assert predicted.shape == (500, 4) and ((predicted > 0) & (predicted < 1)).all()
    # The truth's own log loss bounds what any model reaches; a constant per agent is far worse.
    held = y[2500:]

    def log_loss(q: np.ndarray) -> float:
        return float(-np.mean(held * np.log(q) + (1 - held) * np.log(1 - q)))

    constant = np.broadcast_to(y[:2500].mean(axis=0), held.shape)
    assert log_loss(predicted) < log_loss(p[2500:]) + 0.05 < log_loss(constant)
    # Which agent is most likely right agrees with the truth on most queries.
    assert (predicted.argmax(axis=1) == p[2500:].argmax(axis=1)).mean() > 0.7
    again = fit_matrix_factorisation(x[:2500], y[:2500], seed=0)
    np.testing.assert_array_equal(again.predict(x[2500:]), predicted)
    assert 1 <= router.epochs <= 60 and np.isfinite(router.validation_loss)


def test_bad_input_is_one_line():
    x, y, _ = known_pool(50)
    with pytest.raises(InputError, match="rewards in"):
        fit_matrix_factorisation(x, y * 2)
    with pytest.raises(InputError, match="n >= 10"):
        fit_matrix_factorisation(x[:5], y[:5])
