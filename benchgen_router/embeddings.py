"""Embedding prompts for training with the model code that serves, cached on disk as plain .npy."""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchgen_router.errors import setting_error
from benchgen_router.files import atomic_output
from benchgen_router.loading import backbone_router, backbone_source, effective_truncation_length, load_backbone_config
from benchgen_router.model_code import RouterModel

logger = logging.getLogger("benchgen_router")


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
) -> str:
    """Cache file name for one embedding run. Besides backbone, revision, dtype, truncation and the
    prompts, the key covers the serving code (modeling_router.py) and the torch / transformers
    versions: a cached embedding is reused only where the serving path would reproduce it."""
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
) -> Embeddings:
    """Pooled embeddings of the prompts, computed by RouterModel (the class that serves) around the
    backbone, batched with a progress bar, and cached as a plain .npy (never pickled) so that a
    re-run or a hyper-parameter sweep does not embed again."""
    from benchgen_router.routing import run_router

    text_config = load_backbone_config(backbone, revision)
    effective = effective_truncation_length(text_config, truncation_length)
    cache_file = None
    if cache_dir is not None:
        key = embedding_cache_key(
            _backbone_fingerprint(backbone_source(backbone, revision), text_config),
            revision,
            dtype,
            effective,
            device,
            prompts,
        )
        cache_folder = Path(cache_dir).expanduser()
        try:  # before embedding, so a bad --cache-dir fails fast rather than after the work
            cache_folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise setting_error(
                f"cannot use embedding cache folder {cache_folder} ({err.strerror}); pass another {{cache_dir}}."
            ) from None
        cache_file = cache_folder / f"{key}.npy"
        cached = _read_cache(cache_file, len(prompts), text_config.hidden_size)
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
    )
    if model.config.truncation_length != effective:
        raise RuntimeError(f"truncation length {model.config.truncation_length} != expected {effective}")
    _, vectors = run_router(
        model,
        tokenizer,
        prompts,
        batch_size=batch_size,
        max_batch_tokens=max_batch_tokens,
        progress=progress,
        desc="embedding",
    )
    if not np.isfinite(vectors).all():
        raise setting_error(
            f"backbone '{backbone}' produced NaN or infinite embeddings in {dtype}; use {{dtype=float32}}."
        )
    if cache_file is not None:
        with atomic_output(cache_file, "wb") as handle:
            np.save(handle, vectors, allow_pickle=False)
        logger.info("embeddings cached in %s", cache_file)
    return Embeddings(vectors, effective, cache_file, False)


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
