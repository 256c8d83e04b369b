"""Out-of-distribution guard for the router: is a query's embedding like the ones the head was built for?

Outside its training distribution (another language, another domain) the head's argmax is close to
arbitrary, so a query the guard flags should go to a fallback agent instead (fallback_agent()).

The guard is a Gaussian model of in-distribution embeddings scaled to unit length (the direction
carries the meaning; the length does not, and queries in scripts the backbone's vocabulary covers
poorly get short embeddings near the raw mean): their mean and a shrinkage covariance (Oracle
Approximating Shrinkage by default, Ledoit-Wolf on request), stored as its precision matrix.
A query's score is the squared Mahalanobis distance of its unit embedding to the mean; it is flagged when the score
exceeds a threshold calibrated on held-out in-distribution embeddings so that a stated share
(default 95%) of in-distribution queries is kept (conformal rule, see conformal_threshold()).
docs/ood-guard.md compares it with other scores (scripts/mahalanobis_study.py) and gives the choice.

Everything here is numpy. The statistics are stored as safetensors (never pickle): tensors
ood_mean (D,) float32, ood_precision (D, D) float32, ood_threshold () float32, and string metadata.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchgen_router.errors import InputError, first_line
from benchgen_router.files import atomic_output

GUARD_FORMAT = "benchgen-router-ood-guard/1"
MEAN_KEY = "ood_mean"
PRECISION_KEY = "ood_precision"
THRESHOLD_KEY = "ood_threshold"
GUARD_KEYS = (MEAN_KEY, PRECISION_KEY, THRESHOLD_KEY)
# A discriminative guard adds a linear score on top of the distance (see fit_discriminative_guard).
WEIGHT_KEY = "ood_weight"
DISTANCE_WEIGHT_KEY = "ood_distance_weight"
BIAS_KEY = "ood_bias"
DISCRIMINATIVE_KEYS = (WEIGHT_KEY, DISTANCE_WEIGHT_KEY, BIAS_KEY)
DISCRIMINATIVE_SCORE = (
    "logistic score w.u + a*d + b of the unit-length embedding u and its squared Mahalanobis distance d to the "
    "in-distribution mean, fitted on in-distribution against outside queries"
)
SHRINKAGE_METHODS = ("oas", "ledoit_wolf")
DEFAULT_KEEP_SHARE = 0.95
DEFAULT_L2 = 0.1  # the logistic regression's penalty (docs/ood-guard.md: the comparison)
CALIBRATION_RULE = "conformal: ceil((n+1)*keep_share)-th smallest of n held-out in-distribution scores"
# How far from symmetric a stored precision matrix may be (float32 round-off of a symmetric matrix is
# far smaller; anything larger means the file holds something else).
SYMMETRY_TOLERANCE = 1e-4
UNIT_NORM_FLOOR = 1e-12


# ---------------------------------------------------------------------------------------------
# Statistics


def _as_matrix(embeddings: np.ndarray, what: str) -> np.ndarray:
    array = np.asarray(embeddings)
    if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] == 0:
        raise InputError(f"{what} must be a non-empty 2-d array (queries, dim); got shape {array.shape}.")
    if not np.issubdtype(array.dtype, np.floating) or not np.isfinite(array).all():
        raise InputError(f"{what} must hold finite floating-point values; recompute the embeddings.")
    return array.astype(np.float64)


def shrunk_covariance(embeddings: np.ndarray, method: str = "oas") -> tuple[np.ndarray, float]:
    """(covariance, shrinkage) of the rows: (1 - s) * S + s * (trace(S) / D) * I, S the maximum-likelihood
    covariance (divided by n), s chosen by Oracle Approximating Shrinkage (Chen, Wiesel, Eldar and Hero
    2010, eq. 23) or by Ledoit and Wolf (2004, lemma 3.2 and eqs. 14-15). With fewer rows than
    dimensions (or barely more) S is singular or badly conditioned; the shrunk estimate is always
    positive definite when trace(S) > 0."""
    if method not in SHRINKAGE_METHODS:
        raise InputError(f"unknown shrinkage method '{method}'; use one of {', '.join(SHRINKAGE_METHODS)}.")
    x = _as_matrix(embeddings, "embeddings")
    n, dim = x.shape
    if n < 2:
        raise InputError(f"need at least 2 in-distribution embeddings to fit the guard; got {n}.")
    centred = x - x.mean(axis=0)
    sample = centred.T @ centred / n
    trace = float(np.trace(sample))
    if trace <= 0.0:
        raise InputError("the in-distribution embeddings are all identical; fit the guard on varied queries.")
    scale = trace / dim
    trace_of_square = float(np.sum(sample * sample))  # trace(S @ S) for symmetric S
    if method == "oas":
        numerator = (1.0 - 2.0 / dim) * trace_of_square + trace**2
        denominator = (n + 1.0 - 2.0 / dim) * (trace_of_square - trace**2 / dim)
        shrinkage = 1.0 if denominator <= 0.0 else min(1.0, numerator / denominator)
    else:
        # Distances in the Frobenius norm divided by D, as in the paper's <A, B> = tr(A B^T) / D.
        dispersion = (trace_of_square - 2.0 * scale * trace + scale**2 * dim) / dim  # ||S - scale I||^2
        # sum_k ||x_k x_k^T - S||^2 = sum_k ||x_k||^4 - n ||S||^2 (expand and use sum_k x_k x_k^T = n S)
        row_norms = np.sum(centred * centred, axis=1)
        spread = (float(np.sum(row_norms**2)) - n * trace_of_square) / (n**2 * dim)
        shrinkage = 1.0 if dispersion <= 0.0 else min(1.0, max(0.0, spread) / dispersion)
    covariance = (1.0 - shrinkage) * sample
    covariance[np.diag_indices(dim)] += shrinkage * scale
    return covariance, float(shrinkage)


def precision_from_covariance(covariance: np.ndarray) -> np.ndarray:
    """The inverse of a positive-definite covariance, through its Cholesky factor, made exactly symmetric."""
    try:
        lower = np.linalg.cholesky(covariance)
    except np.linalg.LinAlgError:
        raise InputError("the covariance is not positive definite; fit it with shrunk_covariance().") from None
    inverse_lower = np.linalg.solve(lower, np.eye(len(covariance)))
    precision = inverse_lower.T @ inverse_lower
    return (precision + precision.T) / 2.0


def unit_rows(embeddings: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length, float64 (a zero row stays zero: its length is floored at 1e-12, as
    torch.nn.functional.normalize does)."""
    rows = _as_matrix(embeddings, "embeddings")
    return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), UNIT_NORM_FLOOR)


def mahalanobis_scores(embeddings: np.ndarray, mean: np.ndarray, precision: np.ndarray) -> np.ndarray:
    """Squared Mahalanobis distance of each row to the mean: (x - mean)^T P (x - mean), float64."""
    diff = _as_matrix(embeddings, "embeddings") - np.asarray(mean, dtype=np.float64)
    return np.einsum("nd,nd->n", diff @ np.asarray(precision, dtype=np.float64), diff)


# ---------------------------------------------------------------------------------------------
# Calibration and evaluation


def conformal_threshold(scores: np.ndarray, keep_share: float = DEFAULT_KEEP_SHARE) -> float:
    """The ceil((n+1) * keep_share)-th smallest of n held-out in-distribution scores.

    A fresh in-distribution query exchangeable with those n is then kept (score <= threshold) with
    probability at least keep_share, and at most keep_share + 1/(n+1) when scores have no ties (split
    conformal prediction). Needs n >= keep_share / (1 - keep_share) (19 for 95%); fewer is an error."""
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


def auroc(in_scores: np.ndarray, out_scores: np.ndarray) -> float:
    """Area under the ROC curve for telling out-of-distribution (higher score) from in-distribution:
    P(out score > in score) + P(equal) / 2, by the rank-sum (Mann-Whitney) identity with tied
    scores given their average rank."""
    inside = np.asarray(in_scores, dtype=np.float64).ravel()
    outside = np.asarray(out_scores, dtype=np.float64).ravel()
    if len(inside) == 0 or len(outside) == 0:
        raise InputError("AUROC needs at least one in-distribution and one out-of-distribution score.")
    pooled = np.concatenate([inside, outside])
    _, group, counts = np.unique(pooled, return_inverse=True, return_counts=True)
    # the values of a tie group take ranks after those of all smaller values; each gets their mean
    mean_rank = np.cumsum(counts) - counts + (counts + 1) / 2.0
    rank_sum = mean_rank[group][len(inside) :].sum()
    return float((rank_sum - len(outside) * (len(outside) + 1) / 2) / (len(inside) * len(outside)))


def split_indices(count: int, shares: tuple[float, ...], seed: int) -> list[np.ndarray]:
    """A seeded random partition of range(count) into parts of the given shares (the last part takes
    the rest), each part sorted."""
    order = np.random.default_rng(seed).permutation(count)
    bounds = np.round(np.cumsum(shares[:-1]) * count).astype(int)
    return [np.sort(part) for part in np.split(order, bounds)]


# ---------------------------------------------------------------------------------------------
# The guard


@dataclass(frozen=True)
class OODGuard:
    """In-distribution statistics and the calibrated threshold; flags(x) is True where x is out of
    distribution (score above the threshold)."""

    mean: np.ndarray  # (D,) float32
    precision: np.ndarray  # (D, D) float32, symmetric positive definite
    threshold: float
    metadata: dict[str, str] = field(default_factory=dict)
    # A discriminative guard's linear part (None: the score is the distance alone).
    weight: np.ndarray | None = None  # (D,) float32
    distance_weight: float | None = None
    bias: float | None = None

    @property
    def discriminative(self) -> bool:
        return self.weight is not None

    @property
    def embedding_dim(self) -> int:
        return int(self.mean.shape[0])

    def scores(self, embeddings: np.ndarray) -> np.ndarray:
        embeddings = np.asarray(embeddings)
        if embeddings.ndim != 2 or embeddings.shape[1] != self.embedding_dim:
            raise InputError(
                f"the guard takes {self.embedding_dim}-d embeddings; got shape {embeddings.shape} "
                "(statistics fitted on another backbone?)."
            )
        unit = unit_rows(embeddings)
        distance = mahalanobis_scores(unit, self.mean, self.precision)
        if not self.discriminative:
            return distance
        return unit @ self.weight.astype(np.float64) + float(self.distance_weight) * distance + float(self.bias)

    def flags(self, embeddings: np.ndarray) -> np.ndarray:
        return self.scores(embeddings) > self.threshold

    def tensors(self) -> dict[str, np.ndarray]:
        """The tensors as stored (names and dtypes the model's remote code reads)."""
        tensors = {
            MEAN_KEY: np.ascontiguousarray(self.mean, dtype=np.float32),
            PRECISION_KEY: np.ascontiguousarray(self.precision, dtype=np.float32),
            THRESHOLD_KEY: np.asarray(self.threshold, dtype=np.float32),
        }
        if self.discriminative:
            tensors[WEIGHT_KEY] = np.ascontiguousarray(self.weight, dtype=np.float32)
            tensors[DISTANCE_WEIGHT_KEY] = np.asarray(self.distance_weight, dtype=np.float32)
            tensors[BIAS_KEY] = np.asarray(self.bias, dtype=np.float32)
        return tensors


def fit_guard(
    fit_embeddings: np.ndarray,
    calibration_embeddings: np.ndarray,
    keep_share: float = DEFAULT_KEEP_SHARE,
    shrinkage: str = "oas",
    metadata: Mapping[str, str] | None = None,
) -> OODGuard:
    """Fit the statistics on one set of in-distribution embeddings and calibrate the threshold on a
    disjoint one (the calibration rows must not be among the fitted ones, or their scores are too low
    and fewer than keep_share of new queries are kept)."""
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
    """(weights, bias) of an L2-penalised logistic regression of `outside` (bool per row) on `features`,
    with both classes weighted equally whatever their sizes; Newton's method, deterministic."""
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
    """A guard that tells in-distribution queries from outside ones: the Gaussian statistics of the
    unit-length `inside` embeddings, then a logistic regression of inside against `outside` on the
    unit embedding and its distance. The threshold keeps at least each calibration set's share of
    its queries ({name: (embeddings, keep share)}, none of them among the fitted rows): the largest
    of their conformal thresholds."""
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


# ---------------------------------------------------------------------------------------------
# Storage


def guard_from_tensors(
    tensors: Mapping[str, np.ndarray],
    metadata: Mapping[str, str] | None,
    source: str,
    embedding_dim: int | None = None,
) -> OODGuard:
    """Validate stored statistics (names, shapes, finiteness, a symmetric positive-definite precision,
    a finite threshold) and build the guard; any problem is one InputError line naming `source`."""
    fix = "refit and save it with ood.save_guard()"
    expected = GUARD_KEYS + (DISCRIMINATIVE_KEYS if WEIGHT_KEY in tensors else ())
    missing = [key for key in expected if key not in tensors]
    unknown = sorted(set(tensors) - set(expected))
    if missing or unknown:
        raise InputError(
            f"OOD statistics {source} must hold exactly {', '.join(expected)}; "
            f"missing {missing or 'none'}, unexpected {unknown or 'none'}: {fix}."
        )
    for key in expected:
        array = np.asarray(tensors[key])
        if not np.issubdtype(array.dtype, np.floating):
            raise InputError(f"OOD statistics {source}: {key} has dtype {array.dtype}, not floating point: {fix}.")
        with np.errstate(over="ignore"):  # checked as stored and applied: in float32
            finite = np.isfinite(array.astype(np.float32)).all()
        if not finite:
            raise InputError(f"OOD statistics {source}: {key} holds NaN or infinite values in float32: {fix}.")
    mean, precision, threshold = (np.asarray(tensors[key]) for key in GUARD_KEYS)
    dim = embedding_dim if embedding_dim is not None else (mean.shape[0] if mean.ndim == 1 else -1)
    weight = np.asarray(tensors[WEIGHT_KEY]) if WEIGHT_KEY in tensors else None
    scalars = [np.asarray(tensors[key]) for key in (DISTANCE_WEIGHT_KEY, BIAS_KEY) if key in tensors]
    linear_fits = weight is None or (weight.shape == (dim,) and all(value.size == 1 for value in scalars))
    if mean.shape != (dim,) or precision.shape != (dim, dim) or threshold.size != 1 or not linear_fits:
        expected = f"{embedding_dim}-d embeddings" if embedding_dim is not None else "one embedding size"
        raise InputError(
            f"OOD statistics {source} do not fit {expected}: {MEAN_KEY} {mean.shape}, {PRECISION_KEY} "
            f"{precision.shape}, {THRESHOLD_KEY} {threshold.shape} (statistics of another backbone?): {fix}."
        )
    precision64 = precision.astype(np.float64)
    asymmetry = np.abs(precision64 - precision64.T).max()
    if asymmetry > SYMMETRY_TOLERANCE * max(1.0, np.abs(precision64).max()):
        raise InputError(f"OOD statistics {source}: {PRECISION_KEY} is not symmetric: {fix}.")
    try:
        np.linalg.cholesky(precision64)
    except np.linalg.LinAlgError:
        raise InputError(f"OOD statistics {source}: {PRECISION_KEY} is not positive definite: {fix}.") from None
    info = dict(metadata or {})
    if info.get("format", GUARD_FORMAT) != GUARD_FORMAT:
        raise InputError(f"OOD statistics {source} have format {info['format']!r}, not {GUARD_FORMAT!r}: {fix}.")
    if weight is None and float(threshold.reshape(())) <= 0.0:  # distances are >= 0: every query would be flagged
        raise InputError(f"OOD statistics {source}: {THRESHOLD_KEY} must be positive for a distance score: {fix}.")
    return OODGuard(
        mean=mean.astype(np.float32),
        precision=precision.astype(np.float32),
        threshold=float(threshold.reshape(())),
        metadata=info,
        weight=None if weight is None else weight.astype(np.float32),
        distance_weight=None if weight is None else float(scalars[0].reshape(())),
        bias=None if weight is None else float(scalars[1].reshape(())),
    )


def save_guard(path: str | Path, guard: OODGuard) -> Path:
    """Write the guard as safetensors, atomically (a crash leaves any previous file as it was)."""
    from safetensors.numpy import save

    final = Path(path)
    if final.suffix != ".safetensors":
        raise InputError(f"OOD statistics are saved as .safetensors; got '{final.name}'.")
    guard_from_tensors(guard.tensors(), guard.metadata, str(final))  # never write what loading would refuse
    payload = save(guard.tensors(), metadata={key: str(value) for key, value in guard.metadata.items()})
    with atomic_output(final, "wb") as handle:
        handle.write(payload)
    return final


def load_guard(path: str | Path, embedding_dim: int | None = None) -> OODGuard:
    """Read and validate statistics from .safetensors (as saved) or .npz (the same three arrays, read
    with allow_pickle=False); embedding_dim, when given, must match."""
    source = Path(path)
    if not source.is_file():
        raise InputError(f"OOD statistics not found: {source}.")
    suffix = source.suffix
    try:
        if suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(source), framework="np") as handle:
                tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 (not a dict)
                metadata = handle.metadata() or {}
        elif suffix == ".npz":
            with np.load(source, allow_pickle=False) as archive:
                tensors = {key: archive[key] for key in archive.files}
            metadata = {}
        elif suffix == ".npy":
            np.load(source, allow_pickle=False)  # a pickled .npy is refused here, before anything runs
            raise InputError(
                f"OOD statistics {source} are one .npy array; they need {', '.join(GUARD_KEYS)}: "
                "save them with ood.save_guard() (.safetensors)."
            )
        else:
            raise InputError(f"OOD statistics {source}: unknown file type '{suffix}'; use .safetensors or .npz.")
    except InputError:
        raise
    except ValueError as err:  # numpy: "Object arrays cannot be loaded when allow_pickle=False"
        if "allow_pickle" in str(err):
            raise InputError(
                f"OOD statistics {source} hold pickled objects, which are never loaded; "
                "save them with ood.save_guard() (.safetensors)."
            ) from None
        raise InputError(f"OOD statistics {source} cannot be read ({first_line(err)}); re-save them.") from None
    except Exception as err:  # safetensors and zipfile raise their own types for damaged files
        raise InputError(f"OOD statistics {source} cannot be read ({first_line(err)}); re-save them.") from None
    return guard_from_tensors(tensors, metadata, str(source), embedding_dim)


# ---------------------------------------------------------------------------------------------
# Where flagged queries go


def fallback_agent(rewards: np.ndarray, costs: np.ndarray | None = None, tolerance: float = 0.0) -> int:
    """Index of the agent that answers queries the guard flags.

    rewards: (rows, agents) rewards of the training rows. Without costs: the best fixed agent (highest
    mean reward; the lowest index among equals). With costs (agents,), e.g. mean cost per call: the
    cheapest agent whose mean reward is within `tolerance` of the best (ties in cost: higher reward,
    then lower index)."""
    table = np.asarray(rewards, dtype=np.float64)
    if table.ndim != 2 or table.shape[0] == 0 or table.shape[1] == 0 or not np.isfinite(table).all():
        raise InputError(f"rewards must be a finite non-empty (rows, agents) array; got shape {table.shape}.")
    mean_reward = table.mean(axis=0)
    best = float(mean_reward.max())
    if costs is None:
        return int(np.argmax(mean_reward))
    price = np.asarray(costs, dtype=np.float64)
    if price.shape != (table.shape[1],) or not np.isfinite(price).all() or (price < 0).any():
        raise InputError(f"costs must be {table.shape[1]} finite non-negative numbers, one per agent.")
    if not tolerance >= 0.0:
        raise InputError(f"tolerance must be a non-negative reward difference; got {tolerance}.")
    eligible = np.flatnonzero(mean_reward >= best - tolerance - 1e-12)
    return int(min(eligible, key=lambda agent: (price[agent], -mean_reward[agent], agent)))


# ---------------------------------------------------------------------------------------------
# The trainer's guard: fitted on the task pool, stored next to head_weights.npy

GUARD_FILE = "ood_guard.safetensors"  # next to head_weights.npy in a trainer's output folder
_DATA = Path(__file__).resolve().parent / "data"
PACKAGED_OOD_QUERIES = _DATA / "ood_queries.jsonl"  # measuring only: never fitted on
# Groups of the packaged OOD set: plainly not benchmark items (the guard must flag them), and
# phrased like benchmark items (reported, with no target).
PLAIN_OOD_GROUPS = (
    "turkish",
    "german",
    "chinese",
    "arabic",
    "russian",
    "hindi",
    "japanese",
    "code_tooling",
    "chit_chat",
    "everyday_writing_planning",
)
BENCHMARK_STYLE_OOD_GROUPS = ("benchmark_style_templated", "foreign_templated", "benchmark_style_plain")
PACKAGED_PLAIN_QUERIES = _DATA / "plain_queries.jsonl"  # measuring only: in-domain questions as users type them
PACKAGED_GUARD_INSIDE = _DATA / "guard_fit_inside.jsonl"  # fitting: in-domain questions as users type them
PACKAGED_GUARD_OUTSIDE = _DATA / "guard_fit_outside.jsonl"  # fitting: queries the guard must flag
DEFAULT_PLAIN_KEEP_SHARE = 0.9
DEFAULT_CALIBRATION_SHARE = 0.3
DEFAULT_SPLIT_SEED = 0


def read_ood_queries(
    path: str | Path = PACKAGED_OOD_QUERIES, what: str = "OOD query set"
) -> tuple[list[str], list[str]]:
    """(queries, groups) of a query set (out-of-distribution, or the guard's fitting sets): JSONL rows
    with "query" and "group"."""
    from benchgen_router.files import read_jsonl

    rows = read_jsonl(path, what)
    for number, row in enumerate(rows, 1):
        if not isinstance(row.get("query"), str) or not row["query"].strip() or not isinstance(row.get("group"), str):
            raise InputError(f"{what} {path}: row {number} needs a non-empty 'query' and a 'group' string.")
    if not rows:
        raise InputError(f"{what} {path} holds no queries.")
    return [row["query"] for row in rows], [row["group"] for row in rows]


def min_prompts_to_calibrate(keep_share: float, calibration_share: float = DEFAULT_CALIBRATION_SHARE) -> int:
    """The fewest in-distribution prompts whose calibration part can calibrate keep_share."""
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
    """Fit the guard on a seeded split of in-distribution prompt embeddings (every prompt of the task
    pool, labelled or not), calibrate it on the held-out part to keep `keep_share`, and pick the
    fallback agent: `fallback` (an index into `agents`) when given, else from the training rows'
    rewards (fallback_agent(); with `costs`, one per agent in `agents` order, the cheapest within
    `tolerance` of the best)."""
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


def fallback_rule(costs: np.ndarray | None, tolerance: float, fallback: int | None) -> str:
    if fallback is not None:
        return "highest mean utility on the training rows (ties: the cheaper agent)"
    if costs is None:
        return "best fixed agent on the training rows"
    return f"cheapest agent within {tolerance} of the best mean reward on the training rows"


def utility_fallback(utility: np.ndarray, cost: np.ndarray) -> int:
    """Index of the agent with the highest mean utility over the training rows (utility: (rows,
    agents), an operating point's reward - weighted cost and latency); among equals, the one with
    the lowest mean cost `cost` (rows, agents), then the lowest index."""
    mean_utility = np.asarray(utility, dtype=np.float64).mean(axis=0)
    mean_cost = np.asarray(cost, dtype=np.float64).mean(axis=0)
    best = np.flatnonzero(mean_utility >= mean_utility.max() - 1e-12)
    return int(min(best, key=lambda agent: (mean_cost[agent], agent)))


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
    """The trainer's discriminative guard (fit_discriminative_guard). `prompts`: the task pool's
    canonical prompts; `views`: their guard views (forms.guard_views), `owners[i]` the prompt of view
    i; `inside`: in-domain questions as users type them; `outside`: queries to flag. A seeded
    `calibration_share` of the prompts and half of the `inside` questions are held out to calibrate
    (keep_share of the prompts, plain_keep_share of the questions); the rest, and every outside
    query, are fitted. The fallback is as in train_guard."""
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


def guard_statistics_file(weights_path: str | Path, explicit: str | Path | None = None) -> Path | None:
    """The statistics a release carries: `explicit` if given (it must exist), else GUARD_FILE next to
    head_weights.npy when present, else None (a release without a guard)."""
    if explicit is not None:
        path = Path(explicit)
        if not path.is_file():
            raise InputError(f"OOD statistics not found: {path}; pass the ood_guard.safetensors the trainer wrote.")
        return path
    beside = Path(weights_path).parent / GUARD_FILE
    return beside if beside.is_file() else None


def check_fallback_agent(agent: object, agents: Sequence[str], source: str) -> str:
    """The fallback agent if it is one of the pool's `agents`; one InputError line otherwise."""
    if agent is None:
        raise InputError(
            f"OOD statistics {source} name no fallback agent (an .npz has no metadata): name the agent that "
            "answers flagged queries with --ood-fallback-agent AGENT."
        )
    if agent not in agents:
        raise InputError(
            f"OOD statistics {source}: fallback agent {agent!r} is not in agent_order {list(agents)}; "
            "refit the guard for this pool (or name a pool agent as ood_guard.fallback_agent in the manifest)."
        )
    return str(agent)


def evaluate_guard(
    threshold: float,
    in_scores: np.ndarray,
    ood_scores: np.ndarray,
    ood_groups: Sequence[str],
    in_rows: str,
) -> dict[str, object]:
    """AUROC of in-distribution against all OOD queries and per group, the share flagged per group at
    the threshold, and the share of the in-distribution rows kept, from the guard's scores of both.
    `in_rows` says which rows those are."""
    inside = np.asarray(in_scores, dtype=np.float64)
    outside = np.asarray(ood_scores, dtype=np.float64)
    groups = np.asarray(list(ood_groups))
    per_group = {}
    for group in dict.fromkeys(ood_groups):
        scores = outside[groups == group]
        per_group[str(group)] = {
            "queries": len(scores),
            "auroc": auroc(inside, scores),
            "flagged_share": float((scores > threshold).mean()),
        }
    return {
        "threshold": float(threshold),
        "in_distribution_rows": in_rows,
        "in_distribution_count": len(inside),
        "in_distribution_kept_share": float((inside <= threshold).mean()),
        "ood_queries": len(outside),
        "ood_flagged_share": float((outside > threshold).mean()),
        "auroc": auroc(inside, outside),
        "groups": per_group,
    }


def group_lines(groups: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One printed line per OOD group: its size, the share flagged and the AUROC against in-distribution."""
    return [
        f"  {group:<28} {figures['queries']:>3} queries  flagged {figures['flagged_share']:.3f}  "
        f"AUROC {figures['auroc']:.3f}"
        for group, figures in groups.items()
    ]
