"""Scoring routing decisions: the reference baselines, the evaluation table, and how both are printed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def baselines(rewards: np.ndarray) -> dict[str, float]:
    """docs/reference.md baselines over rows: uniform random, the single best agent, per-question oracle."""
    return {
        "random_agent": float(rewards.mean()),
        "best_fixed_agent": float(rewards.mean(axis=0).max()),
        "oracle": float(rewards.max(axis=1).mean()),
    }


def evaluate_picks(picks: np.ndarray, rewards: np.ndarray, agents: Sequence[str]) -> dict[str, Any]:
    """The evaluation table of one routing run: the router's mean reward against the baselines on
    the same rows, the share of the routing headroom it captured, and how often it picked each agent.

    headroom_share = (router - best fixed) / (oracle - best fixed); None when the oracle is no better
    than the best fixed agent (there is no headroom to capture).
    """
    router = float(rewards[np.arange(len(picks)), picks].mean())
    base = baselines(rewards)
    headroom = base["oracle"] - base["best_fixed_agent"]
    counts = np.bincount(picks, minlength=len(agents))
    return {
        "rows": len(picks),
        "router": router,
        **base,
        "best_fixed_agent_id": agents[int(rewards.mean(axis=0).argmax())],
        "headroom_share": (router - base["best_fixed_agent"]) / headroom if headroom > 1e-12 else None,
        "picks": {agent: int(count) for agent, count in zip(agents, counts, strict=True)},
        "beats_best_fixed_agent": router > base["best_fixed_agent"],
    }


def format_evaluation(evaluation: dict[str, Any], title: str) -> str:
    """The evaluation as a plain-text table (what both tools print)."""
    share = evaluation["headroom_share"]
    rows = [
        ("router", f"{evaluation['router']:.4f}"),
        (f"best fixed agent ({evaluation['best_fixed_agent_id']})", f"{evaluation['best_fixed_agent']:.4f}"),
        ("uniform random agent", f"{evaluation['random_agent']:.4f}"),
        ("per-question oracle", f"{evaluation['oracle']:.4f}"),
        ("headroom captured", "n/a (oracle = best fixed)" if share is None else f"{100 * share:.1f}%"),
    ]
    rows += [(f"picks: {agent}", str(count)) for agent, count in evaluation["picks"].items()]
    width = max(len(name) for name, _ in rows)
    lines = [f"{title} ({evaluation['rows']} rows)", f"{'policy':<{width}}  mean reward", "-" * (width + 13)]
    lines += [f"{name:<{width}}  {value:>11}" for name, value in rows]
    return "\n".join(lines)


def format_cross_validation(cv: dict[str, Any]) -> str:
    """The k-fold estimate as a table: mean ± std over folds for the router and the baselines."""
    lines = [f"{cv['folds']}-fold cross-validation over {cv['rows']} labelled rows (mean ± std over folds)"]
    for name, key in (
        ("router", "router"),
        ("best fixed agent", "best_fixed"),
        ("uniform random agent", "random"),
        ("per-question oracle", "oracle"),
    ):
        lines.append(f"{name:<22}  {cv[f'{key}_mean']:.4f} ± {cv[f'{key}_std']:.4f}")
    return "\n".join(lines)
