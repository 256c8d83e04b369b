"""The benchmarks' prompts: the pilot tasks where present, else generated text of the same lengths."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TASKS = REPOSITORY_ROOT.parent / "shared" / "benchgen-pilot" / "tasks.v1.jsonl"
GENERATED_COUNT = 1110  # as many prompts as tasks.v1.jsonl holds

# Prompt lengths in characters of tasks.v1.jsonl at the 0th, 5th, ..., 100th percentile: the
# generated workload (used when the file is absent) follows this distribution.
PROMPT_CHAR_PERCENTILES = [87, 152, 190, 214, 236, 258, 279, 296, 313, 328, 342, 362, 381, 401, 423, 448, 484, 531, 604]
PROMPT_CHAR_PERCENTILES += [759, 1765]
GENERATED_WORDS = (
    "find compute prove explain the of a an and to in is that which with for each integer real "
    "number sum product triangle circle probability function derivative integral matrix prime "
    "answer question passage statement assume given let where such value least greatest all "
    "between if then only not every some how many what why when protein enzyme treaty economic "
    "energy velocity mass orbit reaction solution equation graph vertex edge sequence term"
)
GENERATED_SYMBOLS = ["$x^2$", "$\\frac{1}{2}$", "(a)", "(b)", "=", "+", "12", "2025", "$n$", "\\sqrt{3}", ","]


def load_workload(path: Path, seed: int) -> tuple[list[str], str]:
    """The pilot prompts and where they came from; generated ones, so the benchmark runs without the data."""
    if path.is_file():
        prompts = read_prompts(path)
        if prompts:
            return prompts, f"{path} ({len(prompts)} prompts)"
    prompts = generated_workload(GENERATED_COUNT, seed)
    return prompts, f"generated: {GENERATED_COUNT} prompts with the char lengths of tasks.v1 ({path} absent)"


def read_prompts(path: Path) -> list[str]:
    """Every non-blank string 'prompt'; other lines are skipped, as the file is only a workload."""
    prompts = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            prompt = json.loads(line).get("prompt")
            if isinstance(prompt, str) and prompt.strip():
                prompts.append(prompt)
    return prompts


def generated_workload(count: int, seed: int) -> list[str]:
    """Word salad: a speed benchmark needs only the lengths, which follow PROMPT_CHAR_PERCENTILES."""
    rng = np.random.default_rng(seed)
    quantiles = np.linspace(0.0, 1.0, len(PROMPT_CHAR_PERCENTILES))
    vocabulary, prompts = GENERATED_WORDS.split(), []
    for u in rng.random(count):
        target = int(np.interp(u, quantiles, PROMPT_CHAR_PERCENTILES))
        words: list[str] = []
        while sum(len(w) + 1 for w in words) < target:
            pool = GENERATED_SYMBOLS if rng.random() < 0.15 else vocabulary
            words.append(str(rng.choice(pool)))
        prompts.append(" ".join(words).capitalize() + "?")
    return prompts


def stratified_sample(lengths: Sequence[int], count: int, seed: int) -> list[int]:
    """One prompt per length quantile, in seeded random order, so the batch-16 reference pads what
    comes together, as in a stream, not sorted neighbours."""
    rng = np.random.default_rng(seed)
    order = np.argsort(np.asarray(lengths), kind="stable")
    picks = [int(rng.choice(part)) for part in np.array_split(order, count) if len(part)]
    return [picks[i] for i in rng.permutation(len(picks))]
