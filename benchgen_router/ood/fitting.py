"""Fitting the guard's statistics and calibrating its threshold.

The threshold is conformal, set on held-out in-distribution scores, so that the share of
in-distribution queries kept is a stated guarantee rather than a property of one data set.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from benchgen_router.errors import InputError
from benchgen_router.ood.guard import (
    GUARD_FORMAT,
    OODGuard,
    mahalanobis_scores,
    precision_from_covariance,
    shrunk_covariance,
    unit_rows,
)

DISCRIMINATIVE_SCORE = (
    "logistic score w.u + a*d + b of the unit-length embedding u and its squared Mahalanobis distance d to the "
    "in-distribution mean, fitted on in-distribution against outside queries"
)
DEFAULT_KEEP_SHARE = 0.95
DEFAULT_L2 = 0.1  # the logistic regression's penalty (docs/ood-guard.md: the comparison)
CALIBRATION_RULE = "conformal: ceil((n+1)*keep_share)-th smallest of n held-out in-distribution scores"


def conformal_threshold(scores: np.ndarray, keep_share: float = DEFAULT_KEEP_SHARE) -> float:
    """The ceil((n + 1) q)-th smallest of n held-out in-distribution scores, q the keep share.

    Split conformal: a fresh in-distribution query exchangeable with those n is then kept (score <=
    threshold) with probability at least q, and at most q + 1/(n + 1) when scores have no ties.
    Fewer than q / (1 - q) scores cannot reach that rank, so they are refused."""
    values = np.sort(np.asarray(scores, dtype=np.float64).ravel())
    if not 0.0 < keep_share < 1.0:
        raise InputError(f"keep share must lie strictly between 0 and 1; got {keep_share}.")
    if not np.isfinite(values).all():
        raise InputError("calibration scores must be finite; recompute the held-out embeddings.")
    rank = math.ceil((len(values) + 1) * keep_share)
    if rank > len(values):
        needed = math.ceil(keep_share / (1.0 - keep_share))
        raise InputError(
            f"{len(values)} held-out scores cannot calibrate a {keep_share:.0%} keep share; give at least {needed}."
        )
    return float(values[rank - 1])


def split_indices(count: int, shares: tuple[float, ...], seed: int) -> list[np.ndarray]:
    """A seeded random partition of range(count) into parts of the given shares (the last part takes
    the rest), each part sorted so that its rows keep their input order."""
    order = np.random.default_rng(seed).permutation(count)
    bounds = np.round(np.cumsum(shares[:-1]) * count).astype(int)
    return [np.sort(part) for part in np.split(order, bounds)]


def fit_guard(
    fit_embeddings: np.ndarray,
    calibration_embeddings: np.ndarray,
    keep_share: float = DEFAULT_KEEP_SHARE,
    shrinkage: str = "oas",
    metadata: Mapping[str, str] | None = None,
) -> OODGuard:
    """Fit the statistics on one set of in-distribution embeddings and calibrate on a disjoint one:
    fitted rows score too low, so calibrating on them would keep fewer than keep_share of new queries."""
    fit = unit_rows(fit_embeddings)
    calibration = unit_rows(calibration_embeddings)
    if calibration.shape[1] != fit.shape[1]:
        raise InputError(f"calibration embeddings are {calibration.shape[1]}-d, fit ones {fit.shape[1]}-d.")
    covariance, shrinkage_weight = shrunk_covariance(fit, shrinkage)
    mean = fit.mean(axis=0).astype(np.float32)
    precision = precision_from_covariance(covariance).astype(np.float32)
    # Calibrate with the float32 statistics that are stored, so the threshold matches what is applied.
    threshold = stored_threshold(conformal_threshold(mahalanobis_scores(calibration, mean, precision), keep_share))
    info = {
        "format": GUARD_FORMAT,
        "score": "squared Mahalanobis distance of the unit-length embedding to the in-distribution mean",
        "shrinkage": shrinkage,
        "shrinkage_weight": f"{shrinkage_weight:.6f}",
        "keep_share": f"{keep_share}",
        "calibration_rule": CALIBRATION_RULE,
        "n_fit": str(len(fit)),
        "n_calibration": str(len(calibration)),
        "embedding_dim": str(fit.shape[1]),
    }
    info.update(metadata or {})
    return OODGuard(mean=mean, precision=precision, threshold=threshold, metadata=info)


def stored_threshold(value: float) -> float:
    """`value` as the float32 the checkpoint stores, rounded up: the calibration score that sets the
    threshold is then kept on every CPU, whichever way its own float32 rounding goes."""
    stored = np.float32(value)
    if float(stored) < value:
        stored = np.nextafter(stored, np.float32(np.inf))
    return float(stored)


def logistic_regression(features: np.ndarray, outside: np.ndarray, l2: float) -> tuple[np.ndarray, float]:
    """(weights, bias) of an L2-penalised logistic regression of `outside` (bool per row) on `features`.
    Both classes are weighted equally, so the sizes of the fitting sets do not move the boundary;
    Newton's method, so a fit is deterministic."""
    rows = np.hstack([features, np.ones((len(features), 1))])
    labels = outside.astype(np.float64)
    share = labels.mean()
    if not 0.0 < share < 1.0:
        raise InputError("a discriminative guard needs both in-distribution and outside queries to fit.")
    sample = np.where(outside, 0.5 / share, 0.5 / (1.0 - share))
    penalty = np.full(rows.shape[1], float(l2))
    penalty[-1] = 0.0  # the bias is not penalised
    theta = np.zeros(rows.shape[1])
    for _ in range(50):
        p = 1.0 / (1.0 + np.exp(-np.clip(rows @ theta, -50, 50)))
        gradient = rows.T @ (sample * (p - labels)) + penalty * theta
        hessian = (rows * (sample * p * (1.0 - p))[:, None]).T @ rows + np.diag(penalty)
        step = np.linalg.solve(hessian, gradient)
        theta -= step
        if np.abs(step).max() < 1e-10:
            break
    return theta[:-1], float(theta[-1])


def fit_discriminative_guard(
    inside: np.ndarray,
    outside: np.ndarray,
    calibration: Mapping[str, tuple[np.ndarray, float]],
    l2: float = DEFAULT_L2,
    shrinkage: str = "oas",
    metadata: Mapping[str, str] | None = None,
) -> OODGuard:
    """The Gaussian statistics of the unit `inside` embeddings, then a logistic regression of inside
    against `outside` on the unit embedding and its distance: the distance alone cannot flag
    near-domain queries once typed questions are among the inside ones (docs/ood-guard.md).
    `calibration` is {name: (embeddings, keep share)}, none of them fitted on; the threshold is the
    largest of their conformal thresholds, so that each set keeps at least its share."""
    fit = unit_rows(inside)
    away = unit_rows(outside)
    covariance, shrinkage_weight = shrunk_covariance(fit, shrinkage)
    mean = fit.mean(axis=0).astype(np.float32)
    precision = precision_from_covariance(covariance).astype(np.float32)
    rows = np.vstack([fit, away])
    # The distance is scaled to the size of a unit vector's coordinates so that one penalty suits both.
    distance = mahalanobis_scores(rows, mean, precision) / len(mean)
    weights, bias = logistic_regression(
        np.hstack([rows, distance[:, None]]), np.r_[np.zeros(len(fit)), np.ones(len(away))].astype(bool), l2
    )
    guard = OODGuard(
        mean=mean,
        precision=precision,
        threshold=0.0,
        weight=weights[:-1].astype(np.float32),
        distance_weight=float(np.float32(weights[-1] / len(mean))),
        bias=float(np.float32(bias)),
    )
    thresholds = {name: conformal_threshold(guard.scores(rows_), share) for name, (rows_, share) in calibration.items()}
    info = {
        "format": GUARD_FORMAT,
        "score": DISCRIMINATIVE_SCORE,
        "shrinkage": shrinkage,
        "shrinkage_weight": f"{shrinkage_weight:.6f}",
        "l2": f"{l2}",
        "calibration_rule": CALIBRATION_RULE + ", the largest over the calibration sets",
        "n_fit": str(len(fit)),
        "n_outside": str(len(away)),
        "embedding_dim": str(fit.shape[1]),
        **{f"keep_share_{name}": f"{share}" for name, (_, share) in calibration.items()},
        **{f"n_calibration_{name}": str(len(rows_)) for name, (rows_, _) in calibration.items()},
    }
    info.update(metadata or {})
    return OODGuard(
        mean=mean,
        precision=precision,
        threshold=stored_threshold(max(thresholds.values())),
        metadata=info,
        weight=guard.weight,
        distance_weight=guard.distance_weight,
        bias=guard.bias,
    )
