"""The `finetuned` router of a routing-value benchmark: the probability head trained together with its
backbone's top layers on each fold's training rows only (training/finetune.py), early-stopped on a share of
those rows, and swept by the probability head's own rules.

Its head starts from the frozen probability head's fit on the fold's frozen embeddings (`Fold.embeddings`,
the same the `probability` router fits on), so a fold where no epoch beats the start routes exactly as the
`probability` router does: the same head over the same embeddings. The frozen lower layers' outputs depend
on the prompt alone, so they are computed once per prompt for the whole run (the first fold computes them
for every row) and every fold reuses them.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import numpy as np

from benchgen_router.bench.value.routers import Fitted, Fold
from benchgen_router.training.config import FinetuneSettings

logger = logging.getLogger("benchgen_router")

# What each fold trains, unless the run says otherwise: the top layer for at most 3 epochs, so that a
# benchmark of 10,000-row folds fits in hours on a few CPU cores (docs/training.md, fine-tuning's cost).
BENCH_SETTINGS = FinetuneSettings(epochs=3, layers=1, learning_rate=1e-4)
# (backbone, first trained layer) -> (row of each prompt, the lower layers' outputs of those rows)
_KEPT: dict[tuple[str, int], tuple[dict[str, int], Any]] = {}


def fit_finetuned(train: Fold, test: Fold, settings: dict[str, Any]) -> Fitted:
    """Fine-tune on `train`, predict each agent's probability on `test`."""
    from benchgen_router.loading import backbone_router
    from benchgen_router.training.finetune import finetune_probability, first_trained_layer

    chosen = settings.get("finetune")  # FinetuneSettings' fields, as ValueConfig keeps them
    tune = replace(FinetuneSettings(**chosen) if chosen else BENCH_SETTINGS, seed=settings["seed"])
    agents = [f"agent {j}" for j in range(train.rewards.shape[1])]
    router, tokenizer = backbone_router(settings["backbone"], agents)
    first = first_trained_layer(router, tune.layers)
    lower, row_of = kept_states(router, tokenizer, settings["backbone"], first, [*train.prompts, *test.prompts])
    train_rows = np.array([row_of[prompt] for prompt in train.prompts])
    tuned = finetune_probability(router, lower, train_rows, train.rewards, train.embeddings, tune)
    test_rows = np.array([row_of[prompt] for prompt in test.prompts])
    # epoch 0 kept: the frozen router, scored on the very embeddings the probability router reads
    embeddings = test.embeddings if tuned.best_epoch == 0 else tuned.embeddings(test_rows)
    probabilities = tuned.head.predict(embeddings)
    record = tuned.record()
    logger.info(
        "finetuned: %d training rows, kept epoch %d of %d run (validation loss %s), %.0f s",
        len(train_rows), record["best_epoch"], record["epochs_run"],
        ", ".join(f"{row['validation_loss']:.4f}" for row in record["history"]), record["seconds"]["training"],
    )  # fmt: skip
    return Fitted(probabilities=probabilities, details=record)


def kept_states(router: Any, tokenizer: Any, backbone: str, first: int, prompts: list[str]) -> tuple[Any, dict]:
    """The lower layers' outputs for `prompts` (LowerStates) and each prompt's row in it, computed only for
    prompts no earlier fold of this process brought."""
    from benchgen_router.training.finetune import tokenized_prompts
    from benchgen_router.training.finetune_states import LowerStates

    row_of, lower = _KEPT.get((backbone, first), ({}, None))
    missing = list(dict.fromkeys(prompt for prompt in prompts if prompt not in row_of))
    if missing:
        pad = tokenizer.pad_token_id or 0
        added = LowerStates.compute(router, tokenized_prompts(router, tokenizer, missing), first, pad)
        start = 0 if lower is None else len(lower.input_ids)
        row_of.update({prompt: start + i for i, prompt in enumerate(missing)})
        if lower is None:
            lower = added
        else:
            lower.extend(added)
        _KEPT[(backbone, first)] = (row_of, lower)
    return lower, row_of
