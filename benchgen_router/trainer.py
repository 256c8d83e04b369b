"""Training a router: the library behind `benchgen-router train`.

    from benchgen_router.trainer import TrainConfig, train
    result = train(TrainConfig(rewards="rewards.jsonl", tasks="tasks.v1.jsonl", output_dir=Path("run")))
    result.manifest["test_reward"]

train() embeds the labelled prompts with the backbone, searches one head per operating point
(separable CMA-ES), fits the out-of-distribution guard, cross-validates (the cost frontier when
per-call costs are given), writes the run folder (head_weights.npy, manifest.json and the files
that go with them) and, with `export`, the Hub folder. Bad input raises InputError with one line.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from benchgen_router import ood as ood_defaults
from benchgen_router.data import DEFAULT_TEST_SPLIT
from benchgen_router.head import OPERATING_HEADS_FILE
from benchgen_router.manifest import DEFAULT_TRUNCATION_LENGTH
from benchgen_router.training import DEFAULT_CMA_LIBRARY

logger = logging.getLogger("benchgen_router")

DEFAULT_BACKBONE = "Qwen/Qwen3-1.7B"


@dataclass
class TrainConfig:
    """Everything a run reads; `benchgen-router train --help` describes each (the flag of a field is
    its name with dashes)."""

    # data
    rewards: str
    tasks: str
    output_dir: Path
    rewards_id: str | None = None
    test_split: str = DEFAULT_TEST_SPLIT
    cv_folds: int = 5
    # backbone and head
    backbone: str = DEFAULT_BACKBONE
    backbone_id: str | None = None  # what the manifest records (default: backbone)
    backbone_revision: str | None = None
    head_hidden_dim: int = 0
    truncation_length: int = DEFAULT_TRUNCATION_LENGTH
    device: str = "cpu"
    dtype: str = "float32"
    batch_size: int | None = None
    max_batch_tokens: int | None = None
    allow_emulated_bf16: bool = False
    cache_dir: Path | None = None
    no_cache: bool = False
    # search
    sigma0: float = 0.5
    generations: int = 60
    seed: int = 42
    popsize: int | None = None
    cma_library: str = DEFAULT_CMA_LIBRARY
    ensemble_seeds: list[int] | None = None
    shrink: float = 0.0
    # cost and latency
    calls: Path | None = None
    pool: Path | None = None
    operating_points: Sequence[tuple[str, Any]] | None = None  # (name, frontier.Tradeoff)
    default_operating_point: str | None = None
    target_eps: float | None = None
    cv_repeats: int = 10
    cv_seed: int = 0
    # query forms
    query_format: str = "pilot"
    # out-of-distribution guard
    no_ood_guard: bool = False
    ood_method: str = "discriminative"
    ood_keep_share: float = 0.95
    ood_plain_keep_share: float = ood_defaults.DEFAULT_PLAIN_KEEP_SHARE
    ood_inside: Path | None = None
    ood_outside: Path | None = None
    ood_queries: Path | None = None
    # output
    model_id: str | None = None
    export: Path | None = None
    card_note: str | None = None  # markdown appended to the exported card
    no_progress: bool = False

    def __post_init__(self) -> None:
        self.output_dir = Path(self.output_dir)
        self.backbone_id = self.backbone_id or self.backbone


def train_defaults() -> dict[str, Any]:
    """Each optional field's default, for the command line's flags."""
    return {item.name: item.default for item in fields(TrainConfig) if item.default is not MISSING}


@dataclass
class TrainResult:
    """What a run produced: the manifest it wrote, the default head's search result and held-out
    evaluation, and the cross-validation, frontier, target-mode choice and guard record when run."""

    manifest: dict[str, Any]
    head: Any  # training.SearchResult of the default head
    evaluation: dict[str, Any]
    cross_validation: dict[str, Any] | None
    default_operating_point: str | None
    frontier: dict[str, Any] | None
    target: dict[str, Any] | None
    guard: dict[str, Any] | None


def train(config: TrainConfig) -> TrainResult:
    """Train the head (one per operating point), its guard and its CV figures; write the run folder
    (and with `export`, the Hub folder). What the command prints comes from the result."""
    from functools import partial

    from benchgen_router.data import held_out_mask, join_rewards, load_rows
    from benchgen_router.folder import check_output_folder
    from benchgen_router.frontier import check_search_options

    check_search_options(search_options(config))  # before any work
    progress = not config.no_progress
    if config.export is not None:
        check_output_folder(config.export, overwrite=False)  # before the work, so a bad folder costs nothing
    reward_rows = load_rows(config.rewards, "rewards")  # rewards first: their errors are reported first
    task_rows = load_rows(config.tasks, "tasks")
    data = join_rewards(reward_rows, task_rows)
    test, how = held_out_mask(data, config.test_split, config.seed)
    cost_data = None
    if config.calls is not None:
        from benchgen_router.costs import costs_for_labelled

        cost_data = costs_for_labelled(data, config.calls, config.pool)

    # The data are good: now the heavy imports (torch, transformers).
    from benchgen_router import ood
    from benchgen_router.convert import convert_release
    from benchgen_router.embeddings import default_cache_dir, embed_prompts
    from benchgen_router.evaluation import evaluate_picks
    from benchgen_router.files import staging_dir, to_json
    from benchgen_router.forms import QUERY_FORMATS, in_form
    from benchgen_router.head import head_picks, save_operating_heads
    from benchgen_router.model_code import canonical_query
    from benchgen_router.ood import GUARD_FILE, save_guard
    from benchgen_router.training import cross_validate

    logger.info(
        "%d labelled rows, %d agents: %d train, %d held out (%s)",
        len(data),
        len(data.agents),
        int((~test).sum()),
        int(test.sum()),
        how,
    )

    timings: dict[str, float] = {}
    started = time.perf_counter()
    embed = partial(
        embed_prompts,
        backbone=config.backbone,
        agents=data.agents,
        revision=config.backbone_revision,
        dtype=config.dtype,
        truncation_length=config.truncation_length,
        device=config.device,
        batch_size=config.batch_size,
        max_batch_tokens=config.max_batch_tokens,
        cache_dir=None if config.no_cache else (config.cache_dir or default_cache_dir()),
        progress=progress,
        allow_emulated_bf16=config.allow_emulated_bf16,
    )
    rules = QUERY_FORMATS[config.query_format]
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
    embeddings, rewards = embedded.vectors.astype(np.float64), data.rewards
    plain = plain.astype(np.float64)
    options = search_options(config)
    points = dict(config.operating_points or [])

    # One head per operating point (or the one head), each searched on the training rows.
    results = {
        name: point_search(embeddings[~test], rewards[~test], point_utility(rewards, cost_data, t)[~test], options)
        for name, t in (points or {None: None}).items()
    }
    timings["search_seconds"] = sum(result.seconds for result in results.values())

    frontier, target, cv = None, None, None
    if cost_data is not None and config.cv_folds:
        frontier, target = cross_validated_frontier(
            config, embeddings, cost_data, points, options, progress, {"plain": plain}
        )
        timings["frontier_cv_seconds"] = frontier.pop("seconds")
    elif config.cv_folds:
        started = time.perf_counter()
        search = partial(point_search, options=options)
        cv = cross_validate(
            embeddings,
            rewards,
            data.agents,
            config.cv_folds,
            config.seed,
            config.head_hidden_dim,
            lambda e, r: search(e, r, r),
            progress=progress,
        )
        timings["cross_validation_seconds"] = time.perf_counter() - started
    default = None
    if points:
        default = config.default_operating_point or (target or {}).get("chosen") or next(iter(points))
    result = results[default]
    picks = head_picks(result.theta, embeddings[test], len(data.agents), config.head_hidden_dim)
    evaluation = evaluate_picks(picks, rewards[test], data.agents)

    manifest = build_manifest(config, data, test, how, result, evaluation, cv, embedded, timings)
    if rules:
        manifest["query_format"] = rules
    if points:
        manifest["operating_points"] = operating_point_records(
            points, results, frontier, cost_data, embeddings, test, config.head_hidden_dim
        )
        if trained_guard is not None:
            for name, tradeoff in points.items():
                utility = point_utility(rewards, cost_data, tradeoff)[~test]
                fallback = ood.utility_fallback(utility, cost_data.cost_per_1k[~test])
                manifest["operating_points"][name]["ood_fallback_agent"] = data.agents[fallback]
        manifest["default_operating_point"] = default
    if frontier is not None:
        manifest["frontier"] = frontier
    if target is not None:
        manifest["target_mode"] = target
    if trained_guard is not None:
        manifest["ood_guard"] = trained_guard.record
    with staging_dir(config.output_dir, owned=RUN_FILES) as staging:
        np.save(staging / "head_weights.npy", result.theta.astype(np.float64), allow_pickle=False)
        if points:
            save_operating_heads(staging / OPERATING_HEADS_FILE, {name: r.theta for name, r in results.items()})
        if trained_guard is not None:
            save_guard(staging / GUARD_FILE, trained_guard.guard)
        if frontier is not None:
            plot_training_frontier(frontier, staging)
        (staging / "manifest.json").write_text(to_json(manifest, indent=2) + "\n", encoding="utf-8")
    logger.info("wrote %s (head_weights.npy, manifest.json)", config.output_dir)
    if config.export is not None:
        convert_release(
            config.output_dir / "manifest.json",
            config.output_dir / "head_weights.npy",
            config.export,
            backbone=config.backbone,
            backbone_revision=config.backbone_revision,
            backbone_id=config.backbone_id,
            card_note=config.card_note,
        )

    return TrainResult(
        manifest=manifest,
        head=result,
        evaluation=evaluation,
        cross_validation=cv,
        default_operating_point=default,
        frontier=frontier,
        target=target,
        guard=trained_guard.record if trained_guard is not None else None,
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


def search_options(config: TrainConfig) -> dict[str, Any]:
    """The search settings of this run, in frontier.run_search's terms."""
    options: dict[str, Any] = {
        "hidden_dim": config.head_hidden_dim,
        "sigma0": config.sigma0,
        "generations": config.generations,
        "seed": config.seed,
        "popsize": config.popsize,
        "library": config.cma_library,
    }
    if config.ensemble_seeds:
        options["ensemble_seeds"] = config.ensemble_seeds
    if config.shrink:
        options["shrink"] = config.shrink
    return options


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
    from dataclasses import replace

    from benchgen_router.frontier import run_search
    from benchgen_router.training import fitness

    theta, runs = run_search(embeddings, utility, options, progress)
    if len(runs) == 1 and utility is rewards and not options.get("shrink"):
        return runs[0]
    reward = float(fitness(theta[None], embeddings, rewards, options["hidden_dim"])[0])
    return replace(runs[0], theta=theta, train_reward=reward, seconds=sum(run.seconds for run in runs))


def cross_validated_frontier(
    config: TrainConfig,
    embeddings: Any,
    cost_data: Any,
    points: dict[str, Any],
    options: dict[str, Any],
    progress: bool,
    other_forms: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The repeated-CV frontier of this run's trade-offs (frontier_to_dict, plus "seconds"), with each
    head also scored on the held-out rows in `other_forms` ({form: embeddings}), and with --target-eps
    the target-mode choice on it and that rule's nested-CV estimate."""
    from benchgen_router.frontier import (
        Tradeoff,
        cross_validate_frontier,
        frontier_to_dict,
        nested_target_cv,
        select_tradeoff,
    )

    started = time.perf_counter()
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
    stored = frontier_to_dict(result)
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
    stored["seconds"] = time.perf_counter() - started
    return stored, target


def operating_point_records(
    points: dict[str, Any],
    results: dict[str, Any],
    frontier: dict[str, Any] | None,
    cost_data: Any,
    embeddings: Any,
    test: Any,
    hidden_dim: int,
) -> dict[str, dict[str, Any]]:
    """What the manifest (and the router's config and card) record of each operating point: its
    weights, training reward, held-out figures and cross-validated point."""
    import numpy as np

    from benchgen_router.head import head_picks

    by_name = {point["name"]: point for point in (frontier or {}).get("points", [])}
    records = {}
    for name, tradeoff in points.items():
        picks = head_picks(results[name].theta, embeddings[test], len(cost_data.agents), hidden_dim)
        rows = np.flatnonzero(test)
        record: dict[str, Any] = {
            "cost_weight": tradeoff.cost_weight,
            "latency_weight": tradeoff.latency_weight,
            "train_reward": results[name].train_reward,
            "held_out": {
                "rows": len(rows),
                "reward": float(cost_data.rewards[rows, picks].mean()),
                "cost_per_1k": float(cost_data.cost_per_1k[rows, picks].mean()),
                "latency_s": float(cost_data.latency_s[rows, picks].mean()),
            },
        }
        for key, policy in (("cv", f"router {tradeoff.name}"), ("cv_plain", f"router {tradeoff.name} [plain]")):
            if policy in by_name:
                record[key] = {field: by_name[policy][field] for field in CV_POINT_KEYS if field in by_name[policy]}
        records[name] = record
    return records


def plot_training_frontier(frontier: dict[str, Any], folder: Path) -> None:
    from benchgen_router.frontier import frontier_from_dict, plot_frontier

    result = frontier_from_dict(frontier)
    title = f"{result.repeats}x{result.folds}-fold CV over {result.rows} labelled rows"
    plot_frontier(result, folder / "frontier-cost.png", folder / "frontier-latency.png", knn_k=5, title=title)


def fit_task_guard(
    config: TrainConfig,
    task_rows: list[dict[str, Any]],
    data: Any,
    test: Any,
    embed: Any,
    rules: dict[str, list[str]] | None,
    labelled: dict[str, Any],
    cost_data: Any = None,
) -> Any:
    """The out-of-distribution guard of this run (ood.train_guard) on every prompt of the task pool,
    canonicalised as the router will see them, measured on the OOD and plain query sets and on the
    labelled tasks' embeddings in each form (`labelled`); None (with a warning) when the pool has too
    few prompts to calibrate the keep share."""
    from benchgen_router import ood
    from benchgen_router.model_code import canonical_query

    prompts = list(dict.fromkeys(row["prompt"] for row in task_rows if isinstance(row.get("prompt"), str)))
    prompts = [prompt for prompt in prompts if prompt.strip()]
    needed = ood.min_prompts_to_calibrate(config.ood_keep_share)
    if len(prompts) < needed:
        logger.warning(
            "warning: no out-of-distribution guard: %d task prompts cannot calibrate a %.0f%% keep share "
            "(need at least %d); pass a larger --tasks pool or --no-ood-guard.",
            len(prompts),
            100 * config.ood_keep_share,
            needed,
        )
        return None
    fallback = None
    if cost_data is not None:  # the reward-only point's fallback; operating points get their own
        fallback = ood.utility_fallback(data.rewards[~test], cost_data.cost_per_1k[~test])
    vectors = embed([canonical_query(prompt, rules) for prompt in prompts]).vectors
    metadata = {"backbone": config.backbone_id}
    if config.ood_method == "mahalanobis":
        trained = ood.train_guard(
            vectors, data.rewards[~test], data.agents, config.ood_keep_share, fallback=fallback, metadata=metadata
        )
    else:
        from benchgen_router.forms import guard_views

        views = [guard_views(prompt, rules) for prompt in prompts]
        flat = embed([view for prompt_views in views for view in prompt_views]).vectors
        owners = np.repeat(np.arange(len(prompts)), [len(prompt_views) for prompt_views in views])
        inside, _ = ood.read_ood_queries(config.ood_inside or ood.PACKAGED_GUARD_INSIDE, "in-domain query set")
        outside, _ = ood.read_ood_queries(config.ood_outside or ood.PACKAGED_GUARD_OUTSIDE, "outside query set")
        trained = ood.train_discriminative_guard(
            vectors,
            flat,
            owners,
            embed([canonical_query(query, rules) for query in inside]).vectors,
            embed([canonical_query(query, rules) for query in outside]).vectors,
            data.rewards[~test],
            data.agents,
            keep_share=config.ood_keep_share,
            plain_keep_share=config.ood_plain_keep_share,
            fallback=fallback,
            metadata=metadata,
        )
    _, calibration_rows = ood.split_indices(
        len(vectors), (1.0 - ood.DEFAULT_CALIBRATION_SHARE, ood.DEFAULT_CALIBRATION_SHARE), ood.DEFAULT_SPLIT_SEED
    )
    calibration = vectors[np.asarray(calibration_rows)]
    queries_file = config.ood_queries or ood.PACKAGED_OOD_QUERIES
    if queries_file.is_file():
        queries, groups = ood.read_ood_queries(queries_file)
        trained.record["evaluation"] = ood.evaluate_guard(
            trained.guard.threshold,
            trained.guard.scores(calibration),
            trained.guard.scores(embed([canonical_query(query, rules) for query in queries]).vectors),
            groups,
            f"the {len(calibration_rows)} task prompts of the calibration split, not used to fit the statistics",
        )
        trained.record["evaluation"]["ood_queries_file"] = queries_file.name
    if ood.PACKAGED_PLAIN_QUERIES.is_file():
        questions, _ = ood.read_ood_queries(ood.PACKAGED_PLAIN_QUERIES, "plain query set")
        kept = ~trained.guard.flags(embed([canonical_query(q, rules) for q in questions]).vectors)
        trained.record["plain_questions_kept_share"] = float(kept.mean())
    for form, vectors in labelled.items():  # the labelled tasks, as the data gives them and as users type them
        trained.record[f"labelled_{form}_flagged_share"] = float(trained.guard.flags(vectors).mean())
    return trained


def build_manifest(
    config: TrainConfig,
    data: Any,
    test: Any,
    how: str,
    result: Any,
    evaluation: dict[str, Any],
    cv: dict[str, Any] | None,
    embedded: Any,
    timings: dict[str, float],
) -> dict[str, Any]:
    """The run's manifest: every reference key, plus the evaluation, cross-validation and search settings."""
    from benchgen_router.manifest import make_manifest

    return make_manifest(
        model_id=config.model_id or model_id(config.backbone_id, data.agents, result.theta),
        backbone_model=config.backbone_id,
        backbone_revision=config.backbone_revision,
        rewards_dataset=config.rewards_id or config.rewards,
        agent_order=data.agents,
        embedding_dim=int(embedded.vectors.shape[1]),
        head_hidden_dim=config.head_hidden_dim,
        n_head_params=int(result.theta.size),
        n_total=len(data),
        n_train=int((~test).sum()),
        n_test=int(test.sum()),
        held_out=how,
        train_reward=result.train_reward,
        test_reward=evaluation["router"],
        baselines={key: evaluation[key] for key in ("random_agent", "best_fixed_agent", "oracle")},
        beats_best_fixed_agent=evaluation["beats_best_fixed_agent"],
        cma_generations_run=result.generations_run,
        history=result.history,
        duration_seconds=round(sum(timings.values()), 3),
        truncation_length=embedded.truncation_length,
        evaluation=evaluation,
        cross_validation=cv,
        cma={
            "library": result.library,
            "sigma0": config.sigma0,
            "seed": config.seed,
            "popsize": result.popsize,
            "generations": config.generations,
            **{key: value for key, value in search_options(config).items() if key in ("ensemble_seeds", "shrink")},
        },
        timings={key: round(value, 3) for key, value in timings.items()},
    )
