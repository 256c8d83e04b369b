"""Batch planning: how routed queries are cut into batches by token budget (padded batches cut where
the padding saved outweighs another pass, packed ones filled by benchgen_router.packing), the checks on
the batching arguments, and the right-padded tensors of a padded batch."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from benchgen_router.errors import InputError
from benchgen_router.hardware import pass_cost_positions

DEFAULT_PADDED_BATCH = 16  # queries per padded batch (encoder backbones) unless the token budget is smaller


def check_batching(batch_size: Any, max_batch_tokens: Any) -> None:
    """Every batching argument is a positive integer or None, checked at the API (not only by argparse):
    a negative size would silently route nothing, and a zero budget would never finish planning."""
    for name, value in (("batch_size", batch_size), ("max_batch_tokens", max_batch_tokens)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise InputError(f"{name} must be a positive integer or None, got {value!r}.")


def plan_batches(
    lengths: Sequence[int],
    packed: bool,
    batch_size: int | None = None,
    max_batch_tokens: int = 2048,
    packing: Any = None,
    device: Any = "cpu",
) -> list[list[int]]:
    """Which queries (by index) go through the model together, longest first.

    Padded batches (`packed` False): runs of the length-sorted queries, at most `batch_size` (16 when
    None) and at most max_batch_tokens positions once padded (always at least one query). On a CPU
    they are cut where the padding saved outweighs another pass (padded_batches); on other devices,
    each is filled up to the cap (hardware.pass_cost_positions).
    Packed batches: as many queries as fill max_batch_tokens positions once benchgen_router.packing
    lays them out (rows as wide as the batch's longest query and at least PACK_WIDTH): each long
    query's row is topped up with short ones. `batch_size`, when given, also caps the queries per
    batch. `packing` is deprecated and ignored: the layout has one owner, benchgen_router.packing.
    """
    from benchgen_router.packing import pack_rows, row_width

    if packing is not None:
        warnings.warn(
            "plan_batches(packing=...) is deprecated and ignored: benchgen_router.packing owns the layout.",
            DeprecationWarning,
            stacklevel=2,
        )
    check_batching(batch_size, max_batch_tokens)
    remaining = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    if not packed:
        cap = batch_size or DEFAULT_PADDED_BATCH
        pass_cost = pass_cost_positions(device)
        if pass_cost is not None:
            return padded_batches(remaining, lengths, cap, max_batch_tokens, pass_cost)
        while remaining:
            size = max(1, min(cap, max_batch_tokens // max(1, lengths[remaining[0]])))
            batches.append(remaining[:size])
            remaining = remaining[size:]
        return batches
    while remaining:
        width = row_width([lengths[remaining[0]]])
        rows, left = pack_rows([lengths[i] for i in remaining], width, max_rows=max(1, max_batch_tokens // width))
        batch = sorted((remaining[j] for row in rows for j in row), key=lambda i: -lengths[i])
        over = batch[batch_size:] if batch_size else []
        batches.append(batch[: len(batch) - len(over)])
        remaining = sorted(over + [remaining[j] for j in left], key=lambda i: -lengths[i])
    return batches


def padded_batches(
    order: Sequence[int], lengths: Sequence[int], cap: int, max_batch_tokens: int, pass_cost: int
) -> list[list[int]]:
    """`order` (query indices, longest first) cut into consecutive batches of at most `cap` queries
    and max_batch_tokens padded positions (a lone query always fits), choosing the cuts that minimise
    padded positions plus `pass_cost` per batch: an exact dynamic programme over where the last batch
    starts, O(len(order) x cap)."""
    widths = [max(1, lengths[i]) for i in order]
    best = [0.0] + [float("inf")] * len(widths)  # best[end]: cost of batching order[:end]
    start_of = [0] * (len(widths) + 1)  # where the last batch of that best plan starts
    for end in range(1, len(widths) + 1):
        for start in range(end - 1, max(0, end - cap) - 1, -1):
            size = end - start
            if size > 1 and size * widths[start] > max_batch_tokens:  # widths[start]: the batch's longest
                break
            cost = best[start] + pass_cost + size * widths[start]
            if cost < best[end]:
                best[end], start_of[end] = cost, start
    batches: list[list[int]] = []
    end = len(widths)
    while end:
        batches.append(list(order[start_of[end] : end]))
        end = start_of[end]
    return batches[::-1]


def right_padded(encoded: Any, rows: Sequence[int], pad_token_id: int, device: Any) -> dict[str, Any]:
    """The tokenized queries `rows` as one right-padded batch of tensors (the tokenizer's own `pad`
    does the same in Python per query, and is slower)."""
    import torch

    width = max(len(encoded["input_ids"][i]) for i in rows)
    batch = {}
    for key in encoded:
        fill = pad_token_id if key == "input_ids" else 0
        values = [encoded[key][i] + [fill] * (width - len(encoded[key][i])) for i in rows]
        batch[key] = torch.tensor(values, dtype=torch.long, device=device)
    return batch
