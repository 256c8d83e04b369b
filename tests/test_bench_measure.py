"""bench/measure.py: what the workers read of themselves (memory, clocks, weight bytes)."""

from __future__ import annotations

import sys
import time

import pytest
import torch

from benchgen_router.bench.measure import load_time_and_rss, proc_status_kib, timed, weight_bytes

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")


def test_weight_bytes_count_tied_tensors_once():
    embedding = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = embedding.weight  # tied, as Qwen3's embeddings are
    model = torch.nn.ModuleDict({"embed": embedding, "head": head, "norm": torch.nn.LayerNorm(4)})
    assert weight_bytes(model) == (10 * 4 + 4 + 4) * 4
    assert weight_bytes(model.half()) == (10 * 4 + 4 + 4) * 2


def test_timed_records_wall_and_cpu_seconds():
    clock: dict[str, float] = {}
    with timed("cpu", clock):
        time.sleep(0.05)
    assert clock["seconds"] >= 0.05 and 0 <= clock["cpu_seconds"] < clock["seconds"]


@linux_only
def test_memory_figures_come_from_proc():
    assert proc_status_kib("VmRSS") > 0 and proc_status_kib("VmHWM") >= proc_status_kib("VmRSS") > 0
    assert proc_status_kib("NoSuchKey") == 0
    result: dict = {}
    load_time_and_rss(time.perf_counter() - 1.0, result)
    assert result["load_seconds"] >= 1.0 and result["load_peak_rss"] > 0 and isinstance(result["peak_reset"], bool)
