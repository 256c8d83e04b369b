"""The guard's statistics and its score.

A Gaussian model of in-distribution embeddings scaled to unit length: the direction carries the
meaning and the length does not, and queries in scripts the backbone's vocabulary covers poorly get
short embeddings near the raw mean, which a distance in raw space would keep. The score is the
squared Mahalanobis distance to the mean, or for a discriminative guard a linear score on the unit
embedding and that distance. The names below are those the model's remote code reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from benchgen_router.errors import InputError

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
SHRINKAGE_METHODS = ("oas", "ledoit_wolf")
UNIT_NORM_FLOOR = 1e-12  # torch.nn.functional.normalize's floor, so numpy and the model agree on zero rows


def _as_matrix(embeddings: np.ndarray, what: str) -> np.ndarray:
    array = np.asarray(embeddings)
    if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] == 0:
        raise InputError(f"{what} must be a non-empty 2-d array (queries, dim); got shape {array.shape}.")
    if not np.issubdtype(array.dtype, np.floating) or not np.isfinite(array).all():
        raise InputError(f"{what} must hold finite floating-point values; recompute the embeddings.")
    return array.astype(np.float64)


def shrunk_covariance(embeddings: np.ndarray, method: str = "oas") -> tuple[np.ndarray, float]:
    """(covariance, shrinkage s) of the rows: (1 - s) S + s (tr S / D) I, S the maximum-likelihood
    covariance, s by Oracle Approximating Shrinkage (Chen, Wiesel, Eldar and Hero 2010, eq. 23) or
    Ledoit-Wolf (2004, lemma 3.2, eqs. 14-15). Shrunk because with few rows per dimension S is
    singular or badly conditioned; the estimate is positive definite whenever tr S > 0."""
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
    """The inverse through the Cholesky factor (which also refuses a covariance that is not positive
    definite), symmetrised so that round-off leaves no asymmetry in what is stored."""
    try:
        lower = np.linalg.cholesky(covariance)
    except np.linalg.LinAlgError:
        raise InputError("the covariance is not positive definite; fit it with shrunk_covariance().") from None
    inverse_lower = np.linalg.solve(lower, np.eye(len(covariance)))
    precision = inverse_lower.T @ inverse_lower
    return (precision + precision.T) / 2.0


def unit_rows(embeddings: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length, float64; a zero row stays zero (its length is floored)."""
    rows = _as_matrix(embeddings, "embeddings")
    return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), UNIT_NORM_FLOOR)


def mahalanobis_scores(embeddings: np.ndarray, mean: np.ndarray, precision: np.ndarray) -> np.ndarray:
    """Squared Mahalanobis distance of each row to the mean: (x - mean)^T P (x - mean), float64."""
    diff = _as_matrix(embeddings, "embeddings") - np.asarray(mean, dtype=np.float64)
    return np.einsum("nd,nd->n", diff @ np.asarray(precision, dtype=np.float64), diff)


@dataclass(frozen=True)
class OODGuard:
    """The statistics and the calibrated threshold: a query scoring above it is flagged."""

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
        """The tensors as stored: the names and float32 dtypes the model's remote code reads."""
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
