"""The statistics file (benchgen_router/ood/storage.py): round trips, atomic saving, and every refusal."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import test_ood_guard

from benchgen_router import ood
from benchgen_router.errors import InputError

synthetic = test_ood_guard.synthetic  # the synthetic embeddings (a module fixture)


def test_saved_guard_round_trips(tmp_path, synthetic):
    guard = ood.fit_guard(synthetic["draw"](300, 1), synthetic["draw"](100, 2), metadata={"backbone": "test"})
    path = ood.save_guard(tmp_path / "guard.safetensors", guard)
    loaded = ood.load_guard(path, embedding_dim=synthetic["dim"])
    assert loaded.threshold == guard.threshold and loaded.metadata == guard.metadata
    assert np.array_equal(loaded.mean, guard.mean) and np.array_equal(loaded.precision, guard.precision)
    queries = synthetic["far"][:50]
    assert np.array_equal(loaded.flags(queries), guard.flags(queries))
    np.savez(tmp_path / "guard.npz", **guard.tensors())
    assert ood.load_guard(tmp_path / "guard.npz").threshold == guard.threshold
    assert sorted(p.name for p in tmp_path.iterdir()) == ["guard.npz", "guard.safetensors"]  # no temporary left
    with pytest.raises(InputError, match="takes 24-d embeddings"):
        loaded.scores(np.ones((2, 7), dtype=np.float32))


def test_saving_refuses_bad_statistics_and_keeps_the_old_file(tmp_path, synthetic):
    guard = ood.fit_guard(synthetic["draw"](300, 1), synthetic["draw"](100, 2))
    path = ood.save_guard(tmp_path / "guard.safetensors", guard)
    before = path.read_bytes()
    broken = ood.OODGuard(guard.mean, guard.precision, float("nan"), guard.metadata)
    with pytest.raises(InputError, match="holds NaN"):
        ood.save_guard(path, broken)
    assert path.read_bytes() == before
    with pytest.raises(InputError, match="does not exist"):
        ood.save_guard(tmp_path / "missing" / "guard.safetensors", guard)
    with pytest.raises(InputError, match=r"saved as \.safetensors"):
        ood.save_guard(tmp_path / "guard.npz", guard)


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> Path:
    from safetensors.numpy import save_file

    save_file(tensors, str(path), metadata=metadata)
    return path


@pytest.fixture
def good_tensors(synthetic) -> dict[str, np.ndarray]:
    return ood.fit_guard(synthetic["draw"](300, 1), synthetic["draw"](100, 2)).tensors()


def non_positive_definite(precision: np.ndarray) -> np.ndarray:
    values, vectors = np.linalg.eigh(precision.astype(np.float64))
    values[0] = -abs(values[-1])  # symmetric, one negative eigenvalue
    return ((vectors * values) @ vectors.T).astype(np.float32)


@pytest.mark.parametrize(
    "case, change, message",
    [
        ("short mean", lambda t: {**t, "ood_mean": t["ood_mean"][:-1]}, "do not fit 24-d embeddings"),
        ("non-square", lambda t: {**t, "ood_precision": t["ood_precision"][:, :-1]}, "do not fit"),
        ("vector threshold", lambda t: {**t, "ood_threshold": np.ones(2, np.float32)}, "do not fit"),
        ("NaN mean", lambda t: {**t, "ood_mean": np.full_like(t["ood_mean"], np.nan)}, "holds NaN"),
        ("inf threshold", lambda t: {**t, "ood_threshold": np.asarray(np.inf, np.float32)}, "holds NaN"),
        ("not PD", lambda t: {**t, "ood_precision": non_positive_definite(t["ood_precision"])}, "positive definite"),
        ("asymmetric", lambda t: {**t, "ood_precision": np.triu(t["ood_precision"])}, "not symmetric"),
        ("integer", lambda t: {**t, "ood_mean": np.ones(24, np.int32)}, "not floating point"),
        ("missing key", lambda t: {k: v for k, v in t.items() if k != "ood_threshold"}, "missing"),
        ("huge mean", lambda t: {**t, "ood_mean": np.full(24, 1e300)}, "NaN or infinite values in float32"),
        ("huge threshold", lambda t: {**t, "ood_threshold": np.asarray(1e300)}, "NaN or infinite values in float32"),
        ("zero threshold", lambda t: {**t, "ood_threshold": np.asarray(0.0, np.float32)}, "must be positive"),
        ("negative threshold", lambda t: {**t, "ood_threshold": np.asarray(-5.0, np.float32)}, "must be positive"),
        ("half a linear part", lambda t: {**t, "ood_weight": np.ones(24, np.float32)}, "missing"),
        ("extra key", lambda t: {**t, "ood_reference": np.ones((3, 24), np.float32)}, "unexpected"),
    ],
)
def test_bad_safetensors_statistics_are_refused(tmp_path, good_tensors, case, change, message):
    path = write_safetensors(tmp_path / "bad.safetensors", change(good_tensors))
    with pytest.raises(InputError, match=message) as caught:
        ood.load_guard(path, embedding_dim=24)
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)


def test_bad_files_of_other_kinds_are_refused(tmp_path, good_tensors):
    pickled = tmp_path / "stats.npy"
    np.save(pickled, np.array([{"ood_mean": 1}], dtype=object), allow_pickle=True)
    plain = tmp_path / "plain.npy"
    np.save(plain, good_tensors["ood_mean"])
    wrong_keys = tmp_path / "wrong.npz"
    np.savez(wrong_keys, mean=good_tensors["ood_mean"], cov=good_tensors["ood_precision"], thr=1.0)
    pickled_npz = tmp_path / "pickled.npz"
    np.savez(pickled_npz, **{**good_tensors, "ood_mean": np.array([object()], dtype=object)})
    damaged = tmp_path / "damaged.safetensors"
    damaged.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not a header at all")
    other_format = write_safetensors(tmp_path / "other.safetensors", good_tensors, {"format": "something/9"})
    cases = [
        (pickled, "pickled objects"),
        (plain, "one .npy array"),
        (wrong_keys, "missing"),
        (pickled_npz, "pickled objects"),
        (damaged, "cannot be read"),
        (other_format, "format 'something/9'"),
        (tmp_path / "stats.json", "not found"),
    ]
    (tmp_path / "stats.pt").write_bytes(b"whatever")
    cases.append((tmp_path / "stats.pt", "unknown file type"))
    for path, message in cases:
        with pytest.raises(InputError, match=message) as caught:
            ood.load_guard(path)
        assert "\n" not in str(caught.value), path
