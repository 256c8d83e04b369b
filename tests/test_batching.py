"""batching.py: batch planning (packed rows filled first-fit, padded batches cut at the least padding
plus pass cost on a CPU and filled up to the cap elsewhere, never over the token budget)."""

from __future__ import annotations

import itertools
import random

import pytest

from benchgen_router.batching import plan_batches
from benchgen_router.hardware import pass_cost_positions


def test_plan_batches_packs_short_queries_into_long_rows():
    lengths = [300, 10, 120, 130, 5, 250, 90]
    # Batch 1 is 300 wide (its longest query) with 600 // 300 = 2 rows, filled first-fit, longest
    # first ([0] and [5, 1, 4]); batch 2 is PACK_WIDTH (256) wide with 2 rows for the rest.
    assert plan_batches(lengths, packed=True, max_batch_tokens=600) == [
        [0, 5, 1, 4],
        [3, 2, 6],
    ]
    assert plan_batches(lengths, packed=True, batch_size=2, max_batch_tokens=600) == [
        [0, 5],
        [3, 2],
        [6, 1],
        [4],
    ]
    # one row per batch: each long query's row topped up with the longest short query that fits
    assert plan_batches(lengths, packed=True, max_batch_tokens=1) == [
        [0],
        [5, 4],
        [3, 2],
        [6, 1],
    ]
    # padded: length-sorted, cut where the padding saved is worth a pass (300 and 250 apart: 48 + 550
    # positions against 24 + 600 together), never over the token budget
    assert plan_batches(lengths, packed=False, max_batch_tokens=10**6) == [[0], [5], [3, 2], [6], [1, 4]]
    assert plan_batches(lengths, packed=False, max_batch_tokens=1) == [[i] for i in [0, 5, 3, 2, 6, 1, 4]]
    # equal lengths: full batches of 16 unless told otherwise, the rest last
    assert plan_batches([7] * 20, packed=False) == [list(range(16)), list(range(16, 20))]
    assert plan_batches([7] * 5, packed=False, batch_size=2) == [[0, 1], [2, 3], [4]]
    with pytest.warns(DeprecationWarning, match="packing"):  # the layout's one owner is benchgen_router.packing
        assert plan_batches(lengths, packed=True, max_batch_tokens=1, packing=object()) == [[0], [5, 4], [3, 2], [6, 1]]


def brute_force_padded_plan_cost(lengths: list[int], cap: int, budget: int, pass_cost: int) -> float:
    """The least padded positions + pass_cost per batch over every way of cutting the length-sorted
    queries into consecutive batches that keep to `cap` and `budget`."""
    widths = sorted(lengths, reverse=True)
    best = float("inf")
    for cuts in itertools.product([False, True], repeat=len(widths) - 1):
        bounds = [0, *(i + 1 for i, cut in enumerate(cuts) if cut), len(widths)]
        batches = [widths[a:b] for a, b in itertools.pairwise(bounds)]
        if all(len(b) <= cap and (len(b) == 1 or len(b) * b[0] <= budget) for b in batches):
            best = min(best, sum(pass_cost + len(b) * b[0] for b in batches))
    return best


def test_padded_plans_on_a_cpu_cost_the_least_of_every_way_to_cut_the_sorted_queries():
    pass_cost = pass_cost_positions("cpu")
    rng = random.Random(0)
    for _ in range(300):
        lengths = [rng.choice([1, 3, 8, 20, 21, 40, 90, 200]) for _ in range(rng.randint(1, 9))]
        cap, budget = rng.choice([1, 2, 3, 16]), rng.choice([50, 200, 10**6])
        batches = plan_batches(lengths, packed=False, batch_size=cap, max_batch_tokens=budget)
        assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
        order = [i for batch in batches for i in batch]
        assert [lengths[i] for i in order] == sorted(lengths, reverse=True)
        cost = sum(pass_cost + len(batch) * max(lengths[i] for i in batch) for batch in batches)
        assert all(
            len(batch) <= cap and (len(batch) == 1 or len(batch) * lengths[batch[0]] <= budget) for batch in batches
        )
        assert cost == brute_force_padded_plan_cost(lengths, cap, budget, pass_cost), (lengths, cap, budget, batches)


def test_padded_batches_on_a_gpu_are_filled_up_to_the_cap_and_the_budget():
    """Where a pass's cost is unmeasured (hardware.pass_cost_positions is None), length-sorted
    batches are filled in one sweep, as before batches were cut by cost."""
    lengths = [300, 10, 120, 130, 5, 250, 90]
    assert pass_cost_positions("cuda") is None and pass_cost_positions("cpu") == 24
    assert plan_batches(lengths, packed=False, max_batch_tokens=10**6, device="cuda") == [[0, 5, 3, 2, 6, 1, 4]]
    assert plan_batches(lengths, packed=False, batch_size=3, max_batch_tokens=10**6, device="cuda") == [
        [0, 5, 3],
        [2, 6, 1],
        [4],
    ]
    assert plan_batches(lengths, packed=False, max_batch_tokens=600, device="cuda") == [[0, 5], [3, 2, 6, 1], [4]]
    assert plan_batches(lengths, packed=False, max_batch_tokens=1, device="cuda") == [
        [i] for i in [0, 5, 3, 2, 6, 1, 4]
    ]


def test_padded_batches_are_bounded_by_the_token_budget_whatever_the_batch_size():
    """An encoder with --batch-size 3000 used to pad 3,000 queries into one batch (out of memory)."""
    lengths = [512] * 3000 + [8] * 100
    batches = plan_batches(lengths, packed=False, batch_size=3000, max_batch_tokens=2048)
    assert all(len(batch) * max(lengths[i] for i in batch) <= 2048 for batch in batches)
    assert sorted(i for batch in batches for i in batch) == list(range(3100))
