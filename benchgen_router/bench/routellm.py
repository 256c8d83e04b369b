"""RouteLLM's MMLU and GSM8K outcomes as a routing benchmark, with RouteLLM's own metrics.

    from benchgen_router.bench.routellm import RouteLLMBenchConfig, run_benchmark
    result = run_benchmark(RouteLLMBenchConfig(data_dir=Path("routellm-evals")))

The data (RouteLLM's evaluation outcomes, lm-sys/RouteLLM routellm/evals) give, per question, whether
gpt-4-1106-preview (strong) and Mixtral-8x7B-Instruct (weak) answered it correctly; the contaminated
prompts RouteLLM drops are dropped. Cost is RouteLLM's: the share of calls to the strong model.

Every split (repeated k-fold on MMLU and GSM8K; leave-subjects-out on MMLU, the subjects being the
response files' stems) trains every router on the same training rows and scores it on the same
held-out rows with frontier.gap (APGR, CPT(50%), CPT(80%) as routellm/evals computes them):
- CMA-ES heads over a cost sweep: the package's search (frontier.grid.run_search) on the utility
  R - w * C for each cost weight w (reward per strong call); the curve is their held-out points plus
  always-weak and always-strong;
- the reward-only CMA-ES head (w = 0) with its logit margin swept at RouteLLM's thresholds;
- the probability head (training.probability) with its decision rule swept: at two agents, "the best
  expected reward minus lambda times cost" sends a query to the strong agent when p_strong - p_weak
  exceeds lambda, so sweeping lambda is RouteLLM's threshold sweep of p_strong - p_weak;
- kNN (frontier.cv.knn_picks) over the same cost weights, plus the endpoints;
- random (RouteLLM's: uniform random scores through the same sweep, averaged over draws) and the
  oracle (RouteLLM's get_optimal_accuracy at every share).
Figures are mean and standard deviation (ddof=1) over the held-out folds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchgen_router.errors import InputError
from benchgen_router.frontier import gap as gp

logger = logging.getLogger("benchgen_router")

STRONG_MODEL = "gpt-4-1106-preview"
WEAK_MODEL = "mistralai/Mixtral-8x7B-Instruct-v0.1"
DEFAULT_BACKBONE = "sentence-transformers/all-MiniLM-L6-v2"  # the default router's, installed with the package
# Reward per strong call: a query goes to the strong model when its expected gain in accuracy exceeds w.
DEFAULT_COST_WEIGHTS = (0.0, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5)
DEFAULT_KNN_K = 20
RANDOM_DRAWS = 10  # routellm/evals/evaluate.py --random-iters
DATASETS = {
    "mmlu": (("mmlu", "responses"), ("mmlu", "contaminated_prompts.jsonl")),
    "gsm8k": (("gsm8k", "gsm8k_responses.csv"), ("gsm8k", "contaminated_prompts.jsonl")),
}
METHODS = ("cmaes_sweep", "cmaes_margin", "probability", "knn", "random", "oracle")
METHOD_NAMES = {
    "cmaes_sweep": "CMA-ES heads, cost sweep",
    "cmaes_margin": "CMA-ES reward-only head, margin swept",
    "probability": "probability head, rule swept",
    "knn": "kNN, cost sweep",
    "random": "random",
    "oracle": "oracle",
}


@dataclass
class RouteLLMBenchConfig:
    """What the benchmark runs; `scripts/routellm_benchmark.py --help` describes each."""

    data_dir: Path
    datasets: tuple[str, ...] = ("mmlu", "gsm8k")
    folds: int = 5
    repeats: int = 3
    cv_seed: int = 0
    subject_folds: int = 5  # leave-subjects-out folds on MMLU; 0: none
    cost_weights: tuple[float, ...] = DEFAULT_COST_WEIGHTS
    search: dict[str, Any] = field(default_factory=dict)  # run_search options (default: the release search)
    cmaes_splits: int | None = None  # train CMA-ES on the first this many splits of each kind only (time)
    knn_k: int = DEFAULT_KNN_K
    num_results: int = gp.ROUTELLM_NUM_RESULTS
    limit: int | None = None  # the first rows of each dataset only (a quick try)
    sample: dict[str, int] = field(default_factory=dict)  # dataset -> a seeded random sample of that many rows
    backbone: str = DEFAULT_BACKBONE
    cache_dir: Path | None = None  # embedding cache (None: the package's default folder)
    progress: bool = True


@dataclass
class SplitResult:
    """One held-out fold: each method's curve and figures on it."""

    kind: str  # "k-fold" or "subjects-out"
    repeat: int
    fold: int
    rows: int
    weak: float
    strong: float
    curves: dict[str, gp.GapCurve]
    figures: dict[str, gp.GapFigures]
    seconds: dict[str, float]


@dataclass
class DatasetResult:
    name: str
    rows: int
    dropped_contaminated: int
    weak: float
    strong: float
    splits: list[SplitResult]

    def summary(self, kind: str) -> dict[str, dict[str, Any]]:
        """Per method: folds run, mean and std (ddof=1) of APGR, CPT(50%), CPT(80%) over them, seconds."""
        out: dict[str, dict[str, Any]] = {}
        for method in METHODS:
            runs = [s for s in self.splits if s.kind == kind and method in s.figures]
            if not runs:
                continue
            stats = {"folds": len(runs), "seconds": float(sum(s.seconds.get(method, 0.0) for s in runs))}
            for key, values in (
                ("apgr", [s.figures[method].area for s in runs]),
                ("cpt50", [s.figures[method].recover[0.5] for s in runs]),
                ("cpt80", [s.figures[method].recover[0.8] for s in runs]),
            ):
                array = np.asarray(values, dtype=float)
                stats[key] = float(array.mean())
                stats[f"{key}_std"] = float(array.std(ddof=1)) if len(array) > 1 else 0.0
            out[method] = stats
        return out

    def mean_curve(self, kind: str, method: str, grid: np.ndarray) -> np.ndarray | None:
        """The mean over folds of each fold's performance gap recovered at the shares in `grid`."""
        runs = [s for s in self.splits if s.kind == kind and method in s.curves]
        if not runs:
            return None
        recovered = [
            (np.interp(grid, s.curves[method].cost, s.curves[method].quality) - s.weak) / (s.strong - s.weak)
            for s in runs
        ]
        return np.mean(recovered, axis=0)


@dataclass
class BenchResult:
    config: RouteLLMBenchConfig
    datasets: list[DatasetResult]
    seconds: float


def dataset_paths(data_dir: Path, name: str) -> tuple[Path, Path]:
    """(responses, contamination list) of one of RouteLLM's datasets under its evals folder."""
    if name not in DATASETS:
        raise InputError(f"unknown dataset {name!r}; choose from {', '.join(DATASETS)}.")
    responses, contaminated = (data_dir.joinpath(*parts) for parts in DATASETS[name])
    if not responses.exists():
        raise InputError(f"{responses} not found; pass --data-dir with RouteLLM's evals data (mmlu/, gsm8k/).")
    return responses, contaminated


def subject_assignments(groups: list[str | None], folds: int, seed: int) -> np.ndarray:
    """(1, rows) fold of each row: the subjects shuffled (seeded) and dealt into `folds` folds."""
    subjects = sorted({str(group) for group in groups})
    if folds < 2 or folds > len(subjects):
        raise InputError(f"leave-subjects-out needs 2 to {len(subjects)} folds for {len(subjects)} subjects.")
    order = np.random.default_rng(seed).permutation(len(subjects))
    fold_of = {subjects[index]: position % folds for position, index in enumerate(order)}
    return np.array([[fold_of[str(group)] for group in groups]])


def run_benchmark(config: RouteLLMBenchConfig, embed: Callable[..., Any] | None = None) -> BenchResult:
    """Every dataset of `config`, every split, every method (see the module docstring)."""
    from benchgen_router.importing import read_routellm_csvs

    started = time.perf_counter()
    results = []
    for name in config.datasets:
        responses, contaminated = dataset_paths(config.data_dir, name)
        outcomes = read_routellm_csvs(
            [responses], contaminated=[contaminated] if contaminated.exists() else [], models=[WEAK_MODEL, STRONG_MODEL]
        )
        if config.limit is not None:
            outcomes = outcomes.head(config.limit)
        rows = sample_rows(len(outcomes), config.sample.get(name), config.cv_seed)
        prompts = [outcomes.prompts[i] for i in rows]
        embeddings = _embed(prompts, config, embed)
        groups = [outcomes.groups[i] for i in rows]
        result = _run_dataset(name, groups, outcomes.rewards[rows], embeddings, config)
        result.dropped_contaminated = outcomes.dropped_contaminated
        results.append(result)
    return BenchResult(config, results, time.perf_counter() - started)


def _embed(prompts: list[str], config: RouteLLMBenchConfig, embed: Callable[..., Any] | None) -> np.ndarray:
    from benchgen_router.embeddings import default_cache_dir, embed_prompts

    embed = embed or embed_prompts
    cache = config.cache_dir or default_cache_dir()
    return embed(
        prompts, config.backbone, [WEAK_MODEL, STRONG_MODEL], cache_dir=cache, progress=config.progress
    ).vectors


def sample_rows(rows: int, count: int | None, seed: int) -> np.ndarray:
    """Every row, or a seeded random sample of `count` of them in their original order."""
    if count is None or count >= rows:
        return np.arange(rows)
    if count < 2:
        raise InputError(f"a sample needs at least 2 rows (got {count}).")
    return np.sort(np.random.default_rng(seed).choice(rows, size=count, replace=False))


def _run_dataset(
    name: str, groups: list[str | None], rewards: np.ndarray, embeddings: np.ndarray, config: RouteLLMBenchConfig
) -> DatasetResult:
    """Every split of one dataset (reward columns: weak, strong)."""
    from tqdm.auto import tqdm

    from benchgen_router.frontier.cv import fold_assignments

    plans = [("k-fold", fold_assignments(len(rewards), config.folds, config.repeats, config.cv_seed))]
    if name == "mmlu" and config.subject_folds:
        plans.append(("subjects-out", subject_assignments(groups, config.subject_folds, config.cv_seed)))
    splits: list[SplitResult] = []
    total = sum(int(assign.max() + 1) * len(assign) for _, assign in plans)
    with tqdm(total=total, desc=f"{name} folds", disable=not config.progress) as bar:
        for kind, assignment in plans:
            count = 0
            for repeat, folds in enumerate(assignment):
                for fold in range(int(folds.max()) + 1):
                    test = folds == fold
                    with_cmaes = config.cmaes_splits is None or count < config.cmaes_splits
                    splits.append(_run_split(kind, repeat, fold, embeddings, rewards, ~test, test, config, with_cmaes))
                    count += 1
                    bar.update()
    return DatasetResult(
        name,
        len(rewards),
        0,
        float(rewards[:, 0].mean()),
        float(rewards[:, 1].mean()),
        splits,
    )


def _run_split(
    kind: str,
    repeat: int,
    fold: int,
    embeddings: np.ndarray,
    rewards: np.ndarray,
    train: np.ndarray,
    test: np.ndarray,
    config: RouteLLMBenchConfig,
    with_cmaes: bool,
) -> SplitResult:
    """Train every method on `train`, score each on `test` (weak = column 0, strong = column 1)."""
    from benchgen_router.frontier.cv import knn_picks
    from benchgen_router.frontier.grid import run_search
    from benchgen_router.head import head_logits

    agents = [WEAK_MODEL, STRONG_MODEL]
    train_x, test_x, train_r, test_r = embeddings[train], embeddings[test], rewards[train], rewards[test]
    pool = gp.two_agent_gap(test_r, agents, strong=1)
    strong_cost = np.tile([0.0, 1.0], (len(train_r), 1))
    test_cost = np.tile([0.0, 1.0], (len(test_r), 1))
    curves: dict[str, gp.GapCurve] = {}
    seconds: dict[str, float] = {}

    def timed(method: str, make: Callable[[], gp.GapCurve]) -> None:
        started = time.perf_counter()
        curves[method] = make()
        seconds[method] = time.perf_counter() - started

    def cmaes() -> gp.GapCurve:
        picks, margins = [], None
        for weight in config.cost_weights:
            theta, _ = run_search(train_x, train_r - weight * strong_cost, config.search)
            logits = head_logits(theta[None, :], test_x, 2, 0)[0]
            picks.append(logits.argmax(axis=1))
            if weight == 0:
                margins = logits[:, 1] - logits[:, 0]
        if margins is not None:
            curves["cmaes_margin"] = gp.score_curve("cmaes_margin", margins, test_r, 1, config.num_results)
        return pool.curve_of_picks("cmaes_sweep", picks, test_r, test_cost)

    def probability() -> gp.GapCurve:
        from benchgen_router.training.probability import fit_probability_head

        head = fit_probability_head(train_x, train_r, seed=config.cv_seed)
        p = head.predict(test_x)
        return gp.score_curve("probability", p[:, 1] - p[:, 0], test_r, 1, config.num_results)

    def knn() -> gp.GapCurve:
        picks = [
            knn_picks(train_x, train_r - weight * strong_cost, test_x, config.knn_k) for weight in config.cost_weights
        ]
        return pool.curve_of_picks("knn", picks, test_r, test_cost)

    if with_cmaes:
        timed("cmaes_sweep", cmaes)
    if _probability_head_available():
        timed("probability", probability)
    timed("knn", knn)
    timed("oracle", lambda: gp.oracle_curve(pool, test_r, test_cost))
    figures = {method: pool.figures(curve) for method, curve in curves.items()}
    figures["random"] = _random_figures(pool, test_r, np.random.default_rng([config.cv_seed, repeat, fold]), config)
    curves["random"] = pool.random()
    return SplitResult(
        kind, repeat, fold, int(test.sum()), pool.cheapest_quality, pool.best_quality, curves, figures, seconds
    )


def _random_figures(
    pool: gp.PoolGap, test_r: np.ndarray, rng: np.random.Generator, config: RouteLLMBenchConfig
) -> gp.GapFigures:
    """Random routing's figures on one split: the mean over RANDOM_DRAWS random scores."""
    draws = [
        pool.figures(gp.score_curve("random", rng.random(len(test_r)), test_r, 1, config.num_results))
        for _ in range(RANDOM_DRAWS)
    ]
    return gp.GapFigures(
        "random",
        float(np.mean([d.area for d in draws])),
        {x: float(np.mean([d.recover[x] for d in draws])) for x in gp.GAP_FRACTIONS},
        {x: float(np.mean([d.recover_cost[x] for d in draws])) for x in gp.GAP_FRACTIONS},
        (0.0, 1.0),
    )


def _probability_head_available() -> bool:
    try:
        from benchgen_router.training.probability import fit_probability_head  # noqa: F401
    except ImportError:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# Reporting


def format_results(result: BenchResult) -> str:
    """The tables as Markdown: per dataset and split kind, each method's APGR and CPTs, mean ± std."""
    lines = []
    for data in result.datasets:
        for kind in ("k-fold", "subjects-out"):
            summary = data.summary(kind)
            if not summary:
                continue
            lines += [
                f"### {data.name}, {kind} ({data.rows} questions after decontamination; weak {data.weak:.3f}, "
                f"strong {data.strong:.3f})",
                "",
                "| router | folds | APGR | CPT(50%) | CPT(80%) | train+score s |",
                "| --- | ---: | ---: | ---: | ---: | ---: |",
            ]
            for method, stats in summary.items():
                lines.append(
                    f"| {METHOD_NAMES[method]} | {stats['folds']} | {stats['apgr']:.3f} ± {stats['apgr_std']:.3f} | "
                    f"{100 * stats['cpt50']:.1f}% ± {100 * stats['cpt50_std']:.1f} | "
                    f"{100 * stats['cpt80']:.1f}% ± {100 * stats['cpt80_std']:.1f} | {stats['seconds']:.0f} |"
                )
            lines.append("")
    return "\n".join(lines)


def results_to_dict(result: BenchResult) -> dict[str, Any]:
    """The figures as plain JSON types: settings, per-dataset summaries and every fold's figures."""
    config = result.config
    return {
        "settings": {
            "datasets": list(config.datasets),
            "folds": config.folds,
            "repeats": config.repeats,
            "cv_seed": config.cv_seed,
            "subject_folds": config.subject_folds,
            "cost_weights": list(config.cost_weights),
            "search": config.search,
            "cmaes_splits": config.cmaes_splits,
            "knn_k": config.knn_k,
            "num_results": config.num_results,
            "limit": config.limit,
            "backbone": config.backbone,
        },
        "seconds": result.seconds,
        "datasets": [
            {
                "name": data.name,
                "rows": data.rows,
                "dropped_contaminated": data.dropped_contaminated,
                "weak_accuracy": data.weak,
                "strong_accuracy": data.strong,
                "summary": {kind: data.summary(kind) for kind in ("k-fold", "subjects-out")},
                "folds": [
                    {
                        "kind": s.kind,
                        "repeat": s.repeat,
                        "fold": s.fold,
                        "rows": s.rows,
                        "weak": s.weak,
                        "strong": s.strong,
                        "figures": {method: f.to_dict() for method, f in s.figures.items()},
                    }
                    for s in data.splits
                ],
            }
            for data in result.datasets
        ],
    }


def plot_results(result: BenchResult, png: str | Path) -> None:
    """One panel per dataset and split kind: each method's mean held-out gap-recovered curve."""
    from benchgen_router.frontier.plots import plot_gap_panels

    grid = np.linspace(0, 1, 101)
    panels = []
    for data in result.datasets:
        for kind in ("k-fold", "subjects-out"):
            lines = [
                (METHOD_NAMES[method], grid, curve)
                for method in METHODS
                if (curve := data.mean_curve(kind, method, grid)) is not None
            ]
            if lines:
                panels.append((f"{data.name}, {kind}", lines))
    plot_gap_panels(panels, png, "share of strong-model calls", "performance gap recovered (held-out, mean over folds)")
