"""RouteLLM's figures for a two-agent pool (frontier.gap: APGR, CPT(50%), CPT(80%) as routellm/evals computes
them), on one held-out fold: the cheaper agent plays the weak model, the better one the strong model.

- a router that predicts probabilities is swept as RouteLLM sweeps its routers' scores: its margin
  p_strong - p_weak cut at RouteLLM's thresholds (10 equal-count bins). At two agents the `lambda` rule
  sends a query to the strong agent when that margin exceeds lambda times the cost gap, so this is the
  same family of decisions at RouteLLM's settings;
- the CMA-ES heads' points (one per cost weight), joined with always-weak and always-strong; the
  reward-only head's logit margin swept as a score;
- random: RouteLLM's random router (uniform scores through the same sweep), the mean of `draws` draws;
- the oracle: RouteLLM's get_optimal_accuracy at every share.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from benchgen_router.errors import InputError
from benchgen_router.frontier import gap as gp


def routellm_figures(
    scores: dict[str, np.ndarray],
    curves: dict[str, list[tuple[float, float]]],
    test: Any,
    known_costs: np.ndarray,
    num_results: int,
    draws: int,
    seed: Sequence[int],
) -> dict[str, Any]:
    """{"weak", "strong", "figures": {router: GapFigures.to_dict()}, "curves": {router: (share, accuracy)}},
    or {"note": why} when the pool has no gap to recover on this fold."""
    agents = [str(j) for j in range(test.rewards.shape[1])]
    try:
        pool = gp.PoolGap.of(test.rewards, test.cost_per_1k, agents)
    except InputError as err:
        return {"note": str(err)}
    strong, weak = pool.best, pool.cheapest
    if int(np.argmax(known_costs)) != strong:
        return {"note": "the dearer agent is not the better one on these rows: no gap to recover"}
    found: dict[str, gp.GapCurve] = {}
    for name, probabilities in scores.items():
        margin = probabilities if probabilities.ndim == 1 else probabilities[:, strong] - probabilities[:, weak]
        found[name] = gp.score_curve(name, margin, test.rewards, strong, num_results)
    if "cmaes" in curves:
        costs, qualities = zip(*curves["cmaes"], strict=True)
        found["cmaes"] = pool.curve_of_points("cmaes", list(costs), list(qualities))
    found["oracle"] = gp.oracle_curve(pool, test.rewards, test.cost_per_1k)
    figures = {name: pool.figures(curve).to_dict() for name, curve in found.items()}
    rng = np.random.default_rng(list(seed))
    random = [
        pool.figures(gp.score_curve("random", rng.random(len(test.rewards)), test.rewards, strong, num_results))
        for _ in range(draws)
    ]
    figures["random"] = {
        "apgr": float(np.mean([draw.area for draw in random])),
        **{f"cpt_{round(100 * x)}": float(np.mean([draw.recover[x] for draw in random])) for x in gp.GAP_FRACTIONS},
    }
    return {
        "weak": pool.cheapest_quality,
        "strong": pool.best_quality,
        "figures": figures,
        "curves": {name: [curve.cost.tolist(), curve.quality.tolist()] for name, curve in found.items()},
    }
