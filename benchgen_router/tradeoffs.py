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

LAMBDA_GRID_SIZE = 200  # lambdas of the geometric grid a `usd-per-1k` budget is resolved over
MAX_LAMBDAS = 400  # the grid and the points added where its spend drops steeply
SPEND_STEP = 0.02  # a step of the grid that drops the spend by more than this share of it is split
SMALLEST_GAP = 1e-4  # the least probability gap the lambda grid resolves


def tradeoff_calibration(probabilities: np.ndarray, costs_per_1k: np.ndarray, agents: list[str]) -> dict[str, Any]:
    """What the budget rules need (config.tradeoff_calibration), from a sample of traffic's probabilities:
    each agent's margin (its probability minus the best other agent's) at the quantile levels, and the
    cost per 1,000 queries of the `lambda` rule at a grid of lambdas: 0, then geometric from one at which
    a probability gap of 1e-4 outweighs the pool's whole price spread, up to one at which every query
    goes to the cheapest agent (a probability gap is at most 1, so twice the inverse of the closest two
    prices). A pool of many agents has prices close together and far apart at once: the grid spans both,
    so a budget between the cheapest and the dearest agent finds a lambda whose spend is close to it."""
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
    low = min(SMALLEST_GAP / np.ptp(costs), top) if len(gaps) else top
    tensor, cost_tensor = torch.from_numpy(p), torch.from_numpy(costs)

    def spend_at(lam: float) -> float:
        return float(costs[decide_rule(tensor, cost_tensor, ("lambda", lam, -1)).numpy()].mean())

    with one_thread():  # many small argmaxes: extra threads only cost here
        lambdas = [0.0, *np.geomspace(low, top, LAMBDA_GRID_SIZE - 1).tolist()]
        spend = [spend_at(lam) for lam in lambdas]
        # Where one step of the grid drops the spend by more than SPEND_STEP of it, add the geometric
        # midpoint, until every step is that fine or the table is full: spend falls steeply with lambda
        # where many queries sit near a switch between two agents.
        while len(lambdas) < MAX_LAMBDAS:
            steep = [
                i
                for i in range(1, len(lambdas) - 1)
                if spend[i] - spend[i + 1] > SPEND_STEP * spend[i] and lambdas[i + 1] > lambdas[i] * (1 + 1e-9)
            ]
            if not steep:
                break
            for i in reversed(steep[: MAX_LAMBDAS - len(lambdas)]):
                middle = float(np.sqrt(lambdas[i] * lambdas[i + 1]))
                lambdas.insert(i + 1, middle)
                spend.insert(i + 1, spend_at(middle))
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


def calibration_state(calibration: dict[str, Any], agents: list[str]) -> tuple[dict[str, int], dict[str, Any]]:
    """A calibration (tradeoff_calibration's) as a router folder stores it: the config's record of its sizes,
    and the tensors model.safetensors holds (`tradeoff.margins` in `agents` order, `tradeoff.lambdas`,
    `tradeoff.cost_per_1k`), so that config.json stays a page long for any pool."""
    import torch

    margins = np.array([calibration["margins"][agent] for agent in agents], dtype=np.float32)
    lambdas = np.asarray(calibration["lambdas"], dtype=np.float32)
    record = {"rows": int(calibration["rows"]), "levels": int(margins.shape[1]), "lambdas": len(lambdas)}
    tensors = {
        "tradeoff.margins": torch.from_numpy(margins),
        "tradeoff.lambdas": torch.from_numpy(lambdas),
        "tradeoff.cost_per_1k": torch.from_numpy(np.asarray(calibration["cost_per_1k"], dtype=np.float32)),
    }
    return record, tensors


def set_calibration(model: Any, calibration: dict[str, Any]) -> None:
    """Give a loaded probability-head router a new calibration (recalibration), in the form its folder
    stores: `model.config.tradeoff_calibration` the sizes, `model.tradeoff` the values."""
    from benchgen_router.model_code import TradeoffCalibration

    record, tensors = calibration_state(calibration, model.config.agent_order)
    model.config.tradeoff_calibration = record
    module = TradeoffCalibration(model.config.calibration_shapes)
    module.load_state_dict({name.removeprefix("tradeoff."): value for name, value in tensors.items()})
    model.tradeoff = module.to(next(model.head.parameters()).device)
