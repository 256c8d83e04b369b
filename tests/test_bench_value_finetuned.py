"""bench/value/finetuned.py: the `finetuned` router of a routing-value benchmark, fitted per fold on its training
rows, on a task the frozen embedding cannot route (helpers.order_task over helpers.build_bag_of_tokens)."""

from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np
import pytest

from benchgen_router.bench.value import OutcomeMatrix, ValueConfig, run_value_benchmark
from benchgen_router.bench.value import finetuned as module
from benchgen_router.bench.value.report import result_to_dict
from benchgen_router.bench.value.routers import fit_and_predict
from benchgen_router.hardware import one_thread
from benchgen_router.loading import backbone_router
from benchgen_router.routing import run_router
from benchgen_router.training.config import FinetuneSettings
from helpers import build_bag_of_tokens, order_task


@pytest.fixture(scope="module")
def benchmark(tmp_path_factory, tokenizer_dir):
    """(result, matrix) of a 2-fold benchmark, the probability head beside the finetuned router."""
    backbone = build_bag_of_tokens(tmp_path_factory.mktemp("bag") / "backbone", tokenizer_dir)
    prompts, leads = order_task()
    rows = len(prompts)
    rewards = np.stack([np.ones(rows), leads[:, 1]], axis=1)  # the cheap agent answers when "prime" comes second
    matrix = OutcomeMatrix(
        "order", ["strong", "cheap"], [f"t{i}" for i in range(rows)], prompts, [None] * rows, rewards,
        np.tile([1.0, 0.1], (rows, 1)),
    )  # fmt: skip
    router, tokenizer = backbone_router(str(backbone), matrix.agents)
    settings = asdict(FinetuneSettings(epochs=8, layers=1, learning_rate=1e-2, batch_size=16, patience=3))
    config = ValueConfig(
        folds=2, repeats=1, group_folds=0, routers=("probability", "finetuned"), backbone=str(backbone),
        finetune=settings, progress=False,
    )  # fmt: skip
    module._KEPT.clear()
    with one_thread():
        result = run_value_benchmark(matrix, config, lambda texts: run_router(router, tokenizer, texts)[1])
    return result, matrix


def test_each_fold_fine_tunes_on_its_training_rows_and_routes_what_the_frozen_head_cannot(benchmark) -> None:
    result, matrix = benchmark
    assert len(result.folds) == 2
    for fold in result.folds:
        details = fold.figures  # the two routers' curves, each swept by the same rules
        assert {"probability/lambda", "finetuned/lambda", "probability/tolerance", "finetuned/tolerance"} <= set(
            details
        )
        # RouteLLM's figures for both, on the same held-out rows: the frozen head no better than random, the tuned
        # one near the oracle (whose APGR here is 0.75: the gap closes once the half that needs it goes strong)
        gap = fold.gap["figures"]
        assert gap["probability"]["apgr"] < gap["random"]["apgr"] + 0.05
        assert gap["finetuned"]["apgr"] > gap["oracle"]["apgr"] - 0.05
        # the strong agent's accuracy at a share of its cost: only the tuned router sends the cheap half away
        assert fold.figures["finetuned/lambda"].share < fold.figures["probability/lambda"].share - 0.2
    # each fold trained on its own training rows (its fitted and early-stopping rows), never the held-out ones
    (row_of, lower) = next(iter(module._KEPT.values()))
    assert len(lower.input_ids) == len(row_of) == len(set(matrix.prompts))  # states computed once per prompt


def test_a_fold_trains_on_its_training_rows_only(benchmark, monkeypatch) -> None:
    """The rows a fold's fine-tuning reads are its training rows, with their rewards: none of the held-out ones."""
    result, matrix = benchmark
    seen = {}

    def spy(router, lower, rows, rewards, frozen, settings, progress=False):
        seen.update(rows=rows, rewards=rewards)
        return original(router, lower, rows, rewards, frozen, settings, progress)

    import benchgen_router.training.finetune as finetune

    original = finetune.finetune_probability
    monkeypatch.setattr(finetune, "finetune_probability", spy)
    train, test = np.arange(0, 240, 2), np.arange(1, 240, 2)
    prompts, rewards = np.asarray(matrix.prompts, dtype=object), matrix.rewards

    def fold(rows: np.ndarray) -> module.Fold:
        embeddings = np.zeros((len(rows), 32), np.float32)
        return module.Fold(embeddings, [None] * len(rows), rewards[rows], rewards[rows], prompts[rows])

    settings = {"seed": 0, "backbone": result.config.backbone, "finetune": asdict(FinetuneSettings(epochs=1, layers=1))}
    with one_thread():
        fitted = module.fit_finetuned(fold(train), fold(test), settings)
    row_of, _ = next(iter(module._KEPT.values()))
    assert sorted(seen["rows"]) == sorted(row_of[prompts[i]] for i in train)
    np.testing.assert_array_equal(seen["rewards"], rewards[train])
    assert fitted.probabilities.shape == (len(test), 2)
    assert fitted.details["rows"]["fitted"] + fitted.details["rows"]["validation"] == len(train)


def test_the_result_with_its_settings_is_plain_json(benchmark) -> None:
    """value.json keeps the run's settings, the finetuned router's among them."""
    result, _ = benchmark
    written = json.loads(json.dumps(result_to_dict(result)))
    assert written["settings"]["finetune"]["layers"] == 1 and written["settings"]["finetune"]["epochs"] == 8


def test_a_fold_that_keeps_epoch_0_routes_as_the_probability_router(benchmark) -> None:
    """No epoch better than the start (noise for labels): the frozen head over the frozen embeddings, exactly the
    probability router's own probabilities."""
    result, matrix = benchmark
    prompts = np.asarray(matrix.prompts, dtype=object)
    noise = np.random.default_rng(3).integers(0, 2, size=(len(prompts), 2)).astype(float)
    router, tokenizer = backbone_router(result.config.backbone, matrix.agents)
    with one_thread():
        embeddings = run_router(router, tokenizer, list(prompts))[1]
        rows = module.Fold(embeddings, [None] * len(prompts), noise, noise, prompts)
        tune = FinetuneSettings(epochs=3, layers=1, learning_rate=5e-2, batch_size=16, patience=1, seed=1)
        settings = {"seed": 1, "backbone": result.config.backbone, "finetune": asdict(tune)}
        tuned = module.fit_finetuned(rows, rows, settings)
        frozen = fit_and_predict("probability", rows, rows, settings)
    assert tuned.details["best_epoch"] == 0 and tuned.details["epochs_run"] == 1
    np.testing.assert_array_equal(tuned.probabilities, frozen.probabilities)
