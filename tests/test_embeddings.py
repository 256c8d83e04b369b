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


def test_layer_means_end_with_embed_prompts_embedding_and_are_cached(backbone_dir, tmp_path):
    from benchgen_router.embeddings import embed_layer_means

    prompts = make_queries(40, seed=5)  # lengths differ: padded batches of mixed lengths, against packed rows
    standard = embed_prompts(prompts, str(backbone_dir), AGENTS, cache_dir=tmp_path)
    layers = embed_layer_means(prompts, str(backbone_dir), cache_dir=tmp_path, chunk_prompts=16)
    assert layers.vectors.shape == (40, 3, 32) and not layers.from_cache  # the input embeddings, then 2 layers
    np.testing.assert_allclose(layers.vectors[:, -1], standard.vectors, rtol=1e-4, atol=1e-5)
    assert not np.allclose(layers.vectors[:, 0], layers.vectors[:, -1], atol=1e-2)  # other layers differ
    assert layers.cache_file != standard.cache_file
    again = embed_layer_means(prompts, str(backbone_dir), cache_dir=tmp_path)
    assert again.from_cache and np.array_equal(again.vectors, layers.vectors)
    reread = embed_prompts(prompts, str(backbone_dir), AGENTS, cache_dir=tmp_path)
    assert reread.from_cache and np.array_equal(reread.vectors, standard.vectors)  # the standard key is untouched


def test_the_layers_key_differs_and_the_standard_key_is_unchanged():
    base = {"backbone_identity": "hub:x@1", "revision": None, "dtype": "float32", "truncation_length": 512}
    standard = embedding_cache_key(**base, device="cpu", prompts=["a"])
    assert embedding_cache_key(**base, device="cpu", prompts=["a"], pooling="last") == standard
    assert embedding_cache_key(**base, device="cpu", prompts=["a"], pooling="layers") != standard


def test_a_run_goes_on_when_another_run_of_the_same_prompts_ends_first(tmp_path):
    """Two runs of one cache key: the first to finish writes the cache file and removes the chunks' folder;
    the other keeps its chunks in a folder made again, rather than failing after its work."""
    import shutil

    from benchgen_router.embeddings import _embed_in_chunks

    partial = tmp_path / "key.partial"
    calls = []

    def embed(chunk):
        calls.append(len(chunk))
        if len(calls) == 2:  # the other run ends now
            shutil.rmtree(partial)
        return np.full((len(chunk), 3), float(len(calls)), dtype=np.float32)

    vectors = _embed_in_chunks(embed, [f"q{i}" for i in range(6)], 3, 2, partial, False, "not finite")
    assert vectors[:, 0].tolist() == [1, 1, 2, 2, 3, 3] and calls == [2, 2, 2]
    assert sorted(path.name for path in partial.iterdir()) == ["000000002-000000004.npy", "000000004-000000006.npy"]
