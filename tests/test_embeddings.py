"""embeddings.py: the embedding cache is keyed by everything that changes an embedding, and an
unusable cache file is recomputed, never trusted."""

from __future__ import annotations

import numpy as np

from benchgen_router.embeddings import _read_cache, embed_prompts, embedding_cache_key, prompts_digest
from helpers import AGENTS, make_queries


def test_the_key_changes_with_every_input_of_an_embedding():
    base = {"backbone_identity": "hub:x@1", "revision": None, "dtype": "float32", "truncation_length": 512}
    key = embedding_cache_key(**base, device="cpu", prompts=["a", "b"])
    for change in (
        {"backbone_identity": "hub:x@2"},
        {"revision": "v2"},
        {"dtype": "bfloat16"},
        {"truncation_length": 9},
    ):
        assert embedding_cache_key(**{**base, **change}, device="cpu", prompts=["a", "b"]) != key
    assert embedding_cache_key(**base, device="cpu", prompts=["ab"]) != key  # no collision by concatenation
    assert embedding_cache_key(**base, device="cuda:1", prompts=["a", "b"]) == embedding_cache_key(
        **base, device="cuda:0", prompts=["a", "b"]
    )
    assert prompts_digest(["a", "b"]) != prompts_digest(["b", "a"])


def test_a_damaged_cache_file_is_ignored(tmp_path):
    path = tmp_path / "cache.npy"
    path.write_bytes(b"not numpy")
    assert _read_cache(path, 2, 4) is None
    np.save(path, np.zeros((2, 3), dtype=np.float32))
    assert _read_cache(path, 2, 4) is None  # wrong shape
    np.save(path, np.full((2, 4), np.nan, dtype=np.float32))
    assert _read_cache(path, 2, 4) is None  # not finite
    np.save(path, np.ones((2, 4), dtype=np.float32))
    assert np.array_equal(_read_cache(path, 2, 4), np.ones((2, 4), dtype=np.float32))


def test_embeddings_are_cached_and_read_back(backbone_dir, tmp_path):
    prompts = make_queries(5, seed=3)
    first = embed_prompts(prompts, str(backbone_dir), AGENTS, cache_dir=tmp_path)
    again = embed_prompts(prompts, str(backbone_dir), AGENTS, cache_dir=tmp_path)
    assert not first.from_cache and again.from_cache and first.cache_file == again.cache_file
    assert np.array_equal(first.vectors, again.vectors) and first.vectors.shape == (5, 32)
