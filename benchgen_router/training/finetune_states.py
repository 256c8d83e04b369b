"""Training only a backbone's top layers: the frozen lower layers run once per prompt, their outputs are kept,
and every later pass (each epoch, the validation, the held-out scores) runs the top layers alone over them.

    stack = LayerStack.of(router.backbone)                 # where the embedding and the layers are
    states = LowerStates.compute(router, tokenized, first_trained=5)
    with stack.replaying(first_trained=5) as replay:        # the lower layers are skipped
        replay.states = states.batch(rows)                 # the input of layer 5, right-padded
        pooled = router._embed(input_ids, mask, token_type_ids, False)[0]

How: a pre-hook on the first trained layer takes its input and stops the pass (the lower layers' outputs,
computed once); while replaying, the backbone's embedding module is swapped for one that returns the kept
states and its layer list for its top layers, so the backbone's own forward builds the masks and positions
as it always does. BERT-style encoders (`embeddings`, `encoder.layer`) and Llama-style decoders
(`embed_tokens`, `layers`: Qwen, Llama, Mistral) are laid out so; `check_replay` compares the replayed
embeddings with the whole backbone's, so a backbone that transforms its embedding output before the first
layer (Gemma scales it) is refused rather than trained on wrong inputs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from benchgen_router.errors import setting_error

# (embedding module, layer list) attribute paths, BERT-style encoders first.
LAYOUTS = (("embeddings", "encoder.layer"), ("embed_tokens", "layers"))
# How far the replayed embeddings may be from the whole backbone's (float32, same inputs, other batching).
REPLAY_TOLERANCE = 1e-4


class _StopPass(Exception):
    """Raised by the capture hook: the layers above the first trained one are not needed."""


def _resolve(module: Any, path: str) -> tuple[Any, str, Any] | None:
    """(owner, attribute, value) of a dotted attribute path, or None where the module has no such path."""
    owner = module
    *parents, name = path.split(".")
    for parent in parents:
        owner = getattr(owner, parent, None)
        if owner is None:
            return None
    value = getattr(owner, name, None)
    return None if value is None else (owner, name, value)


@dataclass
class LayerStack:
    """Where a backbone keeps its embedding module and its list of layers."""

    backbone: Any
    embedding: tuple[Any, str, Any]
    layers: tuple[Any, str, Any]

    @classmethod
    def of(cls, backbone: Any) -> LayerStack:
        for embedding_path, layers_path in LAYOUTS:
            embedding, layers = _resolve(backbone, embedding_path), _resolve(backbone, layers_path)
            if embedding is not None and layers is not None and isinstance(layers[2], nn.ModuleList):
                return cls(backbone, embedding, layers)
        raise setting_error(
            f"{{finetune_layers}} trains the top layers of a BERT-style encoder (embeddings, encoder.layer) or a "
            f"Llama-style decoder (embed_tokens, layers); {type(backbone).__name__} has neither: train every layer "
            "(leave {finetune_layers} unset)."
        )

    @property
    def count(self) -> int:
        return len(self.layers[2])

    def trained_parameters(self, first_trained: int) -> list[Any]:
        """The parameters of the layers from `first_trained` up, and of whatever follows them (a final norm)."""
        below = {id(p) for p in self.embedding[2].parameters()}
        for layer in list(self.layers[2])[:first_trained]:
            below |= {id(p) for p in layer.parameters()}
        return [p for p in self.backbone.parameters() if id(p) not in below]

    def capture_hook(self, first_trained: int, sink: list[Any]) -> Any:
        """A pre-hook on layer `first_trained` that keeps its input hidden states in `sink` and stops the pass."""

        def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            sink.append(args[0] if args else kwargs["hidden_states"])
            raise _StopPass

        return self.layers[2][first_trained].register_forward_pre_hook(hook, with_kwargs=True)

    @contextlib.contextmanager
    def replaying(self, first_trained: int) -> Iterator[Replay]:
        """The backbone with its embedding module returning `replay.states` and only its layers from
        `first_trained` up; restored on leaving."""
        owner, name, embedding = self.embedding
        layers_owner, layers_name, layers = self.layers
        replay = Replay()
        setattr(owner, name, replay)
        setattr(layers_owner, layers_name, nn.ModuleList(list(layers)[first_trained:]))
        try:
            yield replay
        finally:
            setattr(owner, name, embedding)
            setattr(layers_owner, layers_name, layers)


class Replay(nn.Module):
    """Stands in for the backbone's embedding module: returns the kept input of the first trained layer."""

    def __init__(self) -> None:
        super().__init__()
        self.states: torch.Tensor | None = None

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor | None:
        return self.states


@dataclass
class Batch:
    """Right-padded model inputs for some rows, and (over kept states) the first trained layer's input."""

    rows: np.ndarray
    input_ids: Any
    attention_mask: Any
    token_type_ids: Any
    states: Any = None


class LowerStates:
    """Each prompt's token ids and, with `first_trained` > 0, the input of that layer (float32, one
    (tokens, hidden) tensor per prompt), computed once by the frozen lower layers."""

    def __init__(self, input_ids: list[list[int]], states: list[Any] | None, first_trained: int, pad_id: int):
        self.input_ids = input_ids
        self.states = states
        self.first_trained = first_trained
        self.pad_id = pad_id

    def extend(self, other: LowerStates) -> None:
        """Append `other`'s prompts (computed by the same lower layers) after these."""
        if other.first_trained != self.first_trained:
            raise ValueError(f"states below layer {other.first_trained} cannot join states below {self.first_trained}")
        self.input_ids = self.input_ids + other.input_ids
        if self.states is not None:
            self.states = self.states + other.states

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(ids) for ids in self.input_ids])

    @classmethod
    def compute(
        cls, router: Any, input_ids: list[list[int]], first_trained: int, pad_id: int, batch_size: int = 32
    ) -> LowerStates:
        """Run the frozen layers below `first_trained` over every prompt (length-sorted batches, no gradients)."""
        lower = cls(input_ids, None, first_trained, pad_id)
        if first_trained == 0:
            return lower
        stack = LayerStack.of(router.backbone)
        kept: list[Any] = [None] * len(input_ids)
        sink: list[Any] = []
        handle = stack.capture_hook(first_trained, sink)
        was_training = router.backbone.training
        router.backbone.eval()
        try:
            with torch.no_grad():
                for rows in lower.length_batches(np.arange(len(input_ids)), batch_size):
                    batch = lower.batch(rows)
                    with contextlib.suppress(_StopPass):
                        router._embed(batch.input_ids, batch.attention_mask, batch.token_type_ids, False)
                    hidden = sink.pop().to(torch.float32)
                    for position, row in enumerate(rows):
                        kept[row] = hidden[position, : len(input_ids[row])].clone()
        finally:
            handle.remove()
            router.backbone.train(was_training)
        lower.states = kept
        return lower

    def length_batches(self, rows: np.ndarray, batch_size: int, rng: np.random.Generator | None = None) -> list:
        """`rows` sorted by length (longest first, ties by row) and cut into batches of `batch_size`, so that
        little padding is computed; with `rng`, the batches in a shuffled order."""
        lengths = self.lengths[rows]
        ordered = np.asarray(rows)[np.lexsort((np.asarray(rows), -lengths))]
        batches = [ordered[start : start + batch_size] for start in range(0, len(ordered), batch_size)]
        if rng is not None:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def batch(self, rows: Sequence[int]) -> Batch:
        """The rows as one right-padded batch, with their kept states zero-padded to the same width."""
        rows = np.asarray(rows)
        width = max(len(self.input_ids[row]) for row in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for position, row in enumerate(rows):
            tokens = self.input_ids[row]
            ids[position, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            mask[position, : len(tokens)] = 1
        states = None
        if self.states is not None:
            dim = self.states[rows[0]].shape[-1]
            states = torch.zeros((len(rows), width, dim), dtype=torch.float32)
            for position, row in enumerate(rows):
                states[position, : len(self.input_ids[row])] = self.states[row]
        return Batch(rows, ids, mask, torch.zeros_like(ids), states)


def pooled(router: Any, batch: Batch, replay: Any = None) -> Any:
    """The batch's masked-mean embeddings through the router's own embedding path (RouterModel._embed), over
    the kept states when `replay` is given."""
    if replay is not None:
        replay.states = batch.states
    return router._embed(batch.input_ids, batch.attention_mask, batch.token_type_ids, False)[0]


def check_replay(router: Any, lower: LowerStates, rows: np.ndarray) -> None:
    """Refuse a backbone whose top layers, replayed over the kept states, do not give its own embeddings."""
    batch = lower.batch(rows)
    was_training = router.backbone.training
    router.backbone.eval()
    try:
        with torch.no_grad():
            whole = pooled(router, batch)
            with LayerStack.of(router.backbone).replaying(lower.first_trained) as replay:
                replayed = pooled(router, batch, replay)
    finally:
        router.backbone.train(was_training)
    gap = float((whole - replayed).abs().max() / whole.abs().max().clamp(min=1e-12))
    if not gap <= REPLAY_TOLERANCE:
        raise setting_error(
            f"this backbone's top layers over kept lower-layer states do not reproduce its embeddings (relative "
            f"gap {gap:.2g}): its forward transforms the states between layers; train every layer (leave "
            "{finetune_layers} unset)."
        )
