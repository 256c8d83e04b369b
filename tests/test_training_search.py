"""training/search.py: the separable CMA-ES search (it finds what there is to find, deterministic per seed,
keeps the best candidate ever seen), the vectorised fitness, and the settings the libraries accept."""

from __future__ import annotations

import numpy as np
import pytest

from benchgen_router.errors import InputError
from benchgen_router.evaluation.metrics import baselines
from benchgen_router.head import head_logits
from benchgen_router.training.search import fitness, population_picks, search_head, search_heads
from helpers import AGENTS


def clustered(rows: int = 100, dim: int = 16, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Embeddings in 5 clusters where agent k is uniquely best (reward 1) on cluster k."""
    rng = np.random.default_rng(seed)
    labels = np.arange(rows) % len(AGENTS)
    embeddings = rng.normal(scale=3, size=(len(AGENTS), dim))[labels] + rng.normal(size=(rows, dim))
    rewards = rng.uniform(0, 0.5, size=(rows, len(AGENTS)))
    rewards[np.arange(rows), labels] = 1.0
    return embeddings, rewards


@pytest.mark.parametrize("library", ["pycma", "cmaes"])
@pytest.mark.parametrize("hidden", [0, 4])
def test_search_finds_the_best_agent_of_each_cluster(library, hidden):
    embeddings, rewards = clustered()
    result = search_head(embeddings, rewards, hidden_dim=hidden, generations=60, seed=42, library=library)
    oracle, best_fixed = baselines(rewards)["oracle"], baselines(rewards)["best_fixed_agent"]
    assert result.train_reward >= 0.95 * oracle > best_fixed
    # the returned theta really scores what the search reported
    assert fitness(result.theta[None], embeddings, rewards, hidden)[0] == pytest.approx(result.train_reward)
    assert result.generations_run == len(result.history) == 60


def test_fitness_scores_a_whole_population_like_one_head_at_a_time():
    embeddings, rewards = clustered(rows=30, dim=6)
    rng = np.random.default_rng(3)
    for hidden, size in ((0, 6 * 5 + 5), (3, 6 * 3 + 3 + 3 * 5 + 5)):
        thetas = rng.normal(size=(9, size))
        one_by_one = [rewards[np.arange(30), head_logits(t, embeddings, 5, hidden)[0].argmax(1)].mean() for t in thetas]
        assert np.allclose(fitness(thetas, embeddings, rewards, hidden), one_by_one)


@pytest.mark.parametrize("library", ["pycma", "cmaes"])
def test_same_seed_same_theta_other_seed_other_theta(library):
    embeddings, rewards = clustered(rows=40, dim=8)
    run = lambda seed: search_head(embeddings, rewards, generations=8, seed=seed, library=library).theta  # noqa: E731
    assert np.array_equal(run(42), run(42))
    assert np.array_equal(run(0), run(0))  # seed 0 is a seed like any other, not "seed from the clock"
    assert not np.array_equal(run(42), run(43))


def test_best_candidate_ever_seen_is_kept():
    embeddings, rewards = clustered(rows=60, dim=8, seed=5)
    result = search_head(embeddings, rewards, generations=25, seed=1, sigma0=2.0)
    best_so_far = [h["best_reward"] for h in result.history]
    per_generation = [h["generation_best"] for h in result.history]
    assert best_so_far == list(np.maximum.accumulate(per_generation))
    assert result.train_reward == max(per_generation)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"seed": -1}, "seed must be an integer from 0"),
        ({"seed": 2**32}, "seed must be an integer from 0"),
        ({"popsize": 2}, "popsize must be at least 4"),
        ({"sigma0": 1e308}, "sigma0 must be a positive step size"),
        ({"sigma0": 0.0}, "sigma0 must be a positive step size"),
        ({"sigma0": float("nan")}, "sigma0 must be a positive step size"),
        ({"generations": 0}, "generations must be at least 1"),
        ({"library": "nevergrad"}, "unknown CMA-ES library"),
    ],
)
def test_settings_the_libraries_would_reject_are_refused_first(settings, message):
    """numpy refuses seed -1, pycma stops a popsize-2 search with "unused injected direction", and a
    sigma0 of 1e308 trains infinite weights: each is one clear line before any work."""
    embeddings, rewards = clustered(rows=20)
    with pytest.raises(InputError, match=message):
        search_head(embeddings, rewards, generations=settings.pop("generations", 3), **settings)


@pytest.mark.parametrize(("agents", "hidden"), [(2, 0), (3, 0), (5, 0), (2, 3), (5, 4)])
def test_population_picks_are_the_argmax_of_each_heads_logits(agents, hidden):
    """The one-product picks (logit differences to agent 0 for a linear head) against head_logits'
    argmax computed one head at a time; exact ties are constructed too (equal columns), where
    np.argmax takes the first agent."""
    rng = np.random.default_rng(agents * 10 + hidden)
    embeddings = rng.normal(size=(200, 7))
    size = 7 * agents + agents if hidden == 0 else 7 * hidden + hidden + hidden * agents + agents
    thetas = rng.normal(size=(11, size))
    if hidden == 0:  # candidate 0: agents 0 and 1 score alike on every row, so each row is a tie
        weight = thetas[0, : 7 * agents].reshape(7, agents)
        weight[:, 1] = weight[:, 0]
        thetas[0, 7 * agents + 1] = thetas[0, 7 * agents]
    picks = population_picks(thetas, embeddings, agents, hidden)
    assert picks.shape == (200, 11)
    for candidate, theta in enumerate(thetas):
        assert np.array_equal(picks[:, candidate], head_logits(theta, embeddings, agents, hidden)[0].argmax(axis=-1))
    if hidden == 0:
        assert not (picks[:, 0] == 1).any()


@pytest.mark.parametrize("hidden", [0, 3])
def test_searches_in_lockstep_are_each_the_single_search(hidden):
    """search_heads runs several searches through one product per generation; every result (head,
    reward, history) is exactly what search_head gives for that target and seed alone."""
    embeddings, rewards = clustered(rows=80, dim=6)
    targets = [rewards, rewards - 0.3 * np.linspace(0, 1, 5), rewards[:, ::-1].copy()]
    seeds = [42, 7, 42]
    together = search_heads(embeddings, targets, seeds, hidden_dim=hidden, generations=12)
    for target, seed, result in zip(targets, seeds, together, strict=True):
        alone = search_head(embeddings, target, hidden_dim=hidden, generations=12, seed=seed)
        assert np.array_equal(result.theta, alone.theta)
        assert result.train_reward == alone.train_reward and result.history == alone.history
    assert not np.array_equal(together[0].theta, together[2].theta)


def test_lockstep_settings_are_checked_like_the_single_search():
    embeddings, rewards = clustered(rows=20, dim=4)
    with pytest.raises(InputError, match="seed must be an integer from 0"):
        search_heads(embeddings, [rewards, rewards], [1, -1])
    with pytest.raises(ValueError, match="one seed per target matrix"):
        search_heads(embeddings, [rewards], [1, 2])


def test_fitness_equals_the_literal_population_mean_bit_for_bit():
    """Non-integer utilities (rewards minus a cost term), whose sums depend on the order of addition:
    the one-product fitness equals the literal mean over rows of R[i, argmax(head_logits)] exactly."""
    rng = np.random.default_rng(9)
    embeddings = rng.normal(size=(3000, 12))
    utility = (rng.random((3000, 2)) < [0.6, 0.8]) - 0.0137 * np.array([0.6, 10.0]) * rng.random((3000, 2))
    thetas = rng.normal(size=(23, 12 * 2 + 2))
    literal = utility[np.arange(3000), head_logits(thetas, embeddings, 2, 0).argmax(axis=-1)].mean(axis=1)
    assert np.array_equal(fitness(thetas, embeddings, utility, 0), literal)
