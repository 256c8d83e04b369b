"""Policies scored on held-out rows: fold assignments, the statistics of one point (see the package
docstring), the baselines, the repeated CV over a grid, nested CV for target mode, in-sample
evaluation, and one head per trade-off for multi-head checkpoints."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from benchgen_router.costs import CostData, cheapest_of_best
from benchgen_router.errors import InputError
from benchgen_router.frontier.grid import (
    Searcher,
    Tradeoff,
    default_grid,
    make_searcher,
    run_searches,
    search_settings,
)
from benchgen_router.frontier.pareto import _TIE, area_under_frontier, cheapest_within, mark_frontier
from benchgen_router.head import head_picks

DEFAULT_FOLDS = 5


DEFAULT_REPEATS = 10


DEFAULT_CV_SEED = 0


DEFAULT_KNN_KS = (1, 3, 5, 10)


def fold_assignments(rows: int, folds: int, repeats: int, seed: int) -> np.ndarray:
    """(repeats, rows) fold index of each row in each repeat: seeded shuffles, fold sizes within one."""
    if folds < 2 or folds > rows:
        raise InputError(f"cross-validation needs 2 to {rows} folds for {rows} rows (got {folds}).")
    if repeats < 1:
        raise InputError(f"cross-validation needs at least 1 repeat (got {repeats}).")
    rng = np.random.default_rng(seed)
    assignment = np.empty((repeats, rows), dtype=int)
    for repeat in range(repeats):
        assignment[repeat, rng.permutation(rows)] = np.arange(rows) % folds
    return assignment


@dataclass
class CVPoint:
    """One policy's cross-validated operating point (statistics defined in the module docstring)."""

    name: str
    kind: str  # router | knn | fixed | best_fixed_train | random | oracle | target
    cost_weight: float | None
    latency_weight: float | None
    reward: float
    reward_std_repeats: float
    reward_std_folds: float
    delta_reward: float
    delta_se: float
    cost_per_1k: float
    cost_std_repeats: float
    latency_s: float
    latency_std_repeats: float
    share: dict[str, float]
    deployable: bool = True
    cost_frontier: bool = False
    latency_frontier: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {key: value for key, value in self.__dict__.items() if key != "extra" or value}


def _std(values: np.ndarray) -> float:
    return float(values.std(ddof=1)) if values.size > 1 else 0.0


def _point(
    name: str,
    kind: str,
    choice: np.ndarray,
    data: CostData,
    assignment: np.ndarray,
    reference: np.ndarray,
    tradeoff: Tradeoff | None = None,
    deployable: bool = True,
) -> CVPoint:
    """Statistics of a policy given its held-out choice probabilities (repeats, rows, agents)."""
    reward = (choice * data.rewards).sum(-1)  # (repeats, rows)
    cost = (choice * data.cost_per_1k).sum(-1)
    latency = (choice * data.latency_s).sum(-1)
    folds = int(assignment.max()) + 1
    fold_means = np.array([reward[r, assignment[r] == f].mean() for r in range(len(assignment)) for f in range(folds)])
    reference_reward = (reference * data.rewards).sum(-1)
    paired = (reward - reference_reward).mean(axis=0)
    share = choice.mean(axis=(0, 1))
    return CVPoint(
        name=name,
        kind=kind,
        cost_weight=None if tradeoff is None else tradeoff.cost_weight,
        latency_weight=None if tradeoff is None else tradeoff.latency_weight,
        reward=float(reward.mean()),
        reward_std_repeats=_std(reward.mean(axis=1)),
        reward_std_folds=_std(fold_means),
        delta_reward=float(paired.mean()),
        delta_se=_std(paired) / math.sqrt(len(paired)),
        cost_per_1k=float(cost.mean()),
        cost_std_repeats=_std(cost.mean(axis=1)),
        latency_s=float(latency.mean()),
        latency_std_repeats=_std(latency.mean(axis=1)),
        share={agent: float(s) for agent, s in zip(data.agents, share, strict=True)},
        deployable=deployable,
    )


def _one_hot(picks: np.ndarray, agents: int) -> np.ndarray:
    return np.eye(agents)[picks]


def best_fixed_agent(rewards: np.ndarray, cost: np.ndarray) -> int:
    """The agent with the highest mean reward; ties go to the cheaper one (frontier_a on the pilot,
    tied with frontier_b on reward and cheaper)."""
    means = rewards.mean(axis=0)
    tied = np.flatnonzero(means >= means.max() - _TIE)
    return int(tied[np.argmin(cost.mean(axis=0)[tied])])


def knn_picks(
    train_embeddings: np.ndarray, train_utility: np.ndarray, test_embeddings: np.ndarray, k: int
) -> np.ndarray:
    """Per test row, argmax of the mean utility row of its k most cosine-similar training rows."""
    return knn_vote(train_utility, nearest_rows(train_embeddings, test_embeddings, k))


def nearest_rows(train_embeddings: np.ndarray, test_embeddings: np.ndarray, k: int) -> np.ndarray:
    """(test, k) indices of each test row's k most cosine-similar training rows, most similar first
    (ties: the lower index first). Independent of the utility, so one fold computes it once for
    every trade-off."""

    def normalise(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)

    similarity = normalise(test_embeddings) @ normalise(train_embeddings).T  # (test, train)
    k = min(k, len(train_embeddings))
    return np.argsort(-similarity, axis=1, kind="stable")[:, :k]


def knn_vote(train_utility: np.ndarray, nearest: np.ndarray) -> np.ndarray:
    """Per test row, the agent of the highest mean utility over its nearest training rows."""
    return train_utility[nearest].mean(axis=1).argmax(axis=1)


@dataclass
class FrontierResult:
    agents: list[str]
    rows: int
    folds: int
    repeats: int
    cv_seed: int
    search: dict[str, Any]
    grid: list[Tradeoff]
    points: list[CVPoint]
    reference: str  # name of the reference point (best fixed agent on all rows)
    aiq: dict[str, float]
    aiq_window: tuple[float, float]
    # held-out choice probabilities per point name, (repeats, rows, agents): for paired comparisons
    choices: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def point(self, name: str) -> CVPoint:
        for point in self.points:
            if point.name == name:
                return point
        raise KeyError(name)

    def of_kind(self, kind: str) -> list[CVPoint]:
        return [point for point in self.points if point.kind == kind]


def _router_name(tradeoff: Tradeoff) -> str:
    return f"router {tradeoff.name}"


def cross_validate_frontier(
    embeddings: np.ndarray,
    data: CostData,
    grid: Sequence[Tradeoff] | None = None,
    folds: int = DEFAULT_FOLDS,
    repeats: int = DEFAULT_REPEATS,
    seed: int = DEFAULT_CV_SEED,
    search_kwargs: dict[str, Any] | None = None,
    searcher: Searcher | None = None,
    knn_ks: Sequence[int] = DEFAULT_KNN_KS,
    progress: bool = False,
    other_forms: dict[str, np.ndarray] | None = None,
) -> FrontierResult:
    """Repeated k-fold CV of the router at every trade-off of the grid, kNN at every (k, trade-off),
    and the baselines on the same held-out rows (statistics in the module docstring). `other_forms`
    ({form: embeddings of the same rows in another form}) adds, per trade-off, the same held-out
    heads scoring that form: points "router <trade-off> [<form>]" of kind "router_form"."""
    from tqdm.auto import tqdm

    embeddings = np.asarray(embeddings)
    if embeddings.ndim != 2 or len(embeddings) != len(data):
        raise InputError(
            f"{len(embeddings)} embeddings for {len(data)} labelled rows; embed exactly the labelled prompts, in order."
        )
    grid = list(grid) if grid is not None else default_grid()
    if not grid:
        raise InputError("the trade-off grid is empty; pass at least one weight.")
    settings = search_settings(search_kwargs)
    default_search, hidden_dim = make_searcher(settings)
    search = searcher or default_search
    assignment = fold_assignments(len(data), folds, repeats, seed)
    agents = len(data.agents)
    utilities = {tradeoff: tradeoff.utility(data) for tradeoff in grid}
    router = {tradeoff: np.zeros((repeats, len(data)), dtype=int) for tradeoff in grid}
    knn = {(k, tradeoff): np.zeros((repeats, len(data)), dtype=int) for k in knn_ks for tradeoff in grid}
    fixed_train = np.zeros((repeats, len(data)), dtype=int)
    forms = {form: np.asarray(vectors) for form, vectors in (other_forms or {}).items()}
    in_form = {(form, tradeoff): np.zeros((repeats, len(data)), dtype=int) for form in forms for tradeoff in grid}
    with tqdm(total=repeats * folds * len(grid), desc="frontier CV", unit="search", disable=not progress) as bar:
        for repeat in range(repeats):
            for fold in range(folds):
                test = assignment[repeat] == fold
                train = ~test
                fixed_train[repeat, test] = best_fixed_agent(data.rewards[train], data.cost_per_1k[train])
                nearest = {k: nearest_rows(embeddings[train], embeddings[test], k) for k in knn_ks}
                if searcher is None:  # the package's search: the whole grid in lockstep, one pass over the rows
                    found = run_searches(embeddings[train], [utilities[t][train] for t in grid], settings)
                    thetas = {tradeoff: theta for tradeoff, (theta, _) in zip(grid, found, strict=True)}
                for tradeoff in grid:
                    utility = utilities[tradeoff]
                    theta = thetas[tradeoff] if searcher is None else search(embeddings[train], utility[train])
                    router[tradeoff][repeat, test] = head_picks(theta, embeddings[test], agents, hidden_dim)
                    for form, vectors in forms.items():
                        in_form[form, tradeoff][repeat, test] = head_picks(theta, vectors[test], agents, hidden_dim)
                    for k in knn_ks:
                        knn[k, tradeoff][repeat, test] = knn_vote(utility[train], nearest[k])
                    bar.update()
    extra = {
        f"{_router_name(tradeoff)} [{form}]": ("router_form", _one_hot(picks, agents))
        for (form, tradeoff), picks in in_form.items()
    }
    return _summarise(data, assignment, grid, router, knn, fixed_train, folds, repeats, seed, settings, extra)


def _summarise(
    data: CostData,
    assignment: np.ndarray,
    grid: list[Tradeoff],
    router: dict[Tradeoff, np.ndarray],
    knn: dict[tuple[int, Tradeoff], np.ndarray],
    fixed_train: np.ndarray,
    folds: int,
    repeats: int,
    seed: int,
    settings: dict[str, Any],
    extra_choices: dict[str, tuple[str, np.ndarray]] | None = None,
) -> FrontierResult:
    agents = len(data.agents)
    rows = len(data)
    reference_index = best_fixed_agent(data.rewards, data.cost_per_1k)
    reference_name = f"always {data.agents[reference_index]}"
    broadcast = np.ones((repeats, rows, 1))
    reference = broadcast * np.eye(agents)[reference_index]
    choices: dict[str, np.ndarray] = {}
    points: list[CVPoint] = []

    def add(name: str, kind: str, choice: np.ndarray, tradeoff: Tradeoff | None = None, deployable: bool = True):
        choices[name] = choice
        points.append(_point(name, kind, choice, data, assignment, reference, tradeoff, deployable))

    for tradeoff in grid:
        add(_router_name(tradeoff), "router", _one_hot(router[tradeoff], agents), tradeoff)
    for (k, tradeoff), picks in knn.items():
        add(f"knn{k} {tradeoff.name}", "knn", _one_hot(picks, agents), tradeoff)
    for j, agent in enumerate(data.agents):
        add(f"always {agent}", "fixed", broadcast * np.eye(agents)[j])
    add("best fixed (train folds)", "best_fixed_train", _one_hot(fixed_train, agents))
    add("uniform random", "random", np.full((repeats, rows, agents), 1.0 / agents))
    for name, (kind, choice) in (extra_choices or {}).items():
        add(name, kind, choice)
    # in-sample bounds: they see the held-out row's own rewards, so they are not deployable
    first_best = data.rewards.argmax(axis=1)
    add("oracle (first best)", "oracle", broadcast * _one_hot(first_best, agents), deployable=False)
    cheapest = cheapest_of_best(data.rewards, data.cost_per_1k)
    add("oracle (cheapest best)", "oracle", broadcast * _one_hot(cheapest, agents), deployable=False)
    for tradeoff in grid:
        if tradeoff.cost_weight or tradeoff.latency_weight:
            best_utility = tradeoff.utility(data).argmax(axis=1)
            add(f"oracle {tradeoff.name}", "oracle", broadcast * _one_hot(best_utility, agents), tradeoff, False)

    mark_frontier(points)

    fixed = [p for p in points if p.kind == "fixed"]
    window = (min(p.cost_per_1k for p in fixed), max(p.cost_per_1k for p in fixed))
    # Every family is scored together with the fixed agents: a deployer can always mix in a fixed
    # agent, so "X + fixed agents" minus "fixed agents" is what method X adds over them.
    families = {
        "fixed agents": fixed,
        "router + fixed agents": [p for p in points if p.kind in ("router", "fixed")],
    }
    for k in sorted({k for k, _ in knn}):
        families[f"knn{k} + fixed agents"] = fixed + [
            p for p in points if p.kind == "knn" and p.name.startswith(f"knn{k} ")
        ]
    families["oracle + fixed agents (in-sample)"] = fixed + [p for p in points if p.kind == "oracle"]
    # With every fixed agent at one cost there is no cost range to average over: no AIQ.
    aiq = {
        name: area_under_frontier([(p.cost_per_1k, p.reward) for p in members], *window)
        for name, members in families.items()
        if members and window[1] > window[0]
    }
    return FrontierResult(
        list(data.agents), rows, folds, repeats, seed, settings, grid, points, reference_name, aiq, window, choices
    )


@dataclass
class TargetResult:
    eps: float
    point: CVPoint  # outer-CV point of the target-mode router
    chosen: list[str]  # the trade-off chosen on each outer training set
    reference: CVPoint


def select_tradeoff(inner: FrontierResult, eps: float) -> Tradeoff:
    """Target mode on one training set: the cheapest router point whose CV reward is within eps of the
    best fixed agent of that training set; if none is, the router point with the highest reward."""
    routers = inner.of_kind("router")
    reference = inner.point(inner.reference)
    best = cheapest_within(routers, reference.reward, eps)
    if best is None:
        best = max(routers, key=lambda p: (p.reward, -p.cost_per_1k))
    return Tradeoff(best.cost_weight or 0.0, best.latency_weight or 0.0)


def nested_target_cv(
    embeddings: np.ndarray,
    data: CostData,
    eps: float,
    grid: Sequence[Tradeoff] | None = None,
    outer_folds: int = DEFAULT_FOLDS,
    outer_repeats: int = 2,
    inner_folds: int = DEFAULT_FOLDS,
    inner_repeats: int = 2,
    seed: int = DEFAULT_CV_SEED,
    search_kwargs: dict[str, Any] | None = None,
    searcher: Searcher | None = None,
    progress: bool = False,
) -> TargetResult:
    """Nested CV of target mode: on each outer training set, an inner repeated CV picks the trade-off
    (select_tradeoff; the best fixed agent is that of the outer training rows), a head trained on the
    whole outer training set with it routes the outer test fold. The outer test rows are never seen
    by the choice."""
    grid = list(grid) if grid is not None else [t for t in default_grid() if not t.latency_weight]
    settings = search_settings(search_kwargs)
    default_search, hidden_dim = make_searcher(settings)
    search = searcher or default_search
    assignment = fold_assignments(len(data), outer_folds, outer_repeats, seed)
    picks = np.zeros((outer_repeats, len(data)), dtype=int)
    chosen = []
    for repeat in range(outer_repeats):
        for fold in range(outer_folds):
            test = assignment[repeat] == fold
            train = np.flatnonzero(~test)
            inner = cross_validate_frontier(
                embeddings[train],
                data.subset(train),
                grid,
                inner_folds,
                inner_repeats,
                seed + 1000 * (repeat * outer_folds + fold + 1),
                settings,
                searcher,
                knn_ks=(),
                progress=progress,
            )
            tradeoff = select_tradeoff(inner, eps)
            chosen.append(tradeoff.name)
            theta = search(embeddings[train], tradeoff.utility(data)[train])
            picks[repeat, test] = head_picks(theta, embeddings[test], len(data.agents), hidden_dim)
    agents = len(data.agents)
    reference_index = best_fixed_agent(data.rewards, data.cost_per_1k)
    reference = np.ones((outer_repeats, len(data), 1)) * np.eye(agents)[reference_index]
    point = _point(f"target eps={eps:g}", "target", _one_hot(picks, agents), data, assignment, reference)
    point.extra = {"chosen": {name: chosen.count(name) for name in sorted(set(chosen))}}
    reference_point = _point(f"always {data.agents[reference_index]}", "fixed", reference, data, assignment, reference)
    return TargetResult(eps, point, chosen, reference_point)


IN_SAMPLE_SEARCH = {"in_sample": True}  # what evaluate_policies records as its "search": nothing was searched


def evaluate_policies(
    data: CostData,
    router_picks: dict[str, np.ndarray],
    weights: dict[str, tuple[float, float]] | None = None,
    other_forms: dict[str, np.ndarray] | None = None,
) -> FrontierResult:
    """In-sample operating points of fixed routers on the rows of `data`, against every fixed agent,
    uniform random and the per-task oracles on the same rows, with the frontier marks and the AIQ.

    `router_picks` maps a point name (e.g. "router balanced") to that router's pick per row, as agent
    indices in `data.agents` order; `weights` gives each one's (cost weight, latency weight) where
    known (an operating point's), the others get None. Nothing is trained or held out: the rows are
    scored once (repeats = folds = 1, so ±rep and ±fold are 0), and a router trained on some of these
    rows looks better on them than it will on new queries. Δref ± se is still the paired difference
    to the best fixed agent and its standard error over tasks. The baselines are _summarise's, so
    they are computed exactly as in the CV; "best fixed (train folds)" is left out, having no training
    folds here (it would repeat the reference). With several routers the AIQ also has one entry per
    router, each with the fixed agents only. `other_forms` adds routers' picks on the same rows in
    another form of the prompts (e.g. "router balanced [plain]"), as points of kind "router_form",
    which join no frontier family."""
    rows, agents = len(data), len(data.agents)
    if not router_picks:
        raise ValueError("evaluate_policies needs at least one router's picks")
    weights = weights or {}
    extra: dict[str, tuple[str, np.ndarray]] = {}
    policies = [(name, picks, "router") for name, picks in router_picks.items()]
    policies += [(name, picks, "router_form") for name, picks in (other_forms or {}).items()]
    for name, picks, kind in policies:
        picks = np.asarray(picks)
        if picks.shape != (rows,) or picks.dtype.kind not in "iu" or (picks < 0).any() or (picks >= agents).any():
            raise ValueError(f"picks of {name!r} must be {rows} agent indices in [0, {agents}), got {picks!r}")
        extra[name] = (kind, _one_hot(picks, agents)[None])  # (1 repeat, rows, agents)
    assignment = np.zeros((1, rows), dtype=int)  # a single "fold" holding every row
    fixed_train = np.full((1, rows), best_fixed_agent(data.rewards, data.cost_per_1k))
    result = _summarise(data, assignment, [], {}, {}, fixed_train, 1, 1, 0, dict(IN_SAMPLE_SEARCH), extra)
    names = [p.name for p in result.points]
    if len(set(names)) != len(names):
        raise ValueError(f"router names {list(router_picks)} repeat a baseline's name")
    result.points = [p for p in result.points if p.kind != "best_fixed_train"]
    result.choices = {p.name: result.choices[p.name] for p in result.points}
    routers = result.of_kind("router")
    for point in routers + result.of_kind("router_form"):
        if point.name in weights:
            point.cost_weight, point.latency_weight = (float(w) for w in weights[point.name])
    # routers first, as in the CV table
    result.points = routers + [p for p in result.points if p.kind != "router"]
    mark_frontier(result.points)  # again, without the dropped point (it changes no flag: it is the reference)
    if len(routers) > 1 and result.aiq:
        fixed = [(p.cost_per_1k, p.reward) for p in result.of_kind("fixed")]
        single = {
            f"{p.name} + fixed agents": area_under_frontier([*fixed, (p.cost_per_1k, p.reward)], *result.aiq_window)
            for p in routers
        }
        ordered = list(result.aiq.items())
        at = [name for name, _ in ordered].index("router + fixed agents") + 1
        result.aiq = dict(ordered[:at] + list(single.items()) + ordered[at:])
    return result


class TrainedHead(NamedTuple):
    name: str
    cost_weight: float
    latency_weight: float
    theta: np.ndarray
    cv_point: dict[str, Any] | None


def train_heads_over_grid(
    embeddings: np.ndarray,
    data: CostData,
    grid: Sequence[Tradeoff],
    search_kwargs: dict[str, Any] | None = None,
    cv: FrontierResult | None = None,
) -> list[TrainedHead]:
    """One head per trade-off, each trained on all rows with the same search, with its CV point (from
    `cv`, a cross_validate_frontier run with the same data and search; None leaves it out)."""
    embeddings = np.asarray(embeddings)
    if len(embeddings) != len(data):
        raise InputError(f"{len(embeddings)} embeddings for {len(data)} labelled rows; embed the labelled prompts.")
    make_searcher(search_kwargs)  # the options checked before any work
    found = run_searches(embeddings, [tradeoff.utility(data) for tradeoff in grid], search_kwargs)
    heads = []
    for tradeoff, (theta, _) in zip(grid, found, strict=True):
        point = None
        if cv is not None:
            try:
                point = cv.point(_router_name(tradeoff)).to_dict()
            except KeyError:
                raise InputError(
                    f"the CV run has no point for trade-off {tradeoff.name}; run it over the same grid."
                ) from None
        heads.append(TrainedHead(tradeoff.name, tradeoff.cost_weight, tradeoff.latency_weight, theta, point))
    return heads
