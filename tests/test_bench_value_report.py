"""bench value's report: the paired comparison against the probability head, worked by hand."""

from __future__ import annotations

import pytest

from benchgen_router.bench.value.metrics import CurveFigures
from benchgen_router.bench.value.report import _paired_table, paired_differences
from benchgen_router.bench.value.run import FoldResult


def fold(index: int, figures: dict[str, tuple[float, float]], gap: dict[str, tuple[float, float]]) -> FoldResult:
    return FoldResult(
        kind="k-fold", repeat=0, fold=index, rows=10, reference="strong", reference_point=(1.0, 0.8),
        singles={}, curves={}, window=(0.0, 1.0), notes={}, budgets=[], seconds={},
        figures={key: CurveFigures(share=None, best=best, aiq=aiq) for key, (best, aiq) in figures.items()},
        gap={"figures": {name: {"apgr": apgr, "cpt_50": cpt} for name, (apgr, cpt) in gap.items()}},
    )  # fmt: skip


FOLDS = [
    fold(
        0,
        {"probability/lambda": (0.80, 0.70), "layers/lambda": (0.82, 0.73), "zero router": (0.8, 0.6)},
        {"probability": (0.60, 0.40), "layers": (0.65, 0.35)},
    ),
    fold(
        1,
        {"probability/lambda": (0.70, 0.60), "layers/lambda": (0.70, 0.61), "zero router": (0.7, 0.5)},
        {"probability": (0.50, 0.50), "layers": (0.52, 0.48)},
    ),
]


def test_each_router_is_compared_with_the_head_on_the_same_fold():
    paired = paired_differences(FOLDS)
    assert list(paired) == ["layers/lambda"]  # neither the head itself nor a reference
    record = paired["layers/lambda"]
    # per fold: AIQ +0.03 and +0.01, best +0.02 and 0.00, APGR +0.05 and +0.02, CPT(50%) -0.05 and -0.02
    assert record["folds"] == 2
    assert record["aiq"] == pytest.approx((0.02, 0.0141421356), abs=1e-9)
    assert record["best"] == pytest.approx((0.01, 0.0141421356), abs=1e-9)
    assert record["apgr"] == pytest.approx((0.035, 0.0212132034), abs=1e-9)
    assert record["cpt_50"] == pytest.approx((-0.035, 0.0212132034), abs=1e-9)


def test_the_table_prints_signed_differences_and_is_absent_without_a_second_router():
    lines = _paired_table(FOLDS)
    row = next(line for line in lines if line.startswith("| probability head + layer means"))
    assert "+0.0200 ± 0.0141" in row and "+0.035 ± 0.021" in row and "-3.5 ± 2.1 points" in row
    alone = [fold(0, {"probability/lambda": (0.8, 0.7), "zero router": (0.8, 0.6)}, {"probability": (0.6, 0.4)})]
    assert _paired_table(alone) == []
