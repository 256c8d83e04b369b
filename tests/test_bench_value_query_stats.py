"""bench/value/query_stats.py: each statistic of hand-made queries, through MiniLM's own WordPiece tokenizer,
and the `stats` router beating the plain probability head where only the statistics tell the weak agent's
questions apart."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchgen_router.bench.value import ValueConfig, run_value_benchmark
from benchgen_router.bench.value.features import QUERY_STATISTICS
from benchgen_router.bench.value.query_stats import STATISTICS, query_statistics
from helpers import mean_apgr, weak_and_strong

MINILM = "sentence-transformers/all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def wordpiece():
    from benchgen_router.loading import load_backbone_tokenizer

    return load_backbone_tokenizer(MINILM)


def stats_of(text: str, tokenizer, truncation_length: int = 512) -> dict[str, float]:
    return dict(zip(STATISTICS, query_statistics([text], tokenizer, truncation_length)[0].tolist(), strict=True))


def test_length_digits_and_maths_of_an_arithmetic_question(wordpiece):
    stats = stats_of("What is 12 + 30 = ?", wordpiece)  # pieces: what is 12 + 30 = ?
    assert stats["log_chars"] == pytest.approx(math.log1p(19))
    assert stats["log_pieces"] == pytest.approx(math.log1p(7))
    assert stats["digit_share"] == pytest.approx(4 / 19)
    assert stats["log_numbers"] == pytest.approx(math.log1p(2))
    assert stats["log_math"] == pytest.approx(math.log1p(2))  # "+" between numbers, "="
    assert stats["log_code"] == 0 and stats["log_lines"] == 0 and stats["non_ascii_share"] == 0
    assert stats["split_word_share"] == 0 and stats["pieces_per_word"] == 1 and stats["cut_share"] == 0
    # 6 positions less [CLS] and [SEP] leave 4 of the 7 pieces: 3 of 7 are cut off
    assert stats_of("What is 12 + 30 = ?", wordpiece, truncation_length=6)["cut_share"] == pytest.approx(3 / 7)


def test_words_the_vocabulary_splits_or_does_not_know(wordpiece):
    rare = stats_of("The unaffable xylophonist", wordpiece)  # the | una ##ffa ##ble | x ##yl ##op ##hon ##ist
    assert rare["split_word_share"] == pytest.approx(2 / 3) and rare["pieces_per_word"] == pytest.approx(3)
    assert rare["unknown_share"] == 0
    unknown = stats_of("∫ x dx 😀", wordpiece)  # [UNK] | x | d ##x | [UNK]
    assert unknown["unknown_share"] == pytest.approx(2 / 5) and unknown["split_word_share"] == pytest.approx(1 / 4)
    assert unknown["non_ascii_share"] == pytest.approx(2 / 8) and unknown["log_math"] == pytest.approx(math.log1p(1))


def test_code_markers_and_lines(wordpiece):
    stats = stats_of("def f():\n    return 1;", wordpiece)  # def, an indented line, return, ;
    assert stats["log_code"] == pytest.approx(math.log1p(4)) and stats["log_lines"] == pytest.approx(math.log1p(1))
    assert stats_of("", wordpiece)["log_chars"] == 0  # nothing to divide by: shares are 0, not NaN


def test_stats_beat_the_plain_head_where_only_the_statistics_tell(wordpiece):
    """The weak agent answers the questions full of numbers; the embedding is noise, blind to them."""
    rng = np.random.default_rng(4)
    numeric = np.arange(300) % 2 == 0
    prompts = [
        f"Compute {rng.integers(100, 999)} * {rng.integers(10, 99)} + {rng.integers(1, 9)}"
        if is_numeric
        else f"Name the {rng.choice(['capital', 'author', 'river', 'painter'])} of the story {i}"
        for i, is_numeric in enumerate(numeric)
    ]
    matrix = weak_and_strong(np.where(numeric, 0.95, 0.15), seed=5, names=prompts)
    embeddings = rng.normal(size=(300, 8)).astype(np.float32)
    features = {QUERY_STATISTICS: query_statistics(prompts, wordpiece, 512)}
    config = ValueConfig(folds=3, repeats=1, group_folds=0, routers=("probability", "stats"), progress=False)
    result = run_value_benchmark(matrix, config, lambda p: embeddings, features)
    assert mean_apgr(result, "stats") > mean_apgr(result, "probability") + 0.15
