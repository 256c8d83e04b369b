"""bench/workers.py: the random head every row shares, the batching each row reports, and the jobs'
fresh processes (a result back, or a failure as one error naming the job)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from benchgen_router.bench.workers import Bench, package_batching, reference_head
from benchgen_router.errors import InputError


def test_reference_head_centres_the_bias_on_the_calibration_prompts():
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(4, 5))
    calibration_embeddings = rng.normal(size=(6, 4)).astype(np.float32)
    seen: list[list[str]] = []

    def embed(texts: list[str]) -> np.ndarray:
        seen.append(texts)
        return calibration_embeddings[: len(texts)]

    calibration = [f"prompt {i}" for i in range(6)]
    w, b, theta = reference_head({"head_weight": weight}, calibration, embed)
    assert np.array_equal(w, weight) and theta.shape == (4 * 5 + 5,)
    assert np.allclose((calibration_embeddings @ w + b).mean(axis=0), 0.0)
    # A later row reuses row (a)'s theta, and still warms up on two calibration prompts.
    w2, b2, theta2 = reference_head({"head_weight": weight, "theta": theta}, calibration, embed)
    assert np.array_equal(w2, w) and np.array_equal(b2, b) and theta2 is theta
    assert seen == [calibration, calibration[:2]]


def test_package_batching_names_the_budget_that_bounds_a_batch():
    packed = SimpleNamespace(packs_queries=True, backbone=SimpleNamespace(dtype=torch.float32))
    padded = SimpleNamespace(packs_queries=False, backbone=SimpleNamespace(dtype=torch.float32))
    assert package_batching(packed, "cpu", None, None) == "packed <= 2048 tokens"
    assert package_batching(packed, "cpu", 8, 512) == "packed <= 512 tokens, <= 8 queries"
    assert package_batching(padded, "cpu", None, None) == "16 queries, padded"
    assert package_batching(padded, "cpu", 4, None) == "4 queries, padded"


def test_a_job_runs_in_a_fresh_process_and_a_failed_one_names_itself(tmp_path):
    bench = Bench(tmp_path, threads=1, device="cpu")
    peaks = bench.run("peak", repeats=2, shape=[16, 16, 16], dtypes=["float32"])
    assert set(peaks) == {"float32"} and peaks["float32"] > 0
    with pytest.raises(InputError, match=r"the peak job failed \(exit 1\):\n  (.*\n  )*.*no_such_dtype"):
        bench.run("peak", repeats=1, shape=[2, 2, 2], dtypes=["no_such_dtype"])
    assert sorted(p.name for p in tmp_path.glob("*.spec.json")) == ["job01-peak.spec.json", "job02-peak.spec.json"]
