"""The `stats` router: the probability head over the embedding and the query's own statistics, which a
sentence embedding's mean over tokens blurs: how long the query is (and how much of it the truncation cuts
off), how much of it is digits, maths or code, and how much of it the backbone's tokenizer knows.

Statistics (STATISTICS, in this order), each of the whole query as written (before truncation):
- `log_chars`, `log_pieces`: log(1 + characters), log(1 + the tokenizer's pieces, special tokens aside);
- `cut_share`: the share of pieces past the truncation length, which the embedding never sees;
- `digit_share`, `log_numbers`: the share of characters that are digits; log(1 + numbers written);
- `log_math`: log(1 + maths markers: $, LaTeX commands, ^, _{, relations and operators, an operator
  between numbers);
- `log_code`: log(1 + code markers: fences, indented lines, braces and semicolons, keywords of common
  languages);
- `split_word_share`: the share of the tokenizer's words cut into several pieces (WordPiece's ##
  continuations; byte-level BPE alike), `unknown_share`: the share of pieces that are the unknown token
  ([UNK]), `pieces_per_word`: pieces per word;
- `non_ascii_share`: the share of characters outside ASCII; `log_lines`: log(1 + line breaks).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchgen_router.bench.value.features import QUERY_STATISTICS, feature_of, widened_head
from benchgen_router.bench.value.routers import Fitted, Fold
from benchgen_router.errors import InputError

STATISTICS = (
    "log_chars",
    "log_pieces",
    "cut_share",
    "digit_share",
    "log_numbers",
    "log_math",
    "log_code",
    "split_word_share",
    "unknown_share",
    "pieces_per_word",
    "non_ascii_share",
    "log_lines",
)
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
MATH = re.compile(r"\$|\\[A-Za-z]+|\^|_\{|[=<>≤≥≠±×÷√∑∏∫∞π∂]|(?<=\d)\s*[-+*/]\s*(?=\d)")
CODE = re.compile(
    r"```|^(?: {4}|\t)(?=\S)|[{};]|#include\b|\b(?:def|return|import|class|lambda|elif|function|public|static|void|"
    r"printf|println|SELECT|FROM|WHERE)\b",
    re.MULTILINE,
)


def query_statistics(prompts: Sequence[str], tokenizer: Any, truncation_length: int) -> np.ndarray:
    """(prompts, len(STATISTICS)) float32, the statistics of the module docstring. `tokenizer`: the backbone's
    (a fast tokenizer: its word boundaries tell split words); `truncation_length`: the tokens the backbone
    embeds, special tokens included."""
    from benchgen_router.loading import special_token_counts

    if not getattr(tokenizer, "is_fast", False):
        raise InputError("query statistics need a fast tokenizer (one that reports word boundaries).")
    special, _ = special_token_counts(tokenizer)
    usable = max(truncation_length - special, 1)
    unknown = tokenizer.unk_token_id
    # Whole queries, past the backbone's length on purpose (what the truncation cuts is a statistic): no warning.
    encoded = tokenizer(list(prompts), add_special_tokens=False, verbose=False)
    rows = np.zeros((len(prompts), len(STATISTICS)), dtype=np.float32)
    for i, text in enumerate(prompts):
        pieces = encoded["input_ids"][i]
        words = np.bincount([word for word in encoded.word_ids(i) if word is not None])
        words = words[words > 0]
        chars = max(len(text), 1)
        rows[i] = (
            np.log1p(len(text)),
            np.log1p(len(pieces)),
            max(len(pieces) - usable, 0) / max(len(pieces), 1),
            sum(character.isdigit() for character in text) / chars,
            np.log1p(len(NUMBER.findall(text))),
            np.log1p(len(MATH.findall(text))),
            np.log1p(len(CODE.findall(text))),
            (words > 1).sum() / max(len(words), 1),
            (0 if unknown is None else sum(piece == unknown for piece in pieces)) / max(len(pieces), 1),
            len(pieces) / max(len(words), 1),
            sum(not character.isascii() for character in text) / chars,
            np.log1p(text.count("\n")),
        )
    return rows


def fit_stats(train: Fold, test: Fold, settings: dict[str, Any]) -> Fitted:
    """The probability head over [embedding, query statistics]."""
    train_stats, test_stats = feature_of(train, QUERY_STATISTICS, "stats"), feature_of(test, QUERY_STATISTICS, "stats")
    return widened_head(
        np.hstack([train.embeddings, train_stats]), np.hstack([test.embeddings, test_stats]), train, settings
    )
