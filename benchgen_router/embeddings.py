"""Embedding prompts for training with the model code that serves, cached on disk as plain .npy."""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchgen_router.errors import setting_error
from benchgen_router.files import atomic_output
from benchgen_router.loading import backbone_router, backbone_source, effective_truncation_length, load_backbone_config
from benchgen_router.manifest import POOLINGS
from benchgen_router.model_code import RouterModel

logger = logging.getLogger("benchgen_router")


# Prompts per kept chunk of an embedding run: at most this much work is lost to an interrupt, and the
# progress bar moves this many prompts at a time.
CHUNK_PROMPTS = 256


def default_cache_dir() -> Path:
    """Embedding cache location: $XDG_CACHE_HOME (or ~/.cache) / benchgen-router / embeddings."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "benchgen-router" / "embeddings"


def _backbone_fingerprint(backbone: str, text_config: Any) -> str:
    """What identifies the backbone's weights: the resolved commit for a Hub id, else (for a local
    folder) the absolute path with each file's name, size and modification time."""
    commit = getattr(text_config, "_commit_hash", None)
    folder = Path(backbone).expanduser()
    if commit or not folder.is_dir():
        return f"hub:{backbone}@{commit}"
    files = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir() if p.is_file())
    return f"local:{folder.resolve()}:{files}"


def prompts_digest(prompts: Sequence[str]) -> str:
    """sha256 over the prompts in order (length-prefixed, so no two lists collide by concatenation)."""
    digest = hashlib.sha256()
    for prompt in prompts:
        data = prompt.encode("utf-8")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def embedding_cache_key(
    backbone_identity: str,
    revision: str | None,
    dtype: str,
    truncation_length: int,
    device: str,
    prompts: Sequence[str],
    pooling: str = "last",
) -> str:
    """Cache file name for one embedding run. Besides backbone, revision, dtype, truncation and the
    prompts, the key covers the serving code (modeling_router.py) and the torch / transformers
    versions: a cached embedding is reused only where the serving path would reproduce it. `pooling`
    names what is pooled: "last" (the last hidden state, what serves; kept out of the key so that
    existing caches stay valid) or "layers" (every layer's masked mean, embed_layer_means)."""
    import torch
    import transformers

    code = hashlib.sha256(Path(inspect.getfile(RouterModel)).read_bytes()).hexdigest()
    parts = {
        "backbone": backbone_identity,
        "revision": revision,
        "dtype": dtype,
        "truncation_length": truncation_length,
        "device": device.split(":")[0],
        "prompts": prompts_digest(prompts),
        "modeling_router": code,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    if pooling != "last":
        parts["pooling"] = pooling
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:40]


@dataclass
class Embeddings:
    vectors: np.ndarray  # (prompts, D) float32, input order
    truncation_length: int  # the one applied: the requested length capped by the backbone's positions
    cache_file: Path | None
    from_cache: bool


def embed_prompts(
    prompts: Sequence[str],
    backbone: str,
    agents: Sequence[str],
    revision: str | None = None,
    dtype: str = "float32",
    truncation_length: int = 1024,
    device: str = "cpu",
    batch_size: int | None = None,
    max_batch_tokens: int | None = None,
    cache_dir: Path | None = None,
    progress: bool = False,
    allow_emulated_bf16: bool = False,
    chunk_prompts: int = CHUNK_PROMPTS,
    pooling: str = "last-layer",
) -> Embeddings:
    """Pooled embeddings of the prompts, computed by RouterModel (the class that serves) around the
    backbone, pooled as `pooling` says (RouterConfig.pooling), batched with a progress bar, and cached as
    a plain .npy (never pickled) so that a re-run or a hyper-parameter sweep does not embed again. With a
    cache, the work is kept chunk by chunk (`chunk_prompts` prompts each) in a `<key>.partial` folder beside
    the cache file until the last chunk is done, so a run stopped by Ctrl-C resumes where it stopped."""
    from benchgen_router.routing import run_router

    _check_chunk_prompts(chunk_prompts)
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
    text_config = load_backbone_config(backbone, revision)
    effective = effective_truncation_length(text_config, truncation_length)
    dim = text_config.hidden_size * (text_config.num_hidden_layers + 1 if pooling == "every-layer" else 1)
    key = "layers" if pooling == "every-layer" else "last"
    cache_file = _cache_file(cache_dir, backbone, revision, text_config, dtype, effective, device, prompts, key)
    cached = None if cache_file is None else _read_cache(cache_file, len(prompts), dim)
    if cached is not None:
        logger.info("embeddings of %d prompts read from cache %s", len(prompts), cache_file)
        return Embeddings(cached, effective, cache_file, True)

    model, tokenizer = backbone_router(
        backbone,
        agents,
        revision=revision,
        device=device,
        dtype=dtype,
        truncation_length=truncation_length,
        text_config=text_config,
        allow_emulated_bf16=allow_emulated_bf16,
        pooling=pooling,
    )
    if model.config.truncation_length != effective:
        raise RuntimeError(f"truncation length {model.config.truncation_length} != expected {effective}")
    partial = None if cache_file is None else cache_file.with_name(f"{cache_file.stem}.partial")
    vectors = _embed_in_chunks(
        lambda chunk: run_router(model, tokenizer, chunk, batch_size=batch_size, max_batch_tokens=max_batch_tokens)[1],
        prompts,
        dim,
        chunk_prompts,
        partial,
        progress,
        f"backbone '{backbone}' produced NaN or infinite embeddings in {dtype}; use {{dtype=float32}}.",
    )
    _keep(vectors, cache_file, partial)
    return Embeddings(vectors, effective, cache_file, False)


def _check_chunk_prompts(chunk_prompts: Any) -> None:
    """Before any work: a chunk is a positive whole number of prompts."""
    if not isinstance(chunk_prompts, int) or isinstance(chunk_prompts, bool) or chunk_prompts < 1:
        raise ValueError(f"chunk_prompts must be a positive integer, got {chunk_prompts!r}")


def _cache_file(
    cache_dir: Path | None,
    backbone: str,
    revision: str | None,
    text_config: Any,
    dtype: str,
    truncation_length: int,
    device: str,
    prompts: Sequence[str],
    pooling: str,
) -> Path | None:
    """Where an embedding run is cached (None without a cache folder); the folder is made here, before
    embedding, so that a bad --cache-dir fails fast rather than after the work."""
    if cache_dir is None:
        return None
    identity = _backbone_fingerprint(backbone_source(backbone, revision), text_config)
    key = embedding_cache_key(identity, revision, dtype, truncation_length, device, prompts, pooling)
    cache_folder = Path(cache_dir).expanduser()
    try:
        cache_folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise setting_error(
            f"cannot use embedding cache folder {cache_folder} ({err.strerror}); pass another {{cache_dir}}."
        ) from None
    return cache_folder / f"{key}.npy"


def _keep(vectors: np.ndarray, cache_file: Path | None, partial: Path | None) -> None:
    """The finished run written to its cache file (atomically), and its chunks removed."""
    if cache_file is None or partial is None:
        return
    with atomic_output(cache_file, "wb") as handle:
        np.save(handle, vectors, allow_pickle=False)
    shutil.rmtree(partial, ignore_errors=True)
    logger.info("embeddings cached in %s", cache_file)


@dataclass
class LayerMeans:
    vectors: np.ndarray  # (prompts, layers + 1, D) float32: [:, 0] the input embeddings', [:, l] layer l's
    truncation_length: int
    cache_file: Path | None
    from_cache: bool


def embed_layer_means(
    prompts: Sequence[str],
    backbone: str,
    revision: str | None = None,
    dtype: str = "float32",
    truncation_length: int = 1024,
    device: str = "cpu",
    batch_size: int | None = None,
    max_batch_tokens: int | None = None,
    cache_dir: Path | None = None,
    progress: bool = False,
    allow_emulated_bf16: bool = False,
    chunk_prompts: int = CHUNK_PROMPTS,
) -> LayerMeans:
    """The masked mean of every hidden state of the backbone (the input embeddings, then each layer), per
    prompt: embed_prompts with every-layer pooling (a router's own, RouterConfig.pooling), each prompt's
    (layers + 1) * D numbers laid out as (layers + 1, D). The last layer's mean is embed_prompts' embedding.
    Cached and resumable as embed_prompts, under a key that says "layers"."""
    text_config = load_backbone_config(backbone, revision)
    states, dim = text_config.num_hidden_layers + 1, text_config.hidden_size
    embedded = embed_prompts(
        prompts,
        backbone,
        ["router"],
        revision=revision,
        dtype=dtype,
        truncation_length=truncation_length,
        device=device,
        batch_size=batch_size,
        max_batch_tokens=max_batch_tokens,
        cache_dir=cache_dir,
        progress=progress,
        allow_emulated_bf16=allow_emulated_bf16,
        chunk_prompts=chunk_prompts,
        pooling="every-layer",
    )
    means = embedded.vectors.reshape(len(prompts), states, dim)
    return LayerMeans(means, embedded.truncation_length, embedded.cache_file, embedded.from_cache)


def _embed_in_chunks(
    embed: Callable[[Sequence[str]], np.ndarray],
    prompts: Sequence[str],
    dim: int,
    chunk_prompts: int,
    partial: Path | None,
    progress: bool,
    non_finite: str,
) -> np.ndarray:
    """The prompts embedded `chunk_prompts` at a time, in fixed chunks (so an interrupted run and an
    uninterrupted one batch every prompt alike). With a `partial` folder, each finished chunk is
    written there atomically as it completes, and chunks found there are read instead of embedded: a
    run stopped by Ctrl-C loses at most the chunk in progress, and the next run resumes."""
    from tqdm.auto import tqdm

    from benchgen_router.routing import EmptyQueryError

    vectors = np.zeros((len(prompts), dim), dtype=np.float32)
    pending = []
    for start in range(0, len(prompts), chunk_prompts):
        end = min(start + chunk_prompts, len(prompts))
        path = None if partial is None else partial / f"{start:09d}-{end:09d}.npy"
        done = None if path is None else _read_cache(path, end - start, dim)
        if done is None:
            pending.append((start, end, path))
        else:
            vectors[start:end] = done
    resumed = len(prompts) - sum(end - start for start, end, _ in pending)
    if resumed:
        logger.info("resuming: %d of %d prompts already embedded in %s", resumed, len(prompts), partial)
    if partial is not None and pending:
        partial.mkdir(exist_ok=True)
    with tqdm(total=len(prompts), initial=resumed, desc="embedding", unit="q", disable=not progress) as bar:
        for start, end, path in pending:
            try:
                chunk = np.asarray(embed(prompts[start:end]), dtype=np.float32)
            except EmptyQueryError as err:  # positions in the whole list, not in the chunk
                raise EmptyQueryError([start + position for position in err.positions]) from None
            if not np.isfinite(chunk).all():
                raise setting_error(non_finite)
            if path is not None:
                # Another run of the same prompts that ended first removed the folder with its own chunks.
                path.parent.mkdir(exist_ok=True)
                with atomic_output(path, "wb") as handle:
                    np.save(handle, chunk, allow_pickle=False)
            vectors[start:end] = chunk
            bar.update(end - start)
    return vectors


def _read_cache(path: Path, rows: int, dim: int) -> np.ndarray | None:
    """A cached embedding matrix, or None when absent or unusable (then it is recomputed)."""
    if not path.is_file():
        return None
    try:
        vectors = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        logger.warning("ignoring unreadable embedding cache %s (%s)", path, err)
        return None
    if vectors.shape != (rows, dim) or vectors.dtype != np.float32 or not np.isfinite(vectors).all():
        logger.warning("ignoring embedding cache %s: shape %s, dtype %s", path, vectors.shape, vectors.dtype)
        return None
    return vectors
