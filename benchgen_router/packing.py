"""Packed batches: a decoder backbone's queries laid several to a row, with no padding computed.

The one owner of the packed layout. `plan_batches` (batching.py) fills batches with `pack_rows`, and
`collate` lays each batch out for RouterModel.forward: queries back to back in rows, position ids
restarting at 0 for each query (and for a row's padded tail), and an attention mask that marks the
real tokens. The model pools with that mask and hands the backbone the position ids alone, so that
transformers' causal mask keeps each query to itself: every query gets the hidden states it gets alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Packed rows are at least this wide so that short queries share one; attention per row grows with
# its width, and at 256 it stays a few percent of the work.
PACK_WIDTH = 256


def pack_rows(lengths: Sequence[int], width: int, max_rows: int | None = None) -> tuple[list[list[int]], list[int]]:
    """First-fit decreasing: queries (indices into `lengths`), longest first, each into the first row of
    `width` positions with room. Returns (rows, left over: what fits in none of the first `max_rows`)."""
    rows: list[list[int]] = []
    room: list[int] = []
    left: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        slot = next((r for r, free in enumerate(room) if free >= lengths[index]), None)
        if slot is None and (max_rows is None or len(rows) < max_rows):
            rows.append([])
            room.append(width)
            slot = len(rows) - 1
        if slot is None:
            left.append(index)
            continue
        rows[slot].append(index)
        room[slot] -= lengths[index]
    return rows, left


def row_width(lengths: Sequence[int]) -> int:
    """The width of a batch's packed rows: its longest query, and at least PACK_WIDTH."""
    return max(PACK_WIDTH, *lengths)


def packed_layout(lengths: Sequence[int]) -> tuple[list[list[int]], int] | None:
    """(rows, width) of a batch packed, or None when packing would compute no fewer positions than
    padding it (queries of one length, or a single query)."""
    if len(lengths) < 2:
        return None
    width = row_width(lengths)
    rows, _ = pack_rows(lengths, width)
    return (rows, width) if len(rows) * width < len(lengths) * max(lengths) else None


def collate(
    ids: Sequence[Sequence[int]], pad_token_id: int, packed: bool, device: Any = None
) -> tuple[dict[str, Any], list[int]] | None:
    """(inputs for RouterModel.forward, the query behind each of its outputs) of a packed batch of token
    ids: input_ids, position_ids and attention_mask of shape (rows, width), queries in row-major order.
    None when `packed` is False or packing would not save positions: the caller pads the batch."""
    import torch

    lengths = [len(query) for query in ids]
    layout = packed_layout(lengths) if packed else None
    if layout is None:
        return None
    rows, width = layout
    input_ids = [[pad_token_id] * width for _ in rows]
    positions = [list(range(width)) for _ in rows]
    mask = [[0] * width for _ in rows]
    order = []
    for r, row in enumerate(rows):
        start = 0
        for query in row:
            end = start + lengths[query]
            input_ids[r][start:end] = ids[query]
            positions[r][start:end] = range(lengths[query])
            mask[r][start:end] = [1] * lengths[query]
            order.append(query)
            start = end
        positions[r][start:] = range(width - start)  # the padded tail restarts too: it sees only itself
    inputs = {
        "input_ids": torch.tensor(input_ids, dtype=torch.long, device=device),
        "position_ids": torch.tensor(positions, dtype=torch.long, device=device),
        "attention_mask": torch.tensor(mask, dtype=torch.long, device=device),
    }
    return inputs, order
