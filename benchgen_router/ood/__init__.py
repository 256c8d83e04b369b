"""Out-of-distribution guard: is a query's embedding like those the head was built for?

Outside its training distribution (another language, another domain) the head's argmax is close to
arbitrary, so a query the guard flags goes to a fallback agent instead. Rooms, one concern each:
`guard` (statistics and score), `fitting` (fitting and the conformal threshold), `evaluation`
(AUROC per group), `storage` (the statistics file), `query_sets` (the packaged query sets),
`fallback` (which agent answers flagged queries) and `training` (the trainer's guard). All numpy;
docs/ood-guard.md gives the method, the choice and the measurements. Every public name is
re-exported here, so `from benchgen_router import ood; ood.fit_guard(...)` is the way to use it.
"""

from benchgen_router.ood.evaluation import auroc, evaluate_guard, group_lines
from benchgen_router.ood.fallback import check_fallback_agent, fallback_agent, fallback_rule, utility_fallback
from benchgen_router.ood.fitting import (
    CALIBRATION_RULE,
    DEFAULT_KEEP_SHARE,
    DEFAULT_L2,
    DISCRIMINATIVE_SCORE,
    conformal_threshold,
    fit_discriminative_guard,
    fit_guard,
    logistic_regression,
    split_indices,
    stored_threshold,
)
from benchgen_router.ood.guard import (
    BIAS_KEY,
    DISCRIMINATIVE_KEYS,
    DISTANCE_WEIGHT_KEY,
    GUARD_FORMAT,
    GUARD_KEYS,
    MEAN_KEY,
    PRECISION_KEY,
    SHRINKAGE_METHODS,
    THRESHOLD_KEY,
    UNIT_NORM_FLOOR,
    WEIGHT_KEY,
    OODGuard,
    mahalanobis_scores,
    precision_from_covariance,
    shrunk_covariance,
    unit_rows,
)
from benchgen_router.ood.query_sets import (
    BENCHMARK_STYLE_OOD_GROUPS,
    PACKAGED_GUARD_INSIDE,
    PACKAGED_GUARD_OUTSIDE,
    PACKAGED_OOD_QUERIES,
    PACKAGED_PLAIN_QUERIES,
    PLAIN_OOD_GROUPS,
    read_ood_queries,
)
from benchgen_router.ood.storage import (
    GUARD_FILE,
    SYMMETRY_TOLERANCE,
    guard_from_tensors,
    guard_statistics_file,
    load_guard,
    save_guard,
)
from benchgen_router.ood.training import (
    DEFAULT_CALIBRATION_SHARE,
    DEFAULT_PLAIN_KEEP_SHARE,
    DEFAULT_SPLIT_SEED,
    TrainedGuard,
    guard_record,
    min_prompts_to_calibrate,
    train_discriminative_guard,
    train_guard,
)

__all__ = [
    "BENCHMARK_STYLE_OOD_GROUPS",
    "BIAS_KEY",
    "CALIBRATION_RULE",
    "DEFAULT_CALIBRATION_SHARE",
    "DEFAULT_KEEP_SHARE",
    "DEFAULT_L2",
    "DEFAULT_PLAIN_KEEP_SHARE",
    "DEFAULT_SPLIT_SEED",
    "DISCRIMINATIVE_KEYS",
    "DISCRIMINATIVE_SCORE",
    "DISTANCE_WEIGHT_KEY",
    "GUARD_FILE",
    "GUARD_FORMAT",
    "GUARD_KEYS",
    "MEAN_KEY",
    "PACKAGED_GUARD_INSIDE",
    "PACKAGED_GUARD_OUTSIDE",
    "PACKAGED_OOD_QUERIES",
    "PACKAGED_PLAIN_QUERIES",
    "PLAIN_OOD_GROUPS",
    "PRECISION_KEY",
    "SHRINKAGE_METHODS",
    "SYMMETRY_TOLERANCE",
    "THRESHOLD_KEY",
    "UNIT_NORM_FLOOR",
    "WEIGHT_KEY",
    "OODGuard",
    "TrainedGuard",
    "auroc",
    "check_fallback_agent",
    "conformal_threshold",
    "evaluate_guard",
    "fallback_agent",
    "fallback_rule",
    "fit_discriminative_guard",
    "fit_guard",
    "group_lines",
    "guard_from_tensors",
    "guard_record",
    "guard_statistics_file",
    "load_guard",
    "logistic_regression",
    "mahalanobis_scores",
    "min_prompts_to_calibrate",
    "precision_from_covariance",
    "read_ood_queries",
    "save_guard",
    "shrunk_covariance",
    "split_indices",
    "stored_threshold",
    "train_discriminative_guard",
    "train_guard",
    "unit_rows",
    "utility_fallback",
]
