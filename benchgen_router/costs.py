"""Cost and latency of each agent on each labelled task, and the utility matrix the search maximises.

Where the numbers come from: the raw pilot matrix (`rewards.v1-pilot.jsonl`) records every graded
call with its billed `cost_usd`, `latency_ms` and token counts; the published rewards
(`rewards.jsonl`) carry only the reward. Cost-aware routing therefore joins the labelled rows (the
published rewards, their reward values) to the raw calls on `task_id` and averages, per task and
agent, the billed cost and the latency over that agent's calls (3 repetitions in the pilot). The raw
file alone also works: its rows have `task_id`, `agent_order` and `mean_reward` too.

Which calls count: all of them, including empty and errored answers, because a deployed router
pays for and waits on those calls as well. A call without `cost_usd` gets a price from the pool file
(`agents.json`: price per 1M prompt and per 1M completion tokens) times its token counts; a call
that has a cost keeps it even when the pool would say otherwise (the billed figure is the truth; on
the pilot data the pool estimate is off by a factor of up to 2 for the reasoning agents, see
docs/cost-frontier.md). A cost of exactly 0 is kept: the pilot has two such calls (empty answers the
provider did not bill).

Units, chosen so the trade-off weights are numbers of order one on this pool:
- cost `C` in USD per 1,000 queries (a mean per-call cost of 115 micro-USD is 0.115);
- latency `L` in seconds per query;
- utility `U = R - cost_weight * C - latency_weight * L`. `cost_weight` is in reward per (USD per
  1,000 queries): at 1.0 the router gives up 0.01 mean reward (one point of accuracy) to save one
  cent per 1,000 queries. `latency_weight` is in reward per second: at 0.01 it gives up one point of
  accuracy to answer a second faster. Per query USD would need weights in the thousands; per 1,000
  queries the pilot's spread of agent costs (0.01 to 0.13) sits on the same scale as its reward gaps.

Because the search's fitness is the mean of a matrix at the picks, training on U is cost-aware
training with no change to the search, and both weights at 0 give U = R exactly (the same array).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchgen_router.errors import InputError, first_line
from benchgen_router.files import read_jsonl

QUERIES_PER_COST_UNIT = 1000  # C is USD per 1,000 queries
TOKENS_PER_PRICE_UNIT = 1_000_000  # pool prices are USD per 1M tokens
_REWARD_TOLERANCE = 1e-9


@dataclass(frozen=True)
class AgentPrice:
    prompt_usd_per_1m: float
    completion_usd_per_1m: float

    def cost_usd(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (
            prompt_tokens * self.prompt_usd_per_1m + completion_tokens * self.completion_usd_per_1m
        ) / TOKENS_PER_PRICE_UNIT


@dataclass
class CostData:
    """Per labelled task (row) and agent (column): mean reward, mean billed cost, mean latency."""

    agents: list[str]
    task_ids: list[str]
    rewards: np.ndarray  # (rows, agents) float64, the labelled rewards as given
    cost_usd: np.ndarray  # (rows, agents) float64, mean USD per call
    latency_s: np.ndarray  # (rows, agents) float64, mean seconds per call
    calls: np.ndarray  # (rows, agents) int, calls averaged per cell
    estimated_calls: int = 0  # calls whose cost came from the pool prices
    zero_cost_calls: int = 0  # calls billed at exactly 0 USD (kept as measured)
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.task_ids)

    @property
    def cost_per_1k(self) -> np.ndarray:
        """Cost in the unit the trade-off weights use: USD per 1,000 queries."""
        return self.cost_usd * QUERIES_PER_COST_UNIT

    def utility(self, cost_weight: float, latency_weight: float) -> np.ndarray:
        return utility_matrix(self.rewards, self.cost_per_1k, self.latency_s, cost_weight, latency_weight)

    def subset(self, rows: np.ndarray) -> CostData:
        """The rows selected by a boolean mask or an index array, in that order."""
        index = np.flatnonzero(rows) if np.asarray(rows).dtype == bool else np.asarray(rows, dtype=int)
        return CostData(
            self.agents,
            [self.task_ids[i] for i in index],
            self.rewards[index],
            self.cost_usd[index],
            self.latency_s[index],
            self.calls[index],
            self.estimated_calls,
            self.zero_cost_calls,
            list(self.notes),
        )

    def summary(self) -> dict[str, Any]:
        """Per-agent means over all rows (reward, USD per 1,000 queries, seconds) and the oracles."""
        best = self.rewards.max(axis=1)
        rows = np.arange(len(self))
        cheapest_best = cheapest_of_best(self.rewards, self.cost_usd)
        return {
            "rows": len(self),
            "agents": {
                agent: {
                    "reward": float(self.rewards[:, j].mean()),
                    "cost_per_1k_usd": float(self.cost_per_1k[:, j].mean()),
                    "latency_s": float(self.latency_s[:, j].mean()),
                    "tied_best_rows": int((self.rewards[:, j] >= best - _REWARD_TOLERANCE).sum()),
                }
                for j, agent in enumerate(self.agents)
            },
            "oracle_cheapest_of_best": {
                "reward": float(best.mean()),
                "cost_per_1k_usd": float(self.cost_per_1k[rows, cheapest_best].mean()),
                "latency_s": float(self.latency_s[rows, cheapest_best].mean()),
            },
            "estimated_calls": self.estimated_calls,
            "zero_cost_calls": self.zero_cost_calls,
        }


def utility_matrix(
    rewards: np.ndarray, cost_per_1k: np.ndarray, latency_s: np.ndarray, cost_weight: float, latency_weight: float
) -> np.ndarray:
    """U = R - cost_weight * C - latency_weight * L (units in the module docstring).

    Both weights 0 returns `rewards` itself, so the search sees the very array it would see without
    costs and finds the bit-identical head for the same seed.
    """
    for name, weight in (("cost weight", cost_weight), ("latency weight", latency_weight)):
        if not isinstance(weight, int | float) or isinstance(weight, bool) or not 0 <= weight <= MAX_WEIGHT:
            raise InputError(f"{name} {weight!r} must be a number from 0 to {MAX_WEIGHT:g} (0 ignores it).")
    if cost_weight == 0 and latency_weight == 0:
        return rewards
    return rewards - cost_weight * cost_per_1k - latency_weight * latency_s


def cheapest_of_best(rewards: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """Per row, the index of the cheapest agent among those with the row's highest reward."""
    best = rewards >= rewards.max(axis=1, keepdims=True) - _REWARD_TOLERANCE
    return np.where(best, cost, np.inf).argmin(axis=1)


# ---------------------------------------------------------------------------------------------
# The pool file


POOL_PRICE_FIELDS = ("price_per_1m_prompt_usd", "price_per_1m_output_usd")
# Bounds on what is read, far beyond any real figure: past them, sums and weighted utilities would
# overflow to inf and NaN long after the input that caused it.
MAX_CALL_COST_USD = 1e4
MAX_LATENCY_MS = 86_400_000.0
MAX_PRICE_PER_1M_USD = 1e6
MAX_WEIGHT = 1e6


def read_pool_rows(path: str | os.PathLike) -> Any:
    """The parsed JSON of a pool file (agents.json), or one line saying why it cannot be read."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"pool file not found: {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        reason = "nested too deeply" if isinstance(err, RecursionError) else first_line(err)
        raise InputError(f"pool file {path} is not valid JSON ({reason}); pass agents.json of the pool.") from None
    except OSError as err:  # a folder, no permission
        raise InputError(
            f"cannot read pool file {path} ({err.strerror or first_line(err)}); pass agents.json."
        ) from None


def pool_agents(rows: Any, source: str = "pool file", prices_required: bool = False) -> list[dict[str, Any]]:
    """The agents of pool rows (agents.json: a list of {agent_id, slug, price_per_1m_prompt_usd,
    price_per_1m_output_usd, ...}) in file order, as [{"id", "slug", "price_per_1m_prompt_usd",
    "price_per_1m_output_usd"}], or one line naming the first bad entry. A price given must be a
    number >= 0; an absent one is None (the service lists what it has) unless `prices_required`
    (costs are computed from them)."""
    if isinstance(rows, dict) and "agents" in rows:  # the object form, with the pool's upstream defaults
        rows = rows["agents"]
    if not isinstance(rows, list) or not rows or not all(isinstance(row, dict) for row in rows):
        raise InputError(
            f"{source} must be a JSON list of agent objects (agent_id and prices per 1M tokens), like agents.json."
        )
    agents: list[dict[str, Any]] = []
    seen: set[str] = set()
    for number, row in enumerate(rows, start=1):
        agent = row.get("agent_id")
        if not isinstance(agent, str) or not agent:
            needs = "agent_id and its prices" if prices_required else "an agent_id string"
            raise InputError(f"{source} entry {number} has no agent_id; every entry needs {needs}.")
        if agent in seen:
            raise InputError(f"{source} lists agent '{agent}' twice; each agent must appear once.")
        seen.add(agent)
        prices = {}
        for key in POOL_PRICE_FIELDS:
            value = row.get(key)
            if value is None and not prices_required:
                prices[key] = None
                continue
            if not _is_number(value) or not math.isfinite(value) or not 0 <= value <= MAX_PRICE_PER_1M_USD:
                raise InputError(
                    f"{source} agent '{agent}' has {key} {value!r}; prices must be numbers from 0 to "
                    f"{MAX_PRICE_PER_1M_USD:g} USD per 1M tokens."
                )
            prices[key] = value
        slug = row.get("slug")
        if slug is not None and not isinstance(slug, str):
            raise InputError(f"{source} agent '{agent}' has slug {slug!r}; a slug must be the model's id, a string.")
        agents.append({"id": agent, "slug": slug, **prices})
    return agents


def read_pool_file(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The agents of a pool file, as pool_agents() gives them (prices may be absent): what the
    service lists at /v1/pool."""
    return pool_agents(read_pool_rows(path), f"pool file {path}")


def pool_prices(rows: Any, agents: Sequence[str], source: str = "pool file") -> dict[str, AgentPrice]:
    """Prices per agent from the pool rows (agents.json, checked by pool_agents() with every price
    required); the ids must be exactly the agents of the rewards, in any order."""
    prices = {
        entry["id"]: AgentPrice(*(float(entry[key]) for key in POOL_PRICE_FIELDS))
        for entry in pool_agents(rows, source, prices_required=True)
    }
    missing = [agent for agent in agents if agent not in prices]
    extra = sorted(set(prices) - set(agents))
    if missing or extra:
        raise InputError(
            f"{source} agent ids do not match agent_order {list(agents)} "
            f"(missing: {missing or 'none'}, not in agent_order: {extra or 'none'}); pass the pool file of this pool."
        )
    return prices


def load_pool(path: str | os.PathLike, agents: Sequence[str]) -> dict[str, AgentPrice]:
    return pool_prices(read_pool_rows(path), agents, f"pool file {path}")


# ---------------------------------------------------------------------------------------------
# Per-call records -> per task and agent means


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass
class _TaskCalls:
    cost_sum: np.ndarray
    latency_sum: np.ndarray
    correct_sum: np.ndarray
    calls: np.ndarray
    graded: bool  # every call carries a boolean `correct`


def _aggregate_task(
    row: dict[str, Any],
    number: int,
    agents: Sequence[str],
    prices: dict[str, AgentPrice] | None,
    counters: dict[str, int],
    source: str,
) -> tuple[str, _TaskCalls]:
    task_id = row.get("task_id")
    if not isinstance(task_id, str) or not task_id:
        raise InputError(f"{source} row {number} has no task_id; pass the raw per-call file (task_id and calls).")
    calls = row.get("calls")
    if not isinstance(calls, list) or not calls:
        raise InputError(
            f"{source} row {number} ({task_id}) has no calls list; cost and latency need the raw per-call records."
        )
    index = {agent: j for j, agent in enumerate(agents)}
    width = len(agents)
    result = _TaskCalls(np.zeros(width), np.zeros(width), np.zeros(width), np.zeros(width, dtype=int), True)
    for call_number, call in enumerate(calls, start=1):
        where = f"{source} row {number} ({task_id}) call {call_number}"
        if not isinstance(call, dict):
            raise InputError(f"{where} is not a JSON object; each call must be one.")
        agent = call.get("agent")
        if agent not in index:
            raise InputError(
                f"{where} is by agent {agent!r}, which is not in agent_order {list(agents)}; "
                "pass the calls file recorded for this pool."
            )
        j = index[agent]
        cost = call.get("cost_usd")
        if cost is None:
            if prices is None:
                raise InputError(
                    f"{where} ({agent}) has no cost_usd; pass the pool file (agents.json) to estimate it from "
                    "the call's token counts."
                )
            prompt_tokens, completion_tokens = call.get("prompt_tokens"), call.get("completion_tokens")
            if not (_is_count(prompt_tokens) and _is_count(completion_tokens)):
                raise InputError(
                    f"{where} ({agent}) has no cost_usd and token counts {prompt_tokens!r}/{completion_tokens!r}; "
                    "a cost estimate needs prompt_tokens and completion_tokens as integers >= 0."
                )
            cost = prices[agent].cost_usd(prompt_tokens, completion_tokens)
            counters["estimated"] += 1
        elif not _is_number(cost) or not math.isfinite(cost) or not 0 <= cost <= MAX_CALL_COST_USD:
            raise InputError(
                f"{where} ({agent}) has cost_usd {cost!r}; a billed cost must be a number from 0 to "
                f"{MAX_CALL_COST_USD:g} USD per call."
            )
        elif cost == 0:
            counters["zero"] += 1
        latency = call.get("latency_ms")
        if not _is_number(latency) or not math.isfinite(latency) or not 0 <= latency <= MAX_LATENCY_MS:
            raise InputError(
                f"{where} ({agent}) has latency_ms {latency!r}; latency must be a number from 0 to "
                f"{MAX_LATENCY_MS:g} ms (a day)."
            )
        correct = call.get("correct")
        if isinstance(correct, bool):
            result.correct_sum[j] += correct
        else:
            result.graded = False
        result.cost_sum[j] += cost
        result.latency_sum[j] += latency / 1000.0
        result.calls[j] += 1
    if (result.calls == 0).any():
        absent = [agents[j] for j in np.flatnonzero(result.calls == 0)]
        raise InputError(
            f"{source} row {number} ({task_id}) has no calls by {absent}; every agent needs at least one call "
            "per task to measure its cost."
        )
    return task_id, result


def cost_data_from_calls(
    agents: Sequence[str],
    task_ids: Sequence[str],
    rewards: np.ndarray,
    call_rows: Sequence[dict[str, Any]],
    prices: dict[str, AgentPrice] | None = None,
    source: str = "calls file",
) -> CostData:
    """Cost and latency of the labelled rows (task_ids, rewards in agents order) from the raw calls.

    Raw rows whose task is not labelled are ignored (the pilot's 14 rlpr tasks, when the labelled rows
    are the published ones); a labelled task without raw calls is an error, as is a call by an agent
    outside the pool. Where every call of a task is graded, the calls' accuracy must equal the
    labelled reward: a mismatch means the two files do not belong together.
    """
    agents = list(agents)
    rewards = np.asarray(rewards, dtype=np.float64)
    if rewards.shape != (len(task_ids), len(agents)):
        raise ValueError(f"rewards shape {rewards.shape} != ({len(task_ids)}, {len(agents)})")
    if not call_rows:
        raise InputError(f"the {source} has no rows.")
    counters = {"estimated": 0, "zero": 0}
    wanted = set(task_ids)
    by_task: dict[str, _TaskCalls] = {}
    for number, row in enumerate(call_rows, start=1):
        task_id = row.get("task_id") if isinstance(row, dict) else None
        if task_id not in wanted:
            if not isinstance(task_id, str) or not task_id:
                raise InputError(f"{source} row {number} has no task_id; pass the raw per-call file.")
            continue
        if task_id in by_task:
            raise InputError(f"{source} row {number} repeats task_id '{task_id}'; each task must appear once.")
        _, by_task[task_id] = _aggregate_task(row, number, agents, prices, counters, source)
    missing = [task_id for task_id in task_ids if task_id not in by_task]
    if missing:
        raise InputError(
            f"{len(missing)} labelled tasks have no row in the {source} (e.g. '{missing[0]}'); "
            "pass the raw per-call file these rewards come from."
        )
    cells = [by_task[task_id] for task_id in task_ids]
    calls = np.stack([cell.calls for cell in cells])
    for row_number, (task_id, cell) in enumerate(zip(task_ids, cells, strict=True)):
        if cell.graded:
            accuracy = cell.correct_sum / cell.calls
            if np.abs(accuracy - rewards[row_number]).max() > _REWARD_TOLERANCE:
                raise InputError(
                    f"task '{task_id}': the labelled rewards {np.round(rewards[row_number], 4).tolist()} differ "
                    f"from its calls' accuracy {np.round(accuracy, 4).tolist()}; pass the calls file these rewards "
                    "were computed from."
                )
    notes = []
    if counters["estimated"]:
        notes.append(f"{counters['estimated']} calls had no cost_usd; estimated from the pool prices")
    if counters["zero"]:
        notes.append(f"{counters['zero']} calls were billed 0 USD (kept as measured)")
    ignored = len(call_rows) - len(by_task)
    if ignored:
        notes.append(f"{ignored} rows of the {source} are not labelled tasks and were not used")
    return CostData(
        agents,
        list(task_ids),
        rewards,
        np.stack([cell.cost_sum for cell in cells]) / calls,
        np.stack([cell.latency_sum for cell in cells]) / calls,
        calls,
        counters["estimated"],
        counters["zero"],
        notes,
    )


def labelled_rows(reward_rows: Sequence[dict[str, Any]], source: str) -> tuple[list[str], list[str], np.ndarray]:
    """(agents, task_ids, rewards) of reward rows (published or raw: task_id, agent_order, mean_reward)."""
    if not reward_rows:
        raise InputError(f"the {source} has no rows.")
    agents: list[str] | None = None
    task_ids: list[str] = []
    rewards = []
    for number, row in enumerate(reward_rows, start=1):
        task_id, order, values = row.get("task_id"), row.get("agent_order"), row.get("mean_reward")
        if not isinstance(task_id, str) or not task_id:
            raise InputError(f"{source} row {number} has no task_id; it needs task_id, agent_order, mean_reward.")
        if not isinstance(order, list) or not order or not all(isinstance(a, str) and a for a in order):
            raise InputError(f"{source} row {number} ({task_id}): agent_order must be a non-empty list of agent ids.")
        if agents is not None and order != agents:
            raise InputError(
                f"{source} row {number} ({task_id}) has agent_order {order} but earlier rows have {agents}; "
                "every row must score the same pool in the same order."
            )
        agents = order
        if (
            not isinstance(values, list)
            or len(values) != len(order)
            or not all(_is_number(v) and math.isfinite(v) and 0 <= v <= 1 for v in values)
        ):
            raise InputError(
                f"{source} row {number} ({task_id}): mean_reward must be {len(order)} numbers in [0, 1], one per agent."
            )
        if task_id in task_ids:
            raise InputError(f"{source} row {number} repeats task_id '{task_id}'; each task must appear once.")
        task_ids.append(task_id)
        rewards.append(values)
    assert agents is not None
    return agents, task_ids, np.asarray(rewards, dtype=np.float64)


def load_cost_data(
    calls_path: str | Path, rewards_path: str | Path | None = None, pool_path: str | Path | None = None
) -> CostData:
    """Cost data from files: the labelled rows of `rewards_path` (default: the calls file's own rows)
    joined on task_id to the raw calls of `calls_path`; `pool_path` fills missing costs."""
    call_rows = read_jsonl(calls_path, "calls file")
    reward_rows = call_rows if rewards_path is None else read_jsonl(rewards_path, "rewards file")
    agents, task_ids, rewards = labelled_rows(reward_rows, "calls file" if rewards_path is None else "rewards file")
    prices = None if pool_path is None else load_pool(pool_path, agents)
    return cost_data_from_calls(agents, task_ids, rewards, call_rows, prices, f"calls file {calls_path}")


def costs_for_labelled(data: Any, calls_path: str | Path, pool_path: str | Path | None = None) -> CostData:
    """Cost data aligned row for row with a LabelledData (agents, task_ids, rewards): what train and
    evaluate call after joining rewards to prompts, so embeddings, rewards and costs share one order."""
    prices = None if pool_path is None else load_pool(pool_path, data.agents)
    call_rows = read_jsonl(calls_path, "calls file")
    return cost_data_from_calls(data.agents, data.task_ids, data.rewards, call_rows, prices, f"calls file {calls_path}")
