"""Which agent answers the queries the guard flags.

On them the head's argmax is close to arbitrary, so a fixed agent chosen on the training rows
answers instead: the best on average, or the cheapest near the best, or per operating point the one
with the best mean utility.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from benchgen_router.errors import InputError


def fallback_agent(rewards: np.ndarray, costs: np.ndarray | None = None, tolerance: float = 0.0) -> int:
    """Index of the agent that answers flagged queries, from the training rows' (rows, agents) rewards:
    the best fixed agent (lowest index among equals); with per-agent `costs` (e.g. mean cost per
    call), the cheapest whose mean reward is within `tolerance` of the best (cost ties: the higher
    reward, then the lower index)."""
    table = np.asarray(rewards, dtype=np.float64)
    if table.ndim != 2 or table.shape[0] == 0 or table.shape[1] == 0 or not np.isfinite(table).all():
        raise InputError(f"rewards must be a finite non-empty (rows, agents) array; got shape {table.shape}.")
    mean_reward = table.mean(axis=0)
    best = float(mean_reward.max())
    if costs is None:
        return int(np.argmax(mean_reward))
    price = np.asarray(costs, dtype=np.float64)
    if price.shape != (table.shape[1],) or not np.isfinite(price).all() or (price < 0).any():
        raise InputError(f"costs must be {table.shape[1]} finite non-negative numbers, one per agent.")
    if not tolerance >= 0.0:
        raise InputError(f"tolerance must be a non-negative reward difference; got {tolerance}.")
    eligible = np.flatnonzero(mean_reward >= best - tolerance - 1e-12)
    return int(min(eligible, key=lambda agent: (price[agent], -mean_reward[agent], agent)))


def utility_fallback(utility: np.ndarray, cost: np.ndarray) -> int:
    """Index of the agent with the highest mean utility over the training rows (`utility`: (rows,
    agents), an operating point's reward less its weighted cost and latency), so that each point has
    its own fallback; among equals the lower mean `cost` (rows, agents), then the lower index."""
    mean_utility = np.asarray(utility, dtype=np.float64).mean(axis=0)
    mean_cost = np.asarray(cost, dtype=np.float64).mean(axis=0)
    best = np.flatnonzero(mean_utility >= mean_utility.max() - 1e-12)
    return int(min(best, key=lambda agent: (mean_cost[agent], agent)))


def fallback_rule(costs: np.ndarray | None, tolerance: float, fallback: int | None) -> str:
    """How the fallback was chosen, in words, for the manifest's record."""
    if fallback is not None:
        return "highest mean utility on the training rows (ties: the cheaper agent)"
    if costs is None:
        return "best fixed agent on the training rows"
    return f"cheapest agent within {tolerance} of the best mean reward on the training rows"


def check_fallback_agent(agent: object, agents: Sequence[str], source: str) -> str:
    """The fallback agent if it is one of the pool's `agents` (a guard fitted for another pool would
    route to an agent that does not exist); one InputError line otherwise."""
    if agent is None:
        raise InputError(
            f"OOD statistics {source} name no fallback agent (an .npz has no metadata): name the agent that "
            "answers flagged queries with --ood-fallback-agent AGENT."
        )
    if agent not in agents:
        raise InputError(
            f"OOD statistics {source}: fallback agent {agent!r} is not in agent_order {list(agents)}; "
            "refit the guard for this pool (or name a pool agent as ood_guard.fallback_agent in the manifest)."
        )
    return str(agent)
