"""Loading must not materialise the backbone twice (a random init later overwritten), nor keep a
narrower checkpoint resident next to the float32 weights it was upcast to."""

from __future__ import annotations

import json

import pytest
import transformers

from helpers import run_tool


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint_dtype", ["float32", "bfloat16"])
def test_loading_peak_rss_stays_near_the_weights_size(checkpoint_dtype):
    # Qwen3-1.7B width with 1 layer and a 16k vocabulary: 0.31 GiB of float32 weights, large enough
    # against what loading allocates besides. A double materialisation would raise the peak by >= 2x
    # the weights; one copy (plus small buffers) stays below 1.6x. From a bfloat16 checkpoint
    # transformers 5 lets the router load unmapped and upcast tensor by tensor (below 1.3x);
    # transformers 4 keeps the mapped file resident while it upcasts.
    args = ["--layers", "1", "--vocab", "16000", "--checkpoint-dtype", checkpoint_dtype, "--json"]
    result = run_tool("bench", "load-memory", *args)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(figures) == {"head-only", "bundled"}
    for mode, f in figures.items():
        assert f["backbone_bytes"] > 300e6 and f["dtype"] == "torch.float32", mode
        assert 0.8 < f["ratio"] < 1.6, (mode, f)
    if checkpoint_dtype == "bfloat16" and int(transformers.__version__.split(".")[0]) >= 5:
        assert figures["head-only"]["ratio"] < 1.3, figures["head-only"]


def test_table_has_a_line_per_checkpoint_mode():
    from benchgen_router.bench.load_memory import table_lines

    figures = {"backbone_bytes": 2**30, "dtype": "torch.float32", "load_increase_bytes": 2**30, "ratio": 1.25}
    results = {"head-only": {**figures, "increase_bytes": 1.25 * 2**30}, "bundled": {**figures, "ratio": 2.0}}
    results["bundled"]["increase_bytes"] = 2 * 2**30
    lines = table_lines(results, layers=2, vocab=32_000, checkpoint_dtype="bfloat16")
    assert lines[0].startswith("Qwen3-1.7B geometry, 2 layers, vocab 32,000, saved in bfloat16, loaded in float32;")
    assert (
        lines[1].startswith("| checkpoint | backbone weights |") and lines[2] == "| --- | ---: | ---: | ---: | ---: |"
    )
    assert lines[3:] == [
        "| head-only | 1.00 GiB (torch.float32) | 1.00 GiB | 1.25 GiB | 1.25 |",
        "| bundled | 1.00 GiB (torch.float32) | 1.00 GiB | 2.00 GiB | 2.00 |",
    ]
