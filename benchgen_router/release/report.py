"""The training report: everything a run measured, typed, and stored as training_report.json.

A router folder's config.json keeps what loading and routing need plus a short summary; the report
beside it keeps the full provenance (CV frontier, operating points' figures, the guard's
calibration, search histories). The trainer builds one, the manifest and the report file are its
JSON, and the model card is rendered from it. Reading JSON back checks every known field's type
once, here, so that readers of the typed report never re-check.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Union, get_args, get_origin, get_type_hints

from benchgen_router.errors import InputError
from benchgen_router.files import read_json
from benchgen_router.frontier.cv import FrontierResult
from benchgen_router.frontier.report import frontier_from_dict, frontier_to_dict
from benchgen_router.manifest import REFERENCE_KEYS, STRUCTURE_KEYS

REPORT_FILE = "training_report.json"
# What config.json keeps of the report: the reference trainer's summary figures, a few hundred bytes.
SUMMARY_KEYS = tuple(key for key in REFERENCE_KEYS if key not in (*STRUCTURE_KEYS, "history"))


def _accepts(value: Any, hint: Any) -> bool:
    """Whether a JSON value fits a field's annotation (a float field takes an int; bool is not a number)."""
    options = get_args(hint) if get_origin(hint) in (Union, types.UnionType) else (hint,)
    for option in options:
        kind = get_origin(option) or option
        if option is type(None) and value is None:
            return True
        if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
            return math.isfinite(value)  # JSON has no spelling for NaN or infinities
        if kind is int and isinstance(value, int) and not isinstance(value, bool):
            return True
        if kind in (str, bool, dict, list) and isinstance(value, kind):
            return True
    return False


@dataclass
class Record:
    """A JSON object with typed known fields; keys it does not know are kept in `extra`, unchanged."""

    # Fields whose JSON is converted to a typed value: field -> (from JSON, to JSON).
    CONVERTED: ClassVar[dict[str, tuple[Callable[[Any, str], Any], Callable[[Any], Any]]]] = {}
    KEEP_NONE: ClassVar[frozenset[str]] = frozenset()  # optional fields written even when None

    @classmethod
    def from_dict(cls, data: Any, where: str, dropped: list[str] | None = None) -> Any:
        """The record of a JSON object. With `dropped`, a malformed optional field is left out and
        its problem appended there, instead of refusing the whole object."""
        if not isinstance(data, dict):
            raise InputError(f"{where} is a {type(data).__name__}, not a JSON object.")
        hints = get_type_hints(cls)
        optional = {item.name for item in fields(cls) if not _required(item)}
        names = {item.name for item in fields(cls)} - {"extra"}
        known: dict[str, Any] = {}
        for name in sorted(names & set(data)):
            value = data[name]
            try:
                if name in cls.CONVERTED and value is not None:
                    value = cls.CONVERTED[name][0](value, f"{where}.{name}")
                elif not _accepts(value, hints[name]):
                    raise InputError(
                        f"{where}.{name} is {value!r}, not a {hints[name]}; pass the file the trainer wrote."
                    )
            except InputError as err:
                if dropped is None or name not in optional:
                    raise
                dropped.append(str(err))
                continue
            known[name] = value
        missing = sorted(item.name for item in fields(cls) if _required(item) and item.name not in known)
        if missing:
            raise InputError(f"{where} lacks {', '.join(missing)}; pass the file the trainer wrote.")
        return cls(**known, extra={key: value for key, value in data.items() if key not in names})

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if item.name == "extra" or (value is None and not _required(item) and item.name not in self.KEEP_NONE):
                continue
            if item.name in self.CONVERTED and value is not None:
                value = self.CONVERTED[item.name][1](value)
            out[item.name] = value
        return {**out, **self.extra}


def _required(item: Any) -> bool:
    return item.default is MISSING and item.default_factory is MISSING


def _nested(record: type[Record]) -> tuple[Callable[[Any, str], Any], Callable[[Any], Any]]:
    return record.from_dict, lambda value: value.to_dict()


def _nested_map(record: type[Record]) -> tuple[Callable[[Any, str], Any], Callable[[Any], Any]]:
    def read(value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise InputError(f"{where} is a {type(value).__name__}, not a JSON object.")
        return {name: record.from_dict(entry, f"{where}.{name}") for name, entry in value.items()}

    return read, lambda value: {name: entry.to_dict() for name, entry in value.items()}


def _frontier(value: Any, where: str) -> FrontierResult:
    if not isinstance(value, dict):
        raise InputError(f"{where} is a {type(value).__name__}, not a JSON object.")
    return frontier_from_dict(value)


@dataclass
class CrossValidation(Record):
    """The k-fold cross-validation of a run without per-call costs (training.cross_validate)."""

    folds: int
    router_mean: float
    router_std: float
    best_fixed_mean: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class PointFigures(Record):
    """One policy's cross-validated figures (frontier.CVPoint's statistics)."""

    reward: float
    reward_std_repeats: float
    delta_reward: float
    delta_se: float
    cost_per_1k: float
    latency_s: float
    share: dict[str, float]
    reward_std_folds: float | None = None
    cost_std_repeats: float | None = None
    latency_std_repeats: float | None = None
    cost_frontier: bool | None = None
    latency_frontier: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class PointReport(Record):
    """An operating point: the trade-off its head was trained for and what it reached."""

    cost_weight: float
    latency_weight: float
    train_reward: float | None = None
    held_out: dict[str, Any] | None = None
    cv: PointFigures | None = None
    cv_plain: PointFigures | None = None  # the same heads, scored on the tasks as users type them
    ood_fallback_agent: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    CONVERTED: ClassVar[dict[str, tuple[Callable[[Any, str], Any], Callable[[Any], Any]]]] = {
        "cv": _nested(PointFigures),
        "cv_plain": _nested(PointFigures),
    }


@dataclass
class GuardReport(Record):
    """How the out-of-distribution guard was fitted and calibrated, and what it measured."""

    threshold: float
    fallback_agent: str
    score: str | None = None
    fallback_rule: str | None = None
    keep_share: float | None = None
    plain_keep_share: float | None = None
    n_fit: int | None = None
    n_calibration: int | None = None
    n_outside: int | None = None
    calibration_kept_share: float | None = None
    plain_calibration_kept_share: float | None = None
    plain_questions_kept_share: float | None = None
    labelled_formatted_flagged_share: float | None = None
    labelled_plain_flagged_share: float | None = None
    evaluation: dict[str, Any] | None = None  # AUROC and flagged share per OOD group
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrainingReport(Record):
    """A run's provenance: the reference trainer's figures and what this project's trainer adds."""

    model_id: str | None = None
    backbone_model: str | None = None
    backbone_revision: str | None = None
    rewards_dataset: str | None = None
    n_head_params: int | None = None
    n_total: int | None = None
    n_train: int | None = None
    n_test: int | None = None
    held_out: str | None = None
    train_reward: float | None = None
    test_reward: float | None = None
    baselines: dict[str, float] | None = None
    beats_best_fixed_agent: bool | None = None
    cma_generations_run: int | None = None
    history: list[Any] | None = None
    duration_seconds: float | None = None
    truncation_length: int | None = None
    evaluation: dict[str, Any] | None = None
    cross_validation: CrossValidation | None = None
    cma: dict[str, Any] | None = None
    timings: dict[str, float] | None = None
    operating_points: dict[str, PointReport] = field(default_factory=dict)
    default_operating_point: str | None = None
    frontier: FrontierResult | None = None
    target_mode: dict[str, Any] | None = None
    ood_guard: GuardReport | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    CONVERTED: ClassVar[dict[str, tuple[Callable[[Any, str], Any], Callable[[Any], Any]]]] = {
        "ood_guard": _nested(GuardReport),
        "cross_validation": _nested(CrossValidation),
        "operating_points": _nested_map(PointReport),
        "frontier": (_frontier, frontier_to_dict),
    }
    KEEP_NONE: ClassVar[frozenset[str]] = frozenset({"cross_validation", "backbone_revision"})

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        if not self.operating_points:  # a one-head run records none
            out.pop("operating_points")
        return out

    def summary(self) -> dict[str, Any]:
        """What config.json keeps (SUMMARY_KEYS that the run recorded)."""
        return {key: value for key, value in self.to_dict().items() if key in SUMMARY_KEYS}


def read_report(path: Path) -> TrainingReport:
    """A router folder's training_report.json."""
    return TrainingReport.from_dict(read_json(path, "training report"), path.name)
