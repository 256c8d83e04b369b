"""The guard's statistics on disk: safetensors, never pickle, since a router's files may come from
anyone and loading them must run no code.

Tensors: ood_mean (D,), ood_precision (D, D), ood_threshold () and, for a discriminative guard,
ood_weight (D,), ood_distance_weight (), ood_bias (), all float32, with string metadata. Everything
the model would apply is validated on reading, so a bad file fails in one line rather than as
wrong routes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from benchgen_router.errors import InputError, first_line
from benchgen_router.files import atomic_output
from benchgen_router.ood.guard import (
    BIAS_KEY,
    DISCRIMINATIVE_KEYS,
    DISTANCE_WEIGHT_KEY,
    GUARD_FORMAT,
    GUARD_KEYS,
    MEAN_KEY,
    PRECISION_KEY,
    THRESHOLD_KEY,
    WEIGHT_KEY,
    OODGuard,
)

# How far from symmetric a stored precision matrix may be (float32 round-off of a symmetric matrix is
# far smaller; anything larger means the file holds something else).
SYMMETRY_TOLERANCE = 1e-4
GUARD_FILE = "ood_guard.safetensors"  # next to head_weights.npy in a trainer's output folder


def guard_from_tensors(
    tensors: Mapping[str, np.ndarray],
    metadata: Mapping[str, str] | None,
    source: str,
    embedding_dim: int | None = None,
) -> OODGuard:
    """Validate stored statistics (names, shapes, values finite in float32 as applied, a symmetric
    positive-definite precision, a usable threshold) and build the guard; any problem is one
    InputError line naming `source`."""
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
    """Write the guard as safetensors, atomically: a crash leaves any previous file as it was."""
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
    """Read and validate statistics from .safetensors (as saved) or .npz (the same arrays, read with
    allow_pickle=False); embedding_dim, when given, must match."""
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
