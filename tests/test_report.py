"""report.py: the typed training report reads what it writes, keeps what it does not know, and
names the field of a malformed file."""

from __future__ import annotations

import json

import pytest

from benchgen_router.errors import InputError
from benchgen_router.release.report import REPORT_FILE, PointReport, TrainingReport, read_report

POINT = {
    "cost_weight": 0.2,
    "latency_weight": 0,
    "train_reward": 0.9,
    "cv": {"reward": 0.8, "reward_std_repeats": 0.01, "delta_reward": -0.01, "delta_se": 0.02,
           "cost_per_1k": 0.08, "latency_s": 8.0, "share": {"a": 1.0}, "cost_frontier": True},
    "ood_fallback_agent": "a",
}  # fmt: skip
STORED = {
    "model_id": "head-x",
    "n_train": 35,
    "test_reward": 0.7,
    "baselines": {"oracle": 0.9},
    "backbone_revision": None,  # written even when None, as the manifest schema has it
    "cross_validation": None,
    "operating_points": {"balanced": POINT},
    "ood_guard": {"threshold": 1.5, "fallback_agent": "a", "file": "ood_guard.safetensors", "keep_share": 0.95},
    "something_new": [1, 2],
}


def test_a_report_reads_back_what_it_wrote_with_unknown_keys_kept():
    report = TrainingReport.from_dict(STORED, "report")
    assert isinstance(report.operating_points["balanced"], PointReport)
    assert report.operating_points["balanced"].cv.cost_per_1k == 0.08 and report.ood_guard.keep_share == 0.95
    assert report.to_dict() == STORED  # the file's own keys and values, unknown ones included


def test_the_summary_is_what_a_config_keeps():
    summary = TrainingReport.from_dict(STORED, "report").summary()
    assert summary == {"model_id": "head-x", "n_train": 35, "test_reward": 0.7, "baselines": {"oracle": 0.9}}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"n_train": "35"}, r"report\.n_train is '35'"),
        ({"test_reward": True}, r"report\.test_reward is True"),
        ({"operating_points": {"balanced": {"cost_weight": 0.2}}}, r"report\.operating_points\.balanced lacks"),
        ({"operating_points": {"balanced": {**POINT, "cv": {"reward": 1}}}}, r"balanced\.cv lacks"),
        ({"ood_guard": [1]}, r"report\.ood_guard is a list"),
    ],
)
def test_a_malformed_report_names_the_field(change, message):
    with pytest.raises(InputError, match=message):
        TrainingReport.from_dict({**STORED, **change}, "report")


def test_a_report_file_is_read_with_its_name_in_errors(tmp_path):
    path = tmp_path / REPORT_FILE
    path.write_text(json.dumps({"n_test": 1.5}))
    with pytest.raises(InputError, match=r"training_report\.json\.n_test"):
        read_report(path)
    path.write_text(json.dumps(STORED))
    assert read_report(path).model_id == "head-x"
