"""Import paths that moved keep working until the next minor version: each old path warns once, naming
the new one and pointing at the importer's line, and gives the new module's own objects."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

# (old module, new module, a name read through the old one)
MOVED = [
    ("benchgen_router.trainer", "benchgen_router.training", "TrainConfig"),
    ("benchgen_router.trainer", "benchgen_router.training", "train"),
    ("benchgen_router.trainer.config", "benchgen_router.training.config", "TrainConfig"),
    ("benchgen_router.trainer.run", "benchgen_router.training.run", "train"),
    ("benchgen_router.trainer.guard", "benchgen_router.training.guard", "fit_task_guard"),
    ("benchgen_router.trainer.probability", "benchgen_router.training.probability", "fit_probability_head"),
    ("benchgen_router.trainer.summary", "benchgen_router.training.summary", "run_summary"),
    ("benchgen_router.evaluator", "benchgen_router.evaluation.run", "evaluate"),
    ("benchgen_router.evaluator", "benchgen_router.evaluation.run", "EvaluateConfig"),
    ("benchgen_router.collect.upstream", "benchgen_router.collect.chat", "ask"),
    ("benchgen_router.collect.upstream", "benchgen_router.collect.chat", "RetryPolicy"),
    ("benchgen_router.convert", "benchgen_router.release.convert", "convert_release"),
    ("benchgen_router.folder", "benchgen_router.release.folder", "write_router_folder"),
    ("benchgen_router.card", "benchgen_router.release.card", "render_card"),
    ("benchgen_router.report", "benchgen_router.release.report", "TrainingReport"),
]

# What `benchgen_router.training` exported when it was the search module alone: still there, with no warning.
SEARCH_NAMES = [
    "CMA_LIBRARIES",
    "DEFAULT_CMA_LIBRARY",
    "MAX_SEED",
    "MIN_POPSIZE",
    "SearchResult",
    "check_search_settings",
    "cross_validate",
    "fitness",
    "picked_rewards",
    "population_picks",
    "search_head",
    "search_heads",
]


@pytest.mark.parametrize(("old", "new", "name"), MOVED, ids=[f"{old}.{name}" for old, _, name in MOVED])
def test_old_path_warns_and_gives_the_new_object(old: str, new: str, name: str) -> None:
    sys.modules.pop(old, None)  # an earlier test may have imported it: import it afresh, so it warns again
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        __import__(old)  # no importlib frame of its own: the warning must point at this file
        value = getattr(sys.modules[old], name)
    ours = [w for w in caught if str(w.message).startswith(f"{old} moved to {new};")]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert issubclass(ours[0].category, DeprecationWarning)
    assert "0.4.0" in str(ours[0].message)
    assert ours[0].filename == __file__
    assert value is getattr(importlib.import_module(new), name)


def test_an_old_path_lacks_what_the_new_one_lacks() -> None:
    with pytest.warns(DeprecationWarning):
        sys.modules.pop("benchgen_router.trainer", None)
        old = importlib.import_module("benchgen_router.trainer")
    with pytest.raises(AttributeError, match="no_such_name"):
        old.no_such_name  # noqa: B018


# What `benchgen_router.evaluation` exported when it was the metrics module alone.
METRICS_NAMES = ["baselines", "evaluate_picks", "format_cross_validation", "format_evaluation"]


@pytest.mark.parametrize("name", SEARCH_NAMES)
def test_training_still_exports_the_search_without_a_warning(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        training = importlib.import_module("benchgen_router.training")
        search = importlib.import_module("benchgen_router.training.search")
        assert getattr(training, name) is getattr(search, name)
        assert name in training.__all__


@pytest.mark.parametrize("name", METRICS_NAMES)
def test_evaluation_still_exports_the_metrics_without_a_warning(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        evaluation = importlib.import_module("benchgen_router.evaluation")
        metrics = importlib.import_module("benchgen_router.evaluation.metrics")
        assert getattr(evaluation, name) is getattr(metrics, name)
        assert name in evaluation.__all__


def test_the_package_itself_imports_no_moved_path() -> None:
    """Every module of the package imports without a warning from a moved path: moved paths are for
    users' code, never the package's own."""
    import pkgutil

    import benchgen_router

    old_paths = {old for old, _, _ in MOVED}
    modules = [
        info.name
        for info in pkgutil.walk_packages(benchgen_router.__path__, "benchgen_router.")
        if info.name not in old_paths and not info.name.endswith("__main__")
    ]
    assert "benchgen_router.release.convert" in modules and len(modules) > 50
    for name in old_paths:
        sys.modules.pop(name, None)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=r"benchgen_router\..* moved to ", category=DeprecationWarning)
        for name in modules:
            importlib.import_module(name)
    assert not old_paths & set(sys.modules), sorted(old_paths & set(sys.modules))


# The modules a query passes through, from loading a router to its decision (and the service around it).
INFERENCE_PATH = (
    "routing",
    "batching",
    "loading",
    "embeddings",
    "tradeoffs",
    "files",
    "packing",
    "hardware",
    "model_code",
)


def test_the_inference_path_imports_nothing_from_training() -> None:
    """Routing, serving and the trade-off rules never import the trainer, at the top of a module or inside
    a function: it would close a circle (embeddings -> routing -> training -> embeddings) and load the
    training code into every service replica."""
    import ast
    from pathlib import Path

    import benchgen_router

    package = Path(benchgen_router.__file__).parent
    files = [package / f"{name}.py" for name in INFERENCE_PATH] + sorted((package / "serving").glob("*.py"))
    offenders = []
    for file in files:
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            offenders += [f"{file.name}: {name}" for name in names if name.startswith("benchgen_router.training")]
    assert not offenders
