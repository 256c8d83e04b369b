"""The fallback agent (benchgen_router/ood/fallback.py): best fixed, cheapest near the best, best utility."""

from __future__ import annotations

import numpy as np
import pytest

from benchgen_router import ood
from benchgen_router.errors import InputError


def test_fallback_agent_is_the_best_fixed_or_the_cheapest_near_it():
    rewards = np.array([[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 0.0, 1.0], [0.0, 1.0, 1.0, 1.0], [1.0, 0.0, 1.0, 0.5]])
    # mean rewards 0.75, 0.5, 0.75, 0.875
    assert ood.fallback_agent(rewards) == 3
    costs = np.array([1.0, 0.1, 0.5, 4.0])
    assert ood.fallback_agent(rewards, costs) == 3  # no tolerance: the best, whatever it costs
    assert ood.fallback_agent(rewards, costs, tolerance=0.125) == 2  # 0 and 2 within 0.125; 2 is cheaper
    assert ood.fallback_agent(rewards, costs, tolerance=0.4) == 1
    assert ood.fallback_agent(rewards[:, :3]) == 0  # equal means: the lowest index
    assert ood.fallback_agent(rewards[:, :3], np.array([1.0, 1.0, 1.0]), tolerance=1.0) == 0  # equal cost: best
    with pytest.raises(InputError, match="one per agent"):
        ood.fallback_agent(rewards, costs[:3])
    with pytest.raises(InputError, match="non-empty"):
        ood.fallback_agent(np.zeros((0, 4)))


def test_utility_fallback_takes_the_best_utility_then_the_cheaper_agent():
    utility = np.array([[0.9, 0.8, 0.9], [0.7, 0.8, 0.7]])  # mean 0.8 for all three
    cost = np.array([[3.0, 2.0, 1.0], [3.0, 2.0, 1.0]])
    assert ood.utility_fallback(utility, cost) == 2
    assert ood.utility_fallback(utility + np.array([0.0, 0.01, 0.0]), cost) == 1
