"""Evaluation (benchgen_router/ood/evaluation.py): AUROC against a hand count with ties."""

from __future__ import annotations

import numpy as np
import pytest

from benchgen_router import ood


def test_auroc_counts_ties_half():
    inside, outside = [0.1, 0.4, 0.4, 0.8], [0.4, 0.9, 0.2]
    # out 0.4: beats 0.1, ties both 0.4s (half each), loses to 0.8 -> 2; out 0.9 beats all 4; out 0.2 beats 0.1
    assert ood.auroc(inside, outside) == pytest.approx(7 / 12)
    assert ood.auroc([1.0, 2.0], [3.0, 4.0]) == 1.0 and ood.auroc([3.0, 4.0], [1.0, 2.0]) == 0.0
    assert ood.auroc([5.0, 5.0], [5.0]) == 0.5
    rng = np.random.default_rng(3)
    many_in, many_out = rng.integers(0, 6, 40), rng.integers(2, 9, 30)  # heavy ties
    pairwise = (many_out[:, None] > many_in[None]).mean() + 0.5 * (many_out[:, None] == many_in[None]).mean()
    assert ood.auroc(many_in, many_out) == pytest.approx(pairwise)


def test_evaluate_guard_reports_each_group_at_the_threshold():
    inside = np.array([0.1, 0.2, 0.3, 0.9])
    outside = np.array([0.5, 0.95, 0.05, 2.0])
    record = ood.evaluate_guard(0.4, inside, outside, ["a", "a", "b", "b"], "four rows")
    assert record["in_distribution_kept_share"] == 0.75 and record["ood_flagged_share"] == 0.75
    # group a: 0.5 beats three of the four in-distribution scores, 0.95 all four
    assert record["groups"]["a"] == {"queries": 2, "auroc": pytest.approx(7 / 8), "flagged_share": 1.0}
    assert record["groups"]["b"]["flagged_share"] == 0.5 and list(record["groups"]) == ["a", "b"]
    assert record["in_distribution_rows"] == "four rows" and record["in_distribution_count"] == 4
    lines = ood.group_lines(record["groups"])
    assert len(lines) == 2 and lines[0].split()[0] == "a" and "flagged 1.000" in lines[0] and "AUROC 0.875" in lines[0]
