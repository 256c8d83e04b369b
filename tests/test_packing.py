"""packing.py: the packed layout's one owner (first-fit rows, the collator's ids, positions and mask)."""

from __future__ import annotations

import torch

from benchgen_router.packing import PACK_WIDTH, collate, pack_rows, packed_layout


def test_collate_lays_queries_back_to_back_with_positions_restarting_and_the_tail_masked():
    ids = [[7] * 200, [8] * 40, [9] * 30, [6] * 100]
    inputs, order = collate(ids, pad_token_id=0, packed=True)
    # first-fit decreasing into rows of PACK_WIDTH (256): [200, 40] and [100, 30]
    assert order == [0, 1, 3, 2] and inputs["input_ids"].shape == (2, PACK_WIDTH)
    row = inputs["input_ids"][0]
    assert row[:200].eq(7).all() and row[200:240].eq(8).all() and row[240:].eq(0).all()
    positions = inputs["position_ids"][0].tolist()
    assert positions[:200] == list(range(200)) and positions[200:240] == list(range(40))
    assert positions[240:] == list(range(16))  # the padded tail restarts too: it sees only itself
    assert inputs["attention_mask"].sum(dim=1).tolist() == [240, 130]
    starts = ((inputs["position_ids"] == 0) & inputs["attention_mask"].bool()).sum().item()
    assert starts == len(ids) and inputs["input_ids"].dtype == torch.long


def test_collate_pads_when_packing_would_save_nothing():
    assert collate([[1, 2, 3]] * 4, 0, packed=True) is None  # one length: rows as wide as the padded batch
    assert collate([[1], [2, 3]], 0, packed=False) is None
    assert collate([[1, 2]], 0, packed=True) is None  # a single query
    assert packed_layout([300, 10, 5]) == ([[0], [1, 2]], 300)  # rows as wide as the longest query


def test_pack_rows_leaves_over_what_fits_in_no_allowed_row():
    assert pack_rows([5, 5, 5], 10, max_rows=1) == ([[0, 1]], [2])
