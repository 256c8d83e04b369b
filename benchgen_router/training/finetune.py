"""Fine-tuning the backbone with the probability head: `benchgen-router train --head-kind probability --finetune`.

    lower = LowerStates.compute(router, input_ids, first_trained, pad_id)      # finetune_states.py
    tuned = finetune_probability(router, lower, train_rows, rewards, frozen_embeddings, FinetuneSettings())
    tuned.head.predict(tuned.embeddings(test_rows))                             # each agent's probability

The loss is the probability head's own: each agent's binary cross-entropy on its correctness (rewards in
[0, 1] as soft labels), now minimised through the backbone as well. The head starts from the frozen
probability head's fit, so epoch 0 is the frozen router. A share of the training rows is held out for early
stopping: after each epoch (at most `epochs`) their loss is measured, training stops once it has not improved
for `patience` epochs, and the best epoch's weights are kept. When no epoch beats epoch 0, the result is the
frozen router itself (the head fitted on every training row). With `layers` set, only the top `layers` layers
(and whatever follows them, e.g. a final norm) train, over the lower layers' outputs computed once per
prompt; otherwise every weight of the backbone trains. Batches are length-sorted (little padding computed)
and visited in a seeded order; on one thread a seed gives the same weights run after run.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from benchgen_router.errors import setting_error
from benchgen_router.training.config import FinetuneSettings, check_finetune_settings
from benchgen_router.training.finetune_states import LayerStack, LowerStates, check_replay, pooled
from benchgen_router.training.probability import ProbabilityHead, feature_scaling, fit_probability_head

logger = logging.getLogger("benchgen_router")

GRADIENT_CLIP = 1.0  # the usual bound for fine-tuning a transformer: one odd batch cannot undo an epoch
SCALE_FLOOR = 0.1  # the least feature scale of the trained head, as a share of the median feature's


def first_trained_layer(router: Any, layers: int | None) -> int:
    """The index of the lowest trained layer: 0 when every layer trains, else the backbone's layer count less
    `layers` (one line when the backbone has fewer)."""
    if layers is None:
        return 0
    count = LayerStack.of(router.backbone).count
    if layers > count:
        raise setting_error(
            f"{{finetune_layers}} {layers} is more than the backbone's {count} layers; pass at most {count}, or leave "
            "it unset to train every layer."
        )
    return count - layers


def tokenized_prompts(router: Any, tokenizer: Any, prompts: list[str]) -> list[list[int]]:
    """Each prompt's token ids as routing tokenizes it (routing.Router.tokenize: the router's truncation)."""
    from benchgen_router.routing import EmptyQueryError, Router

    tokenized = Router(router, tokenizer).tokenize(prompts)
    if tokenized.empty:
        raise EmptyQueryError(tokenized.empty)
    return [list(ids) for ids in tokenized.encoded["input_ids"]]


@dataclass
class Finetuned:
    """A fine-tuned router: `router` (RouterModel) holds the trained backbone and head, `head` the same
    head as a ProbabilityHead; `best_epoch` 0 means no epoch beat the frozen router, which this then is."""

    router: Any
    lower: LowerStates
    head: ProbabilityHead
    settings: FinetuneSettings
    best_epoch: int
    history: list[dict[str, float]]
    rows: dict[str, int] = field(default_factory=dict)  # training rows fitted and held out for early stopping
    seconds: dict[str, float] = field(default_factory=dict)

    def embeddings(self, rows: np.ndarray) -> np.ndarray:
        """(len(rows), D) float32 embeddings of the lower states' `rows` by the trained backbone."""
        return _embeddings(self.router, self.lower, np.asarray(rows), self.settings.batch_size)

    def record(self) -> dict[str, Any]:
        """What the run's report keeps: the settings, the epochs run, the best one and the time taken."""
        return {
            "method": "backbone and probability head trained together on each agent's binary cross-entropy",
            "settings": asdict(self.settings),
            "trained_layers": self.settings.layers or "all",
            "best_epoch": self.best_epoch,
            "epochs_run": len(self.history) - 1,
            "rows": self.rows,
            "history": self.history,
            "seconds": {key: round(value, 3) for key, value in self.seconds.items()},
        }


class StandardisedHead(torch.nn.Module):
    """The probability head as its fit sees it: logits = ((e - mean) / scale) @ W.T + b over the frozen fit
    rows' feature scaling (fixed, floored), with each agent's L2 strength (the fit's objective), so that a
    learning rate means the same for every feature; `folded()` is the plain linear layer the router serves
    with."""

    def __init__(self, head: ProbabilityHead, mean: np.ndarray, scale: np.ndarray) -> None:
        super().__init__()
        weight, bias = head.weight.astype(np.float64).copy(), head.bias.astype(np.float64).copy()
        # A feature nearly constant over the fit rows (all-MiniLM-L6-v2 has one, std 1e-9) can carry a huge
        # weight that costs nothing while it stays constant; the trained backbone's smallest change to it (dropout
        # alone) would then swamp the logits. Its weight goes into the bias at its mean, and it trains from 0 at
        # a floored scale.
        floor = SCALE_FLOOR * np.median(scale)
        constant = scale < floor
        bias += weight[:, constant] @ mean[constant]
        weight[:, constant] = 0.0
        scale = np.maximum(scale, floor)
        self.weight = torch.nn.Parameter(torch.from_numpy((weight * scale).astype(np.float32)))
        self.bias = torch.nn.Parameter(torch.from_numpy((bias + weight @ mean).astype(np.float32)))
        self.register_buffer("mean", torch.from_numpy(mean.astype(np.float32)))
        self.register_buffer("scale", torch.from_numpy(scale.astype(np.float32)))
        self.register_buffer("strengths", torch.from_numpy(head.strengths.astype(np.float32)))

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        return ((embeddings - self.mean) / self.scale) @ self.weight.T + self.bias

    def objective(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The probability head's loss: per agent, the mean binary cross-entropy plus strength/2 * |w|^2."""
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, targets, reduction="none").mean(dim=0)
        return (loss + 0.5 * self.strengths * (self.weight**2).sum(dim=1)).sum()

    def folded(self, strengths: np.ndarray) -> ProbabilityHead:
        weight = self.weight.detach().double().numpy() / self.scale.double().numpy()
        bias = self.bias.detach().double().numpy() - weight @ self.mean.double().numpy()
        return ProbabilityHead(weight.astype(np.float32), bias.astype(np.float32), strengths)


def finetune_probability(
    router: Any,
    lower: LowerStates,
    rows: np.ndarray,
    rewards: np.ndarray,
    frozen: np.ndarray,
    settings: FinetuneSettings,
    progress: bool = False,
) -> Finetuned:
    """Train `router`'s backbone (its top layers over `lower`'s kept states, or all of it) and its head on
    `rows` of `lower` with `rewards` (len(rows), N) in [0, 1]; `frozen` (len(rows), D) are the frozen
    embeddings the head starts from. See the module docstring."""
    check_finetune_settings(settings)
    rows, rewards, frozen = np.asarray(rows), np.asarray(rewards, dtype=np.float64), np.asarray(frozen)
    if len(rows) < 4 or rewards.shape[0] != len(rows) or frozen.shape[0] != len(rows):
        raise setting_error(
            f"fine-tuning needs at least 4 training rows with one reward row and one embedding each, got {len(rows)} "
            f"rows, {rewards.shape[0]} reward rows and {frozen.shape[0]} embeddings."
        )
    rng = np.random.default_rng(settings.seed)
    order = rng.permutation(len(rows))
    held = order[: max(1, round(settings.validation_share * len(rows)))]
    fit = np.setdiff1d(np.arange(len(rows)), held)
    started = time.perf_counter()
    start_head = fit_probability_head(frozen[fit], rewards[fit], seed=settings.seed)
    head = StandardisedHead(start_head, *feature_scaling(np.asarray(frozen[fit], dtype=np.float64)))
    trained = [*_trainable_backbone(router, lower.first_trained), *head.parameters()]
    if lower.first_trained:
        check_replay(router, lower, rows[held[:8]])
    initial = _snapshot(trained)
    targets = torch.from_numpy(rewards.astype(np.float32))
    history, best = _train_epochs(router, head, lower, rows, fit, held, targets, trained, settings, rng, progress)
    seconds = {"training": time.perf_counter() - started}
    if best["epoch"] == 0:  # no epoch beat the frozen router: the frozen router it is, fitted on every row
        _restore(trained, initial)
        served = fit_probability_head(frozen, rewards, seed=settings.seed)
    else:
        _restore(trained, best["weights"])
        served = head.folded(start_head.strengths)
    _set_head(router, served)
    router.eval()
    for parameter in router.parameters():
        parameter.requires_grad_(False)
    split = {"fitted": len(fit), "validation": len(held)}
    return Finetuned(router, lower, served, settings, int(best["epoch"]), history, split, seconds)


def _train_epochs(
    router: Any,
    head: StandardisedHead,
    lower: LowerStates,
    rows: np.ndarray,
    fit: np.ndarray,
    held: np.ndarray,
    targets: torch.Tensor,
    trained: list[torch.nn.Parameter],
    settings: FinetuneSettings,
    rng: np.random.Generator,
    progress: bool,
) -> tuple[list[dict[str, float]], dict[str, Any]]:
    """Epochs until the budget or the patience runs out: (history, the best epoch and its weights)."""
    from tqdm.auto import tqdm

    position = {int(row): i for i, row in enumerate(rows)}
    steps = settings.epochs * math.ceil(len(fit) / settings.batch_size)
    optimiser = torch.optim.AdamW(trained, lr=settings.learning_rate, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda step: max(0.0, 1.0 - step / steps))
    replaying = LayerStack.of(router.backbone).replaying(lower.first_trained) if lower.first_trained else None
    with torch.random.fork_rng(devices=[]), replaying or contextlib.nullcontext() as replay:
        torch.manual_seed(settings.seed)
        loss = _loss(router, head, lower, rows[held], targets[held], replay, settings.batch_size)
        history = [{"epoch": 0, "validation_loss": loss}]
        best = {"epoch": 0, "loss": loss, "weights": _snapshot(trained)}
        for epoch in range(1, settings.epochs + 1):
            started = time.perf_counter()
            router.backbone.train()
            total = 0.0
            batches = lower.length_batches(rows[fit], settings.batch_size, rng)
            for batch_rows in tqdm(batches, desc=f"fine-tuning epoch {epoch}", disable=not progress):
                logits = head(pooled(router, lower.batch(batch_rows), replay))
                step_loss = head.objective(logits, targets[[position[int(row)] for row in batch_rows]])
                optimiser.zero_grad()
                step_loss.backward()
                torch.nn.utils.clip_grad_norm_(trained, GRADIENT_CLIP)
                optimiser.step()
                schedule.step()
                total += step_loss.item() * len(batch_rows)
            loss = _loss(router, head, lower, rows[held], targets[held], replay, settings.batch_size)
            seconds = time.perf_counter() - started
            history.append(
                {"epoch": epoch, "training_loss": total / len(fit), "validation_loss": loss, "seconds": seconds}
            )
            logger.info(
                "fine-tuning epoch %d/%d: training objective %.4f, validation loss %.4f (epoch %d: %.4f), %.0f s",
                epoch, settings.epochs, total / len(fit), loss, best["epoch"], best["loss"], seconds,
            )  # fmt: skip
            if loss < best["loss"]:
                best = {"epoch": epoch, "loss": loss, "weights": _snapshot(trained)}
            elif epoch - best["epoch"] >= settings.patience:
                break
    return history, best


def _loss(
    router: Any,
    head: StandardisedHead,
    lower: LowerStates,
    rows: np.ndarray,
    targets: torch.Tensor,
    replay: Any,
    size: int,
) -> float:
    """The mean binary cross-entropy over `rows` and agents (dropout off, no gradients)."""
    router.backbone.eval()
    total = 0.0
    with torch.no_grad():
        order = {int(row): i for i, row in enumerate(rows)}
        for batch_rows in lower.length_batches(rows, size):
            logits = head(pooled(router, lower.batch(batch_rows), replay))
            wanted = targets[[order[int(row)] for row in batch_rows]]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, wanted, reduction="sum")
            total += float(loss) / targets.shape[1]
    return total / len(rows)


def _embeddings(router: Any, lower: LowerStates, rows: np.ndarray, size: int) -> np.ndarray:
    out = np.zeros((len(rows), router.config.embedding_dim), dtype=np.float32)
    order = {int(row): i for i, row in enumerate(rows)}
    router.eval()
    replaying = LayerStack.of(router.backbone).replaying(lower.first_trained) if lower.first_trained else None
    with torch.no_grad(), replaying or contextlib.nullcontext() as replay:
        for batch_rows in lower.length_batches(rows, size):
            vectors = pooled(router, lower.batch(batch_rows), replay)
            out[[order[int(row)] for row in batch_rows]] = vectors.numpy()
    return out


def _trainable_backbone(router: Any, first_trained: int) -> list[torch.nn.Parameter]:
    """The backbone's parameters that train (its top layers', or all of them), gradients on; the rest off."""
    for parameter in router.parameters():
        parameter.requires_grad_(False)
    if first_trained:
        trained = LayerStack.of(router.backbone).trained_parameters(first_trained)
    else:
        trained = list(router.backbone.parameters())
    for parameter in trained:
        parameter.requires_grad_(True)
    return trained


def _set_head(router: Any, head: ProbabilityHead) -> None:
    with torch.no_grad():
        router.head.weight.copy_(torch.from_numpy(np.asarray(head.weight, dtype=np.float32)))
        router.head.bias.copy_(torch.from_numpy(np.asarray(head.bias, dtype=np.float32)))


def _snapshot(parameters: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    return [copy.deepcopy(parameter.detach()) for parameter in parameters]


def _restore(parameters: list[torch.nn.Parameter], values: list[torch.Tensor]) -> None:
    with torch.no_grad():
        for parameter, value in zip(parameters, values, strict=True):
            parameter.copy_(value)


def train_finetuned(config: Any) -> Any:
    """`train --head-kind probability --finetune`: embed the prompts with the frozen backbone (the embedding
    cache) for the head's start, fine-tune on the training rows, then calibrate, report and write as
    train_probability does, with the trained backbone bundled into the exported router's model.safetensors."""
    import tempfile

    from benchgen_router.forms import QUERY_FORMATS
    from benchgen_router.loading import backbone_router
    from benchgen_router.model_code import canonical_query
    from benchgen_router.release.convert import write_release
    from benchgen_router.release.folder import check_output_folder
    from benchgen_router.training.config import check_config
    from benchgen_router.training.probability import FittedRun, write_probability_run
    from benchgen_router.training.run import TrainResult, backbone_embedder, read_training_data

    check_config(config)
    check_output_folder(config.export, overwrite=False)
    data, _, test, how, cost_data = read_training_data(config)
    rewards = np.asarray(data.rewards, dtype=np.float64)
    rules = QUERY_FORMATS[config.query_format]
    prompts = [canonical_query(prompt, rules) for prompt in data.prompts]
    started = time.perf_counter()
    embedded = backbone_embedder(config, data.agents)(prompts)
    timings = {"embedding_seconds": time.perf_counter() - started}
    settings = config.finetune_settings()
    router, tokenizer = backbone_router(
        config.backbone, data.agents, revision=config.backbone_revision, device=config.device,
        truncation_length=config.truncation_length,
    )  # fmt: skip
    started = time.perf_counter()
    first = first_trained_layer(router, settings.layers)
    input_ids = tokenized_prompts(router, tokenizer, prompts)
    lower = LowerStates.compute(router, input_ids, first, tokenizer.pad_token_id or 0, settings.batch_size)
    timings["lower_layers_seconds"] = time.perf_counter() - started
    train_rows = np.flatnonzero(~test)
    frozen = embedded.vectors[train_rows]
    tuned = finetune_probability(
        router, lower, train_rows, rewards[train_rows], frozen, settings, progress=not config.no_progress
    )
    timings["finetune_seconds"] = tuned.seconds["training"]
    embeddings = tuned.embeddings(np.arange(len(prompts)))
    fitted = FittedRun(data, test, how, cost_data, tuned.head, embeddings, embedded.truncation_length, timings)
    report, manifest, release = write_probability_run(config, fitted, {"finetune": tuned.record()})
    with tempfile.TemporaryDirectory(prefix="benchgen-finetuned-backbone-") as trained_backbone:
        router.backbone.save_pretrained(trained_backbone)  # the trained weights, read back by the bundling writer
        tokenizer.save_pretrained(trained_backbone)
        write_release(
            release,
            config.export,
            backbone=trained_backbone,
            backbone_revision=config.backbone_revision,
            backbone_id=config.backbone_id,
            bundle=True,
            card_note=finetune_card_note(config.backbone_id, tuned, config.card_note),
        )
    return TrainResult(report=report, manifest=manifest, head=tuned.head, finetuned=tuned)


def finetune_card_note(backbone: str, tuned: Finetuned, note: str | None) -> str:
    """The card's word on the trained backbone, before the user's own note."""
    layers = f"its top {tuned.settings.layers} layers" if tuned.settings.layers else "every layer"
    if tuned.best_epoch:
        said = (
            f"The backbone is `{backbone}` with {layers} fine-tuned together with the head on each agent's binary "
            f"cross-entropy ({tuned.best_epoch} epochs kept of {len(tuned.history) - 1} run, early-stopped on "
            "held-out training rows); `model.safetensors` carries the trained weights."
        )
    else:
        said = (
            f"Fine-tuning `{backbone}` ({layers}) improved no epoch on the held-out training rows, so this router "
            "keeps the frozen backbone and the head fitted on it."
        )
    return said + (f"\n\n{note.strip()}" if note and note.strip() else "")


def finetune_summary(record: dict[str, Any]) -> str:
    """What `train --finetune` prints after the probability head's summary."""
    losses = ", ".join(f"{row['validation_loss']:.4f}" for row in record["history"])
    return (
        f"fine-tuned {record['trained_layers']} layer(s): kept epoch {record['best_epoch']} of {record['epochs_run']} "
        f"run (validation loss by epoch, from the frozen start: {losses}); {record['seconds']['training']:.0f} s"
    )
