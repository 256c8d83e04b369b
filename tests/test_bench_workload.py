"""bench/workload.py: the sample spans the lengths in stream order, and the generated workload that
stands in for the pilot prompts has their lengths."""

from __future__ import annotations

import json

import numpy as np

from benchgen_router.bench.workload import PROMPT_CHAR_PERCENTILES, generated_workload, load_workload, stratified_sample


def test_stratified_sample_spans_the_length_range():
    lengths = list(range(1000))
    picks = stratified_sample(lengths, 10, seed=3)
    assert len(set(picks)) == 10
    assert sorted(p // 100 for p in picks) == list(range(10))  # one per decile
    assert picks != sorted(picks)  # random order: the batch-16 reference must not get pre-sorted input
    assert picks == stratified_sample(lengths, 10, seed=3)


def test_generated_workload_follows_the_real_lengths():
    prompts = generated_workload(2000, seed=0)
    lengths = np.array([len(p) for p in prompts])
    median = PROMPT_CHAR_PERCENTILES[len(PROMPT_CHAR_PERCENTILES) // 2]
    assert abs(np.median(lengths) - median) < 0.1 * median
    assert lengths.min() >= PROMPT_CHAR_PERCENTILES[0] and lengths.max() <= PROMPT_CHAR_PERCENTILES[-1] + 20


def test_load_workload_reads_prompts_and_falls_back_to_generated(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    lines = [{"prompt": "What is 2 + 2?"}, {"prompt": "  "}, {"id": 3}, {"prompt": "Name a prime."}]
    tasks.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n", encoding="utf-8")
    prompts, source = load_workload(tasks, seed=0)
    assert prompts == ["What is 2 + 2?", "Name a prime."]
    assert source == f"{tasks} (2 prompts)"
    prompts, source = load_workload(tmp_path / "absent.jsonl", seed=0)
    assert len(prompts) == 1110 and source.startswith("generated: 1110 prompts") and "absent.jsonl absent" in source
    assert prompts == load_workload(tmp_path / "absent.jsonl", seed=0)[0]
