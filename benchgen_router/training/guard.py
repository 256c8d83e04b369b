"""The out-of-distribution guard a run fits on its task pool, and what it measures of it."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from benchgen_router.training.config import TrainConfig

logger = logging.getLogger("benchgen_router")


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
