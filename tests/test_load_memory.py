"""Loading must not materialise the backbone twice (a random init later overwritten)."""

from __future__ import annotations

import json

from conftest import run_tool


def test_loading_peak_rss_stays_near_the_weights_size():
    # Qwen3-1.7B width with 2 layers and a 32k vocabulary: 0.62 GiB of float32 weights. A double
    # materialisation would raise the peak by >= 2x the weights; one copy (plus small buffers) stays below 1.6x.
    result = run_tool("measure_load_memory.py", "--layers", "2", "--vocab", "32000", "--json")
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(figures) == {"head-only", "bundled"}
    for mode, f in figures.items():
        assert f["backbone_bytes"] > 600e6, mode
        assert 0.8 < f["ratio"] < 1.6, (mode, f)
