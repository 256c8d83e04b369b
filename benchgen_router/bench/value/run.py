"""The folds and the loop of a routing-value benchmark: every router fitted on the same training rows and
scored on the same held-out rows, over repeated k-fold and (where the tasks have groups) leave-groups-out.

Costs the routers know are each agent's mean cost per 1,000 queries on the training rows. The sweeps are
in units of the reference's cost (the single model best on the training rows), so one setting serves any
pool and any currency: a CMA-ES head for cost weight w is searched on R - w * C / C_ref, and the `lambda`
rule's lambda is lambda' / C_ref. With two agents the RouteLLM figures (APGR, CPT) are added, each router's
probability margin swept at RouteLLM's thresholds (frontier.gap).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchgen_router.bench.value import metrics
from benchgen_router.bench.value.data import OutcomeMatrix
from benchgen_router.bench.value.routers import DEFAULT_KNN_K, DEFAULT_ROUTERS, ROUTERS, Fold, fit_and_predict
from benchgen_router.errors import InputError

DEFAULT_BACKBONE = "sentence-transformers/all-MiniLM-L6-v2"  # the default router's, installed with the package
# Reward per unit of the reference's cost (per query): a CMA-ES head per weight.
DEFAULT_COST_WEIGHTS = (0.0, 0.05, 0.1, 0.2, 0.4, 0.8)
# The `lambda` rule's lambda, in probability per unit of the reference's cost: 0, then up to where every
# query goes to the cheapest agent.
DEFAULT_LAMBDAS = (0.0, *np.geomspace(1e-3, 1e2, 41).tolist())
DEFAULT_TOLERANCES = (0.0, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)
# `usd-per-1k` budgets asked of the probability head, as shares of the reference's cost.
DEFAULT_BUDGETS = (0.1, 0.2, 0.3, 0.4, 0.6, 0.8)
RULES = ("lambda", "tolerance")
RANDOM_DRAWS = 10  # routellm/evals/evaluate.py --random-iters


@dataclass
class ValueConfig:
    """What the benchmark runs; `benchgen-router bench value --help` describes each."""

    folds: int = 5
    repeats: int = 3  # k-fold repeats (0: none, the leave-groups-out folds only)
    group_folds: int = 5  # leave-groups-out folds (0: none; needs task groups)
    seed: int = 0
    routers: tuple[str, ...] = DEFAULT_ROUTERS
    rules: tuple[str, ...] = RULES
    cost_weights: tuple[float, ...] = DEFAULT_COST_WEIGHTS
    lambdas: tuple[float, ...] = DEFAULT_LAMBDAS
    tolerances: tuple[float, ...] = DEFAULT_TOLERANCES
    budgets: tuple[float, ...] = DEFAULT_BUDGETS
    knn_k: int = DEFAULT_KNN_K
    search: dict[str, Any] = field(default_factory=dict)  # CMA-ES options (default: the release search)
    cmaes_splits: int | None = None  # fit CMA-ES on the first this many folds of each kind only (time)
    num_results: int = 10  # RouteLLM's threshold bins, for two-agent pools
    backbone: str = DEFAULT_BACKBONE
    finetune: dict[str, Any] | None = None  # the finetuned router's FinetuneSettings fields (None: its defaults)
    cache_dir: Path | None = None  # embedding cache (None: the package's)
    progress: bool = True


@dataclass
class FoldResult:
    """One held-out fold: the reference, the single models, and each curve's points and figures."""

    kind: str  # "k-fold" or "groups-out"
    repeat: int
    fold: int
    rows: int
    reference: str
    reference_point: tuple[float, float]  # its held-out (cost per 1k, accuracy)
    singles: dict[str, tuple[float, float]]
    curves: dict[str, metrics.Points]  # "<router>" or "<router>/<rule>", plus "zero router" and "oracle"
    figures: dict[str, metrics.CurveFigures]
    window: tuple[float, float]
    notes: dict[str, str]
    budgets: list[dict[str, float]]  # the probability head's usd-per-1k rule: asked, spent, accuracy
    seconds: dict[str, float]
    gap: dict[str, Any] = field(default_factory=dict)  # two agents: RouteLLM's figures per curve


@dataclass
class ValueResult:
    matrix: str
    agents: list[str]
    rows: int
    cost_unit: str
    config: ValueConfig
    folds: list[FoldResult]
    seconds: float


def run_value_benchmark(
    matrix: OutcomeMatrix,
    config: ValueConfig,
    embed: Callable[[list[str]], np.ndarray] | None = None,
    features: dict[str, np.ndarray] | None = None,
) -> ValueResult:
    """Every fold, every router (see the module docstring). `embed` maps prompts to (n, D) embeddings
    (default: the backbone's, through the package's embedding cache); `features` are further per-row arrays
    (by name, rows in the matrix's order) that routers may read from their folds."""
    from tqdm.auto import tqdm

    unknown = sorted(set(config.routers) - set(ROUTERS))
    if unknown:
        raise InputError(f"unknown router {unknown[0]!r}; choose from {', '.join(ROUTERS)}.")
    if matrix.rewards.shape[1] < 2:
        raise InputError("a routing benchmark needs a pool of at least 2 agents.")
    plans = fold_plans(matrix, config)  # before the embedding pass: a bad setting costs nothing
    started = time.perf_counter()
    embeddings = np.asarray((embed or _embedder(config))(list(matrix.prompts)), dtype=np.float32)
    features = features or {}
    wrong = [name for name, values in features.items() if len(values) != len(matrix)]
    if wrong:
        raise InputError(f"feature {wrong[0]!r} has {len(features[wrong[0]])} rows for {len(matrix)} tasks.")
    total = sum(int(assignment.max() + 1) * len(assignment) for _, assignment in plans)
    results = []
    with tqdm(total=total, desc=f"{matrix.name} folds", disable=not config.progress) as bar:
        for kind, assignment in plans:
            count = 0
            for repeat, folds in enumerate(assignment):
                for fold in range(int(folds.max()) + 1):
                    test = folds == fold
                    with_cmaes = config.cmaes_splits is None or count < config.cmaes_splits
                    results.append(
                        _run_fold(matrix, embeddings, features, kind, repeat, fold, ~test, test, config, with_cmaes)
                    )
                    count += 1
                    bar.update()
    return ValueResult(
        matrix.name, list(matrix.agents), len(matrix), matrix.cost_unit, config, results, time.perf_counter() - started
    )


def fold_plans(matrix: OutcomeMatrix, config: ValueConfig) -> list[tuple[str, np.ndarray]]:
    """(kind, (repeats, rows) fold of each row) for each kind of folds the run asks for: k-fold unless
    repeats is 0, leave-groups-out unless group_folds is 0."""
    from benchgen_router.frontier.cv import fold_assignments

    if not config.repeats and not config.group_folds:
        raise InputError("nothing to run: pass repeats >= 1 (k-fold), group_folds >= 2 (leave-groups-out) or both.")
    plans = []
    if config.repeats:
        plans.append(("k-fold", fold_assignments(len(matrix), config.folds, config.repeats, config.seed)))
    if config.group_folds:
        if any(group is None for group in matrix.groups):
            raise InputError("leave-groups-out needs a task_group on every task; pass group_folds=0 to skip it.")
        plans.append(("groups-out", group_assignments(matrix.groups, config.group_folds, config.seed)))
    return plans


def _embedder(config: ValueConfig) -> Callable[[list[str]], np.ndarray]:
    from benchgen_router.embeddings import default_cache_dir, embed_prompts

    def embed(prompts: list[str]) -> np.ndarray:
        cache = config.cache_dir or default_cache_dir()
        return embed_prompts(prompts, config.backbone, ["router"], cache_dir=cache, progress=config.progress).vectors

    return embed


def group_assignments(groups: list[str | None], folds: int, seed: int) -> np.ndarray:
    """(1, rows) fold of each row: the groups shuffled (seeded) and dealt into `folds` folds."""
    names = sorted({str(group) for group in groups})
    if folds < 2 or folds > len(names):
        raise InputError(f"leave-groups-out needs 2 to {len(names)} folds for {len(names)} groups.")
    order = np.random.default_rng(seed).permutation(len(names))
    fold_of = {names[index]: position % folds for position, index in enumerate(order)}
    return np.array([[fold_of[str(group)] for group in groups]])


def _run_fold(
    matrix: OutcomeMatrix,
    embeddings: np.ndarray,
    features: dict[str, np.ndarray],
    kind: str,
    repeat: int,
    fold: int,
    train_rows: np.ndarray,
    test_rows: np.ndarray,
    config: ValueConfig,
    with_cmaes: bool,
) -> FoldResult:
    groups, prompts = np.asarray(matrix.groups, dtype=object), np.asarray(matrix.prompts, dtype=object)

    def rows(mask: np.ndarray) -> Fold:
        extra = {name: values[mask] for name, values in features.items()}
        rewards, cost = matrix.rewards[mask], matrix.cost_per_1k[mask]
        return Fold(embeddings[mask], groups[mask], rewards, cost, prompts[mask], extra)

    train, test = rows(train_rows), rows(test_rows)
    reference = metrics.best_single_model(train.rewards, train.cost_per_1k)
    known_costs = train.cost_per_1k.mean(axis=0)  # what a router knows of each agent's price
    scale = float(known_costs[reference])
    if scale <= 0:
        raise InputError(f"{matrix.agents[reference]} costs nothing on the training rows; costs must be positive.")
    settings = {
        "seed": config.seed,
        "knn_k": config.knn_k,
        "search": config.search,
        "cost_weights": [weight / scale for weight in config.cost_weights],
        "backbone": config.backbone,  # what the finetuned router trains
        "finetune": config.finetune,
    }
    singles = metrics.single_models(test.rewards, test.cost_per_1k)
    curves: dict[str, metrics.Points] = {"zero router": singles}
    notes, seconds, scores, budgets = {}, {}, {}, []
    for name in config.routers:
        if name == "cmaes" and not with_cmaes:
            continue
        started = time.perf_counter()
        fitted = fit_and_predict(name, train, test, settings)
        if fitted.note:
            notes[name] = fitted.note
        if fitted.probabilities is not None:
            for rule in config.rules:
                picks = _rule_picks(fitted.probabilities, known_costs, rule, config, scale)
                curves[f"{name}/{rule}"] = [metrics.points_of_picks(p, test.rewards, test.cost_per_1k) for p in picks]
            scores[name] = fitted.probabilities
        if fitted.picks:
            curves[name] = [metrics.points_of_picks(p, test.rewards, test.cost_per_1k) for p in fitted.picks.values()]
        if fitted.train_probabilities is not None:
            budgets = _budgets(fitted, known_costs, test, config, scale, matrix.agents)
        scores.update(fitted.scores)
        seconds[name] = time.perf_counter() - started
    window = _shared_window(curves)
    curves["oracle"] = metrics.oracle_points(test.rewards, test.cost_per_1k)
    reference_point = singles[reference]
    result = FoldResult(
        kind,
        repeat,
        fold,
        int(test_rows.sum()),
        matrix.agents[reference],
        reference_point,
        dict(zip(matrix.agents, singles, strict=True)),
        curves,
        {name: metrics.figures(points, reference_point, window) for name, points in curves.items()},
        window,
        notes,
        budgets,
        seconds,
    )
    if len(matrix.agents) == 2:
        from benchgen_router.bench.value.two_agents import routellm_figures

        seed = [config.seed, repeat, fold]
        result.gap = routellm_figures(scores, curves, test, known_costs, config.num_results, RANDOM_DRAWS, seed)
    return result


def _shared_window(curves: dict[str, metrics.Points]) -> tuple[float, float]:
    from benchgen_router.frontier.pareto import aiq_window

    return aiq_window(curves.values())


def _rule_picks(
    probabilities: np.ndarray, costs: np.ndarray, rule: str, config: ValueConfig, scale: float
) -> list[np.ndarray]:
    """Each setting's picks under `rule`, as the router decides (tradeoffs.decide)."""
    from benchgen_router.tradeoffs import decide

    if rule == "lambda":
        settings = [f"lambda={value / scale!r}" for value in config.lambdas]
    elif rule == "tolerance":
        settings = [f"tolerance={value!r}" for value in config.tolerances]
    else:
        raise InputError(f"unknown rule {rule!r}; choose from {', '.join(RULES)}.")
    return [decide(probabilities, costs, setting) for setting in settings]


def _budgets(
    fitted: Any, costs: np.ndarray, test: Fold, config: ValueConfig, scale: float, agents: list[str]
) -> list[dict[str, float]]:
    """The `usd-per-1k` rule at each budget, calibrated on the training rows as the trainer calibrates:
    the budget asked, the held-out spend and accuracy (all per 1,000 queries, in the matrix's unit)."""
    from benchgen_router.tradeoffs import decide, tradeoff_calibration

    calibration = tradeoff_calibration(fitted.train_probabilities, costs, agents)
    rows = []
    for share in config.budgets:
        asked = share * scale
        picks = decide(fitted.probabilities, costs, f"usd-per-1k={asked!r}", calibration, agents)
        spent, accuracy = metrics.points_of_picks(picks, test.rewards, test.cost_per_1k)
        rows.append({"share": share, "asked": asked, "spent": spent, "accuracy": accuracy})
    return rows
