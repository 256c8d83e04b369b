"""A training run: embed, search a head per operating point, fit the guard, cross-validate, write."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchgen_router import ood as ood_defaults
from benchgen_router.errors import setting_error
from benchgen_router.head import OPERATING_HEADS_FILE
from benchgen_router.manifest import make_manifest
from benchgen_router.release.convert import Release, write_release
from benchgen_router.release.report import CrossValidation, GuardReport, PointFigures, PointReport, TrainingReport
from benchgen_router.training.config import (
    DEFAULT_REWARD_COLUMN,
    TrainConfig,
    check_config,
    rewards_source,
    search_options,
)
from benchgen_router.training.guard import fit_task_guard

logger = logging.getLogger("benchgen_router")


@dataclass
class TrainResult:
    """What a run produced: its typed report (manifest.json and training_report.json are its JSON),
    the manifest it wrote, and the default head's search result."""

    report: TrainingReport
    manifest: dict[str, Any]
    head: Any  # training.SearchResult of the default head
    finetuned: Any = None  # a --finetune run's training.finetune.Finetuned: the trained model and its states


def train(config: TrainConfig) -> TrainResult:
    """Train the head (one per operating point), its guard and its CV figures; write the run folder
    (and with `export`, the Hub folder). What the command prints comes from the result."""
    if config.head_kind == "probability":  # a trade-off chosen per request: training/probability.py
        from benchgen_router.training.probability import train_probability

        return train_probability(config)
    from benchgen_router.frontier import check_search_options
    from benchgen_router.release.folder import check_output_folder

    check_config(config)  # before any work
    check_search_options(search_options(config))
    if config.export is not None:
        check_output_folder(config.export, overwrite=False)  # before the work, so a bad folder costs nothing
    data, task_rows, test, how, cost_data = read_training_data(config)

    # The data are good: now the heavy imports (torch, transformers).
    from benchgen_router.forms import QUERY_FORMATS, in_form
    from benchgen_router.model_code import canonical_query

    timings: dict[str, float] = {}
    embed = backbone_embedder(config, data.agents)
    rules = QUERY_FORMATS[config.query_format]
    started = time.perf_counter()
    embedded = embed([canonical_query(prompt, rules) for prompt in data.prompts])
    # The labelled tasks as users would type them, for the figures on that form.
    plain = embed([canonical_query(prompt, rules) for prompt in in_form(data.prompts, "plain")]).vectors
    timings["embedding_seconds"] = time.perf_counter() - started
    trained_guard = None
    if not config.no_ood_guard:
        started = time.perf_counter()
        labelled = {"formatted": embedded.vectors, "plain": plain}
        trained_guard = fit_task_guard(config, task_rows, data, test, embed, rules, labelled, cost_data)
        timings["ood_guard_seconds"] = time.perf_counter() - started
    embeddings, plain = embedded.vectors.astype(np.float64), plain.astype(np.float64)
    options = search_options(config)
    points = dict(config.operating_points or [])

    # One head per operating point (or the one head), each searched on the training rows, all in lockstep.
    tradeoffs = points or {None: None}
    utilities = [point_utility(data.rewards, cost_data, tradeoff)[~test] for tradeoff in tradeoffs.values()]
    found = point_searches(embeddings[~test], data.rewards[~test], utilities, options)
    results = dict(zip(tradeoffs, found, strict=True))
    timings["search_seconds"] = sum(result.seconds for result in results.values())
    frontier, target, cv = generalisation(config, embeddings, data, cost_data, points, options, plain, timings)
    default = None
    if points:
        default = config.default_operating_point or (target or {}).get("chosen") or next(iter(points))
    run = RunFigures(data, test, how, embeddings, cost_data, points, results, default, timings)
    report = run_report(config, run, embedded.truncation_length, cv, frontier, target, trained_guard)
    manifest = make_manifest(
        agent_order=data.agents,
        embedding_dim=int(embeddings.shape[1]),
        head_hidden_dim=config.head_hidden_dim,
        **({"query_format": rules} if rules else {}),
        **report.to_dict(),
    )
    operating_heads = None if default is None else {name: result.theta for name, result in results.items()}
    write_run(config.output_dir, manifest, results[default].theta, operating_heads, trained_guard, frontier)
    if config.export is not None:
        export_router(
            config,
            Release(
                agents=data.agents,
                embedding_dim=int(embeddings.shape[1]),
                head_hidden_dim=config.head_hidden_dim,
                head=results[default].theta,
                report=report,
                point_heads={name: result.theta for name, result in results.items()} if points else {},
                guard=trained_guard.guard if trained_guard is not None else None,
                truncation_length=embedded.truncation_length,
                query_format=rules or None,
            ),
        )
    return TrainResult(report=report, manifest=manifest, head=results[default])


def export_router(config: TrainConfig, release: Release) -> None:
    """`train --export`: the trained head as a Hub router folder, on the run's backbone and card note."""
    write_release(
        release,
        config.export,
        backbone=config.backbone,
        backbone_revision=config.backbone_revision,
        backbone_id=config.backbone_id,
        card_note=config.card_note,
    )


def read_training_data(config: TrainConfig) -> tuple[Any, list[dict[str, Any]], Any, str, Any]:
    """(labelled data, task rows, held-out mask, how it was held out, per-call costs or None)."""
    from benchgen_router.data import held_out_mask, join_rewards, load_rows

    reward_rows = load_rows(config.rewards, "rewards")  # rewards first: their errors are reported first
    reward_rows = reward_column(reward_rows, config.reward_column)
    task_rows = load_rows(config.tasks, "tasks")
    data = join_rewards(reward_rows, task_rows)
    test, how = held_out_mask(data, config.test_split, config.seed)
    cost_data = None
    if config.calls is not None:
        from benchgen_router.costs import costs_for_labelled

        cost_data = costs_for_labelled(data, config.calls, config.pool)
    logger.info(
        "%d labelled rows, %d agents: %d train, %d held out (%s)",
        len(data),
        len(data.agents),
        int((~test).sum()),
        int(test.sum()),
        how,
    )
    return data, task_rows, test, how, cost_data


def reward_column(rows: list[dict[str, Any]], column: str) -> list[dict[str, Any]]:
    """The rows with `column` as the rewards trained on (read where mean_reward is); one line naming the
    first row without it."""
    if column == DEFAULT_REWARD_COLUMN:
        return rows
    selected = []
    for number, row in enumerate(rows, start=1):
        if column not in row:
            raise setting_error(
                f"rewards row {number} ({row.get('task_id')}) has no column {column!r}; pass a rewards file that has "
                "it (collect --from-journal writes feedback_reward), or another {reward_column}."
            )
        selected.append({**row, "mean_reward": row[column]})
    logger.info("training on the rewards column %s", column)
    return selected


def backbone_embedder(config: TrainConfig, agents: list[str]) -> Any:
    """embed_prompts with this run's backbone, batching and cache settings."""
    from functools import partial

    from benchgen_router.embeddings import default_cache_dir, embed_prompts

    return partial(
        embed_prompts,
        backbone=config.backbone,
        agents=agents,
        revision=config.backbone_revision,
        dtype=config.dtype,
        truncation_length=config.truncation_length,
        device=config.device,
        batch_size=config.batch_size,
        max_batch_tokens=config.max_batch_tokens,
        cache_dir=None if config.no_cache else (config.cache_dir or default_cache_dir()),
        progress=not config.no_progress,
        allow_emulated_bf16=config.allow_emulated_bf16,
        pooling=config.pooling,
    )


def generalisation(
    config: TrainConfig,
    embeddings: Any,
    data: Any,
    cost_data: Any,
    points: dict[str, Any],
    options: dict[str, Any],
    plain: Any,
    timings: dict[str, float],
) -> tuple[Any, dict[str, Any] | None, dict[str, Any] | None]:
    """(CV frontier, target-mode choice, plain CV): the repeated-CV frontier when per-call costs are
    given, else the reward-only cross-validation; nothing without --cv-folds."""
    if not config.cv_folds:
        return None, None, None
    started = time.perf_counter()
    if cost_data is not None:
        frontier, target = cross_validated_frontier(
            config, embeddings, cost_data, points, options, not config.no_progress, {"plain": plain}
        )
        timings["frontier_cv_seconds"] = time.perf_counter() - started
        return frontier, target, None
    from benchgen_router.training.search import cross_validate

    cv = cross_validate(
        embeddings,
        data.rewards,
        data.agents,
        config.cv_folds,
        config.seed,
        config.head_hidden_dim,
        lambda e, r: point_search(e, r, r, options),
        progress=not config.no_progress,
    )
    timings["cross_validation_seconds"] = time.perf_counter() - started
    return None, None, cv


@dataclass
class RunFigures:
    """What a run's report is computed from."""

    data: Any  # data.LabelledData
    test: Any  # held-out mask
    how: str
    embeddings: Any
    cost_data: Any
    points: dict[str, Any]  # name -> frontier.Tradeoff
    results: dict[Any, Any]  # point name (None for one head) -> training.SearchResult
    default: str | None
    timings: dict[str, float]


def run_report(
    config: TrainConfig,
    run: RunFigures,
    truncation_length: int,
    cv: dict[str, Any] | None,
    frontier: Any,
    target: dict[str, Any] | None,
    trained_guard: Any,
) -> TrainingReport:
    """The run's typed report: every reference figure, the evaluation, the search settings, the
    operating points, the frontier and the guard."""
    from benchgen_router.evaluation.metrics import evaluate_picks
    from benchgen_router.head import head_picks

    data, test, result = run.data, run.test, run.results[run.default]
    picks = head_picks(result.theta, run.embeddings[test], len(data.agents), config.head_hidden_dim)
    evaluation = evaluate_picks(picks, data.rewards[test], data.agents)
    if not evaluation["beats_best_fixed_agent"]:
        logger.warning(
            "warning: the head does not beat the best fixed agent (%s, %.4f) on the held-out rows; "
            "routing adds nothing over always calling it.",
            evaluation["best_fixed_agent_id"],
            evaluation["best_fixed_agent"],
        )
    return TrainingReport(
        model_id=config.model_id or model_id(config.backbone_id, data.agents, result.theta),
        backbone_model=config.backbone_id,
        backbone_revision=config.backbone_revision,
        rewards_dataset=rewards_source(config),
        n_head_params=int(result.theta.size),
        n_total=len(data),
        n_train=int((~test).sum()),
        n_test=int(test.sum()),
        held_out=run.how,
        train_reward=result.train_reward,
        test_reward=evaluation["router"],
        baselines={key: evaluation[key] for key in ("random_agent", "best_fixed_agent", "oracle")},
        beats_best_fixed_agent=evaluation["beats_best_fixed_agent"],
        cma_generations_run=result.generations_run,
        history=result.history,
        duration_seconds=round(sum(run.timings.values()), 3),
        truncation_length=truncation_length,
        evaluation=evaluation,
        cross_validation=CrossValidation.from_dict(cv, "cross-validation") if cv is not None else None,
        cma={
            "library": result.library,
            "sigma0": config.sigma0,
            "seed": config.seed,
            "popsize": result.popsize,
            "generations": config.generations,
            **{key: value for key, value in search_options(config).items() if key in ("ensemble_seeds", "shrink")},
        },
        timings={key: round(value, 3) for key, value in run.timings.items()},
        operating_points=point_reports(run, frontier, config.head_hidden_dim, trained_guard is not None),
        default_operating_point=run.default,
        frontier=frontier,
        target_mode=target,
        ood_guard=GuardReport.from_dict(trained_guard.record, "guard record") if trained_guard is not None else None,
    )


# Every file a run may write into --output-dir: one that this run does not write is removed, so an
# earlier run's guard, heads or plots are never exported with this run's head.
RUN_FILES = (
    "head_weights.npy",
    "manifest.json",
    ood_defaults.GUARD_FILE,
    OPERATING_HEADS_FILE,
    "frontier-cost.png",
    "frontier-latency.png",
)


# The cross-validated figures of an operating point that its record keeps (the frontier keeps the rest).
CV_POINT_KEYS = (
    "reward",
    "reward_std_repeats",
    "reward_std_folds",
    "delta_reward",
    "delta_se",
    "cost_per_1k",
    "cost_std_repeats",
    "latency_s",
    "latency_std_repeats",
    "share",
    "cost_frontier",
    "latency_frontier",
)


def model_id(backbone_id: str, agents: list[str], theta: Any) -> str:
    """head-<backbone name>-<10 hex of a hash of the head and pool>, the reference's naming."""
    digest = hashlib.sha256(theta.tobytes() + json.dumps([backbone_id, agents]).encode()).hexdigest()
    return f"head-{backbone_id.rstrip('/').split('/')[-1]}-{digest[:10]}"


def point_utility(rewards: Any, cost_data: Any, tradeoff: Any) -> Any:
    """The matrix a point's search maximises: the rewards themselves for the reward-only head."""
    if tradeoff is None or (not tradeoff.cost_weight and not tradeoff.latency_weight):
        return rewards
    return tradeoff.utility(cost_data)


def point_search(embeddings: Any, rewards: Any, utility: Any, options: dict[str, Any], progress: bool = False) -> Any:
    """The search of one head (frontier.run_search) as one SearchResult: the reference search's own
    result, bit for bit, when it is a single unregularised run on the rewards; otherwise the final
    (averaged) head with its training reward and the runs' total time."""
    return point_searches(embeddings, rewards, [utility], options, progress)[0]


def point_searches(
    embeddings: Any, rewards: Any, utilities: list[Any], options: dict[str, Any], progress: bool = False
) -> list[Any]:
    """point_search for several utility matrices of the same rows, searched in lockstep
    (frontier.run_searches): each result is point_search's for that matrix."""
    from dataclasses import replace

    from benchgen_router.frontier.grid import run_searches
    from benchgen_router.training.search import fitness

    results = []
    for utility, (theta, runs) in zip(utilities, run_searches(embeddings, utilities, options, progress), strict=True):
        if len(runs) == 1 and utility is rewards and not options.get("shrink"):
            results.append(runs[0])
            continue
        reward = float(fitness(theta[None], embeddings, rewards, options["hidden_dim"])[0])
        results.append(replace(runs[0], theta=theta, train_reward=reward, seconds=sum(run.seconds for run in runs)))
    return results


def cross_validated_frontier(
    config: TrainConfig,
    embeddings: Any,
    cost_data: Any,
    points: dict[str, Any],
    options: dict[str, Any],
    progress: bool,
    other_forms: dict[str, Any] | None = None,
) -> tuple[Any, dict[str, Any] | None]:
    """The repeated-CV frontier of this run's trade-offs, with each head also scored on the held-out
    rows in `other_forms` ({form: embeddings}), and with --target-eps the target-mode choice on it
    and that rule's nested-CV estimate."""
    from benchgen_router.frontier import (
        Tradeoff,
        cross_validate_frontier,
        nested_target_cv,
        select_tradeoff,
    )

    grid = list(points.values()) or [Tradeoff()]
    result = cross_validate_frontier(
        embeddings,
        cost_data,
        grid,
        folds=config.cv_folds,
        repeats=config.cv_repeats,
        seed=config.cv_seed,
        search_kwargs=options,
        knn_ks=(5,),
        progress=progress,
        other_forms=other_forms,
    )
    target = None
    if config.target_eps is not None:
        chosen = select_tradeoff(result, config.target_eps)
        nested = nested_target_cv(
            embeddings,
            cost_data,
            config.target_eps,
            grid,
            outer_folds=config.cv_folds,
            outer_repeats=2,
            inner_folds=config.cv_folds,
            inner_repeats=1,
            seed=config.cv_seed,
            search_kwargs=options,
            progress=progress,
        )
        target = {
            "eps": config.target_eps,
            "rule": "the cheapest operating point whose CV reward is within eps of the best fixed agent's "
            "(the highest-reward point if none is)",
            "chosen": next(name for name, tradeoff in points.items() if tradeoff == chosen),
            "nested_cv": {
                "outer": f"2x{config.cv_folds}-fold",
                "inner": f"1x{config.cv_folds}-fold",
                "point": nested.point.to_dict(),
                "reference": nested.reference.to_dict(),
            },
        }
    return result, target


def point_reports(run: RunFigures, frontier: Any, hidden_dim: int, guarded: bool) -> dict[str, PointReport]:
    """Each operating point's weights, training reward, held-out figures, cross-validated figures
    (as formatted and as plain questions) and, with a guard, its fallback agent."""
    from benchgen_router import ood
    from benchgen_router.head import head_picks

    by_name = {point.name: point.to_dict() for point in frontier.points} if frontier is not None else {}
    rows = np.flatnonzero(run.test)
    reports = {}
    for name, tradeoff in run.points.items():
        picks = head_picks(run.results[name].theta, run.embeddings[rows], len(run.data.agents), hidden_dim)
        cost = run.cost_data
        figures = {}
        for key, policy in (("cv", f"router {tradeoff.name}"), ("cv_plain", f"router {tradeoff.name} [plain]")):
            if policy in by_name:
                kept = {field: by_name[policy][field] for field in CV_POINT_KEYS if field in by_name[policy]}
                figures[key] = PointFigures.from_dict(kept, policy)
        fallback = None
        if guarded:
            utility = point_utility(run.data.rewards, cost, tradeoff)[~run.test]
            fallback = run.data.agents[ood.utility_fallback(utility, cost.cost_per_1k[~run.test])]
        reports[name] = PointReport(
            cost_weight=tradeoff.cost_weight,
            latency_weight=tradeoff.latency_weight,
            train_reward=run.results[name].train_reward,
            held_out={
                "rows": len(rows),
                "reward": float(cost.rewards[rows, picks].mean()),
                "cost_per_1k": float(cost.cost_per_1k[rows, picks].mean()),
                "latency_s": float(cost.latency_s[rows, picks].mean()),
            },
            ood_fallback_agent=fallback,
            **figures,
        )
    return reports


def write_run(
    folder: str | Path,
    manifest: dict[str, Any],
    theta: Any,
    operating_heads: dict[str, Any] | None = None,
    guard: Any = None,
    frontier: Any = None,
) -> None:
    """The run folder, for every head kind: the release (head_weights.npy, manifest.json, the operating
    points' heads, the guard's statistics) and the frontier's plots, replacing an earlier run's files."""
    from benchgen_router.files import staging_dir, to_json
    from benchgen_router.head import save_operating_heads
    from benchgen_router.ood import GUARD_FILE, save_guard

    with staging_dir(folder, owned=RUN_FILES) as staging:
        np.save(staging / "head_weights.npy", np.asarray(theta, dtype=np.float64), allow_pickle=False)
        if operating_heads:
            save_operating_heads(staging / OPERATING_HEADS_FILE, operating_heads)
        if guard is not None:
            save_guard(staging / GUARD_FILE, guard.guard)
        if frontier is not None:
            plot_training_frontier(frontier, staging)
        (staging / "manifest.json").write_text(to_json(manifest, indent=2) + "\n", encoding="utf-8")
    logger.info("wrote %s (head_weights.npy, manifest.json)", folder)


def plot_training_frontier(frontier: Any, folder: Path) -> None:
    from benchgen_router.frontier import plot_frontier

    title = f"{frontier.repeats}x{frontier.folds}-fold CV over {frontier.rows} labelled rows"
    plot_frontier(frontier, folder / "frontier-cost.png", folder / "frontier-latency.png", knn_k=5, title=title)
