"""The trainer's guard: fitted on the task pool's prompts, with its fallback agent and the record
the manifest keeps (`ood_guard`).

Every prompt of the pool counts, labelled or not, since the guard needs many more rows than the
head has rewards. The splits are seeded, so a retrained router gets the same guard.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from benchgen_router.ood.fallback import fallback_agent, fallback_rule
from benchgen_router.ood.fitting import (
    CALIBRATION_RULE,
    DEFAULT_KEEP_SHARE,
    DEFAULT_L2,
    fit_discriminative_guard,
    fit_guard,
    split_indices,
)
from benchgen_router.ood.guard import OODGuard, _as_matrix
from benchgen_router.ood.storage import GUARD_FILE

DEFAULT_PLAIN_KEEP_SHARE = 0.9
DEFAULT_CALIBRATION_SHARE = 0.3
DEFAULT_SPLIT_SEED = 0


def min_prompts_to_calibrate(keep_share: float, calibration_share: float = DEFAULT_CALIBRATION_SHARE) -> int:
    """The fewest in-distribution prompts whose calibration part can calibrate keep_share (with fewer
    the trainer fits no guard)."""
    needed = math.ceil(keep_share / (1.0 - keep_share))
    return math.ceil(needed / calibration_share) + 1


@dataclass
class TrainedGuard:
    """What the trainer fits: the guard, the agent that answers flagged queries, and the record the
    manifest keeps (`ood_guard`)."""

    guard: OODGuard
    fallback_agent: str
    record: dict[str, object]


def train_guard(
    embeddings: np.ndarray,
    train_rewards: np.ndarray,
    agents: Sequence[str],
    keep_share: float = DEFAULT_KEEP_SHARE,
    seed: int = DEFAULT_SPLIT_SEED,
    calibration_share: float = DEFAULT_CALIBRATION_SHARE,
    costs: np.ndarray | None = None,
    tolerance: float = 0.0,
    metadata: Mapping[str, str] | None = None,
    fallback: int | None = None,
) -> TrainedGuard:
    """The distance-only guard: fitted on a seeded split of the prompt embeddings, calibrated on the
    held-out part to keep `keep_share`. The fallback is `fallback` (an index into `agents`) when
    given, else fallback_agent() of the training rows' rewards (`costs` in `agents` order)."""
    rows = _as_matrix(embeddings, "embeddings")
    fit_rows, calibration_rows = split_indices(len(rows), (1.0 - calibration_share, calibration_share), seed)
    rule = fallback_rule(costs, tolerance, fallback)
    fallback = agents[fallback_agent(train_rewards, costs, tolerance) if fallback is None else fallback]
    info = {
        "split_seed": str(seed),
        "calibration_share": f"{calibration_share}",
        "fallback_agent": fallback,
        **(metadata or {}),
    }
    guard = fit_guard(rows[fit_rows], rows[calibration_rows], keep_share, metadata=info)
    record = guard_record(guard, fallback, rule, seed, keep_share=keep_share, n_prompts=len(rows))
    record.update(
        n_fit=len(fit_rows),
        n_calibration=len(calibration_rows),
        calibration_kept_share=float((~guard.flags(rows[calibration_rows])).mean()),
    )
    return TrainedGuard(guard, fallback, record)


def guard_record(guard: OODGuard, fallback: str, rule: str, seed: int, **figures: object) -> dict[str, object]:
    """What the manifest keeps of a trained guard (`ood_guard`): its score, threshold, fallback and
    calibration, and the trainer's `figures`."""
    return {
        "file": GUARD_FILE,
        "score": guard.metadata["score"],
        "threshold": guard.threshold,
        "fallback_agent": fallback,
        "fallback_rule": rule,
        "calibration_rule": guard.metadata.get("calibration_rule", CALIBRATION_RULE),
        "split_seed": seed,
        "shrinkage": guard.metadata["shrinkage"],
        "shrinkage_weight": float(guard.metadata["shrinkage_weight"]),
        **figures,
    }


def train_discriminative_guard(
    prompts: np.ndarray,
    views: np.ndarray,
    owners: np.ndarray,
    inside: np.ndarray,
    outside: np.ndarray,
    train_rewards: np.ndarray,
    agents: Sequence[str],
    keep_share: float = DEFAULT_KEEP_SHARE,
    plain_keep_share: float = DEFAULT_PLAIN_KEEP_SHARE,
    seed: int = DEFAULT_SPLIT_SEED,
    calibration_share: float = DEFAULT_CALIBRATION_SHARE,
    l2: float = DEFAULT_L2,
    fallback: int | None = None,
    metadata: Mapping[str, str] | None = None,
) -> TrainedGuard:
    """The discriminative guard (fit_discriminative_guard). `prompts`: the pool's canonical prompts;
    `views`: their guard views (forms.guard_views), `owners[i]` the prompt of view i; `inside`:
    in-domain questions as users type them; `outside`: queries to flag. A seeded `calibration_share`
    of the prompts, with all their views, and half of the `inside` questions are held out to
    calibrate (keep_share and plain_keep_share), so no calibration prompt is fitted in any form; the
    rest, and every outside query, are fitted. The fallback is as in train_guard."""
    prompts, views = _as_matrix(prompts, "prompt embeddings"), _as_matrix(views, "view embeddings")
    inside, outside = _as_matrix(inside, "in-domain embeddings"), _as_matrix(outside, "outside embeddings")
    fit_rows, calibration_rows = split_indices(len(prompts), (1.0 - calibration_share, calibration_share), seed)
    fit_questions, calibration_questions = split_indices(len(inside), (0.5, 0.5), seed)
    fitted = np.vstack([views[np.isin(owners, fit_rows)], inside[fit_questions]])
    rule = fallback_rule(None, 0.0, fallback)
    fallback = agents[fallback_agent(train_rewards) if fallback is None else fallback]
    info = {"split_seed": str(seed), "calibration_share": f"{calibration_share}", "fallback_agent": fallback}
    guard = fit_discriminative_guard(
        fitted,
        outside,
        {
            "task_prompts": (prompts[calibration_rows], keep_share),
            "questions": (inside[calibration_questions], plain_keep_share),
        },
        l2,
        metadata={**info, **(metadata or {})},
    )
    record = guard_record(
        guard,
        fallback,
        rule,
        seed,
        keep_share=keep_share,
        plain_keep_share=plain_keep_share,
        n_prompts=len(prompts),
        n_fit=len(fitted),
        n_calibration=len(calibration_rows),
        n_plain_calibration=len(calibration_questions),
        n_outside=len(outside),
        calibration_kept_share=float((~guard.flags(prompts[calibration_rows])).mean()),
        plain_calibration_kept_share=float((~guard.flags(inside[calibration_questions])).mean()),
        l2=l2,
    )
    return TrainedGuard(guard, fallback, record)
