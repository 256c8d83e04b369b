"""A probability head's trade-off rules applied to arrays, and the calibration its budget rules need.

The rules themselves are the model code's (`parse_tradeoff`, `resolve_tradeoff` in configuration_router.py,
`decide` in modeling_router.py; docs/tradeoff.md): this module applies them to numpy or torch arrays for
the trainer, the benchmark and `route --calibrate-on`, so every one of them picks as the router does.

    picks = decide(probabilities, costs_per_1k, "tolerance=0.02")     # (n,) agent indices
    config.tradeoff_calibration = tradeoff_calibration(probabilities, costs_per_1k, agents)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from benchgen_router.hardware import one_thread

LAMBDA_GRID_SIZE = 200  # lambdas a `usd-per-1k` budget is resolved over


def tradeoff_calibration(probabilities: np.ndarray, costs_per_1k: np.ndarray, agents: list[str]) -> dict[str, Any]:
    """What the budget rules need (config.tradeoff_calibration), from a sample of traffic's probabilities:
    each agent's margin (its probability minus the best other agent's) at the quantile levels, and the
    cost per 1,000 queries of the `lambda` rule at a grid of lambdas, from 0 up to one at which every
    query goes to the cheapest agent (a probability gap is at most 1)."""
    import torch

    from benchgen_router.config_checks import QUANTILE_LEVELS
    from benchgen_router.model_code import decide as decide_rule

    p = np.asarray(probabilities, dtype=np.float64)
    costs = np.asarray(costs_per_1k, dtype=np.float64)
    margins = {}
    for j, agent in enumerate(agents):
        others = np.delete(p, j, axis=1).max(axis=1) if len(agents) > 1 else np.zeros(len(p))
        margins[agent] = [float(v) for v in np.quantile(p[:, j] - others, QUANTILE_LEVELS)]
    gaps = np.diff(np.unique(costs))
    top = 2.0 / gaps.min() if len(gaps) else 1.0
    lambdas = [0.0, *np.geomspace(top * 1e-5, top, LAMBDA_GRID_SIZE - 1).tolist()]
    tensor, cost_tensor = torch.from_numpy(p), torch.from_numpy(costs)
    with one_thread():  # 200 small argmaxes: extra threads only cost here
        picks = [decide_rule(tensor, cost_tensor, ("lambda", lam, -1)).numpy() for lam in lambdas]
    spend = [float(costs[chosen].mean()) for chosen in picks]
    return {"rows": len(p), "margins": margins, "lambdas": lambdas, "cost_per_1k": spend}


def decide(
    probabilities: Any,
    costs_per_1k: Any,
    tradeoff: str,
    calibration: dict[str, Any] | None = None,
    agents: list[str] | None = None,
) -> Any:
    """Picks (n,) for (n, N) probabilities, numpy or torch (the result is the same kind), under
    `tradeoff` as a router applies it (docs/tradeoff.md). The budget forms use `calibration`
    (tradeoff_calibration of a traffic sample; None: calibrated on `probabilities` themselves).
    `agents` names the pool for `budget=X@AGENT` (default "0", "1", ...). ValueError for a bad spelling."""
    import torch

    from benchgen_router.model_code import decide as decide_rule
    from benchgen_router.model_code import parse_tradeoff, resolve_tradeoff

    as_numpy = not isinstance(probabilities, torch.Tensor)
    p = torch.as_tensor(np.asarray(probabilities, dtype=np.float64)) if as_numpy else probabilities
    costs = np.asarray(costs_per_1k.cpu() if isinstance(costs_per_1k, torch.Tensor) else costs_per_1k, dtype=np.float64)
    names = list(agents) if agents is not None else [str(j) for j in range(p.shape[1])]
    form, value, agent = parse_tradeoff(tradeoff, names, costs.tolist())
    if form in ("budget", "usd-per-1k") and calibration is None:
        calibration = tradeoff_calibration(p.detach().cpu().double().numpy(), costs, names)
    rule = resolve_tradeoff(form, value, agent, calibration, names[agent])
    picks = decide_rule(p, torch.from_numpy(costs), rule)
    return picks.numpy() if as_numpy else picks
