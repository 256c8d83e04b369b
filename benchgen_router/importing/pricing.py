"""What each imported call cost: a cost column when the source has one (billed cost wins, as in costs.py);
else the tokens at the pool's prices (`with_prices`) or a fixed cost per call of each agent
(`with_call_costs`); else, with none of these, 1 per call, so that the cost of a routing is the count of
calls each agent gets (RouteLLM's own measure is the share of strong calls: `with_call_costs` with
strong 1, weak 0)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from benchgen_router.costs import MAX_CALL_COST_USD, AgentPrice
from benchgen_router.errors import setting_error
from benchgen_router.importing.outcomes import Outcomes


def with_prices(outcomes: Outcomes, prices: Mapping[str, AgentPrice]) -> Outcomes:
    """Outcomes whose unknown costs are the calls' tokens at the pool's prices (USD per 1M tokens); a
    known cost is kept (the billed figure is the truth). A call with no cost and no completion token
    count is an error naming it; unknown prompt tokens count 0 (said so in the notes)."""
    cost = outcomes.cost_usd.copy()
    unknown = np.isnan(cost)
    estimated = prompt_unknown = 0
    for i, j in zip(*np.nonzero(unknown), strict=True):
        completion = outcomes.completion_tokens[i, j]
        if np.isnan(completion):
            raise setting_error(
                f"task {outcomes.task_ids[i]!r} ({outcomes.sources[i] if outcomes.sources else 'no source'}), model "
                f"{outcomes.agents[j]!r} has no cost and no token counts to price; pass a file with token counts "
                "(or a cost column), or leave out {pool} to count calls instead."
            )
        prompt = outcomes.prompt_tokens[i, j]
        if np.isnan(prompt):
            prompt_unknown += 1
            prompt = 0.0
        cost[i, j] = prices[outcomes.agents[j]].cost_usd(int(prompt), int(completion))
        estimated += 1
    notes = list(outcomes.notes)
    if estimated:
        notes.append(f"{estimated} calls priced from their tokens at the pool's prices")
    if prompt_unknown:
        notes.append(f"{prompt_unknown} calls had no prompt token count; only their completion tokens were priced")
    return replace(outcomes, cost_usd=cost, cost_unit="usd", notes=notes)


def with_call_costs(outcomes: Outcomes, per_call: Mapping[str, float], unit: str = "usd") -> Outcomes:
    """Outcomes whose unknown costs are a fixed cost per call of each agent (a known cost is kept).
    With strong 1 and weak 0 (unit "calls"), a routing's cost is its share of strong calls, RouteLLM's
    own measure; with USD figures, a price per call where the source has no token counts."""
    missing = [agent for agent in outcomes.agents if agent not in per_call]
    extra = sorted(set(per_call) - set(outcomes.agents))
    if missing or extra:
        raise setting_error(
            f"{{call_cost}} must name every agent {outcomes.agents} once (missing: {missing or 'none'}, "
            f"not an agent: {extra or 'none'})."
        )
    for agent, value in per_call.items():
        if not isinstance(value, int | float) or not math.isfinite(value) or not 0 <= value <= MAX_CALL_COST_USD:
            raise setting_error(f"{{call_cost}} of {agent!r} is {value!r}; it must be from 0 to {MAX_CALL_COST_USD:g}.")
    fixed = np.array([float(per_call[agent]) for agent in outcomes.agents])
    unknown = np.isnan(outcomes.cost_usd)
    cost = np.where(unknown, fixed[None, :], outcomes.cost_usd)
    notes = [*outcomes.notes, f"{int(unknown.sum())} calls cost their agent's fixed cost per call"]
    return replace(outcomes, cost_usd=cost, cost_unit=unit, notes=notes)


def call_costs(outcomes: Outcomes) -> tuple[np.ndarray, str]:
    """(cost per call, unit): the known costs in USD, or 1 per call ("calls") when none is known."""
    unknown = np.isnan(outcomes.cost_usd)
    if unknown.all():
        return np.ones_like(outcomes.cost_usd), "calls"
    if unknown.any():
        i, j = (int(k[0]) for k in np.nonzero(unknown))
        raise setting_error(
            f"task {outcomes.task_ids[i]!r} ({outcomes.sources[i] if outcomes.sources else 'no source'}), model "
            f"{outcomes.agents[j]!r} has no cost while other calls have one; give every row a cost, or pass "
            "{pool} with token counts to price the rest."
        )
    return outcomes.cost_usd, outcomes.cost_unit
