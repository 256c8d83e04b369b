"""The head's flat parameter vector `theta` (docs/reference.md, "Head"): the trainer's and the converter's format.

Linear head (hidden_dim 0): theta = [W (D, N) row-major, b (N)], logits = emb @ W + b.
MLP head (hidden_dim H > 0): theta = [W1 (D, H), b1 (H), W2 (H, N), b2 (N)],
logits = tanh(emb @ W1 + b1) @ W2 + b2. nn.Linear stores each W transposed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchgen_router.errors import InputError, setting_error

# Heads of a checkpoint with operating points: one flat theta (float64) per operating point name,
# next to head_weights.npy (which holds the default operating point's theta, for readers of the
# reference format).
OPERATING_HEADS_FILE = "operating_heads.safetensors"


def head_param_count(embedding_dim: int, num_agents: int, hidden_dim: int) -> int:
    if hidden_dim == 0:
        return embedding_dim * num_agents + num_agents
    return embedding_dim * hidden_dim + hidden_dim + hidden_dim * num_agents + num_agents


def head_shapes(embedding_dim: int, num_agents: int, hidden_dim: int) -> list[tuple[int, ...]]:
    """The parts of theta in order, each W as (in, out)."""
    if hidden_dim == 0:
        return [(embedding_dim, num_agents), (num_agents,)]
    return [(embedding_dim, hidden_dim), (hidden_dim,), (hidden_dim, num_agents), (num_agents,)]


def unflatten_theta(theta: np.ndarray, embedding_dim: int, num_agents: int, hidden_dim: int) -> list[np.ndarray]:
    """Split theta (..., n_params) into its parts; leading dimensions are kept, so a whole CMA-ES
    population unflattens in one call."""
    parts, start = [], 0
    for shape in head_shapes(embedding_dim, num_agents, hidden_dim):
        size = int(np.prod(shape))
        parts.append(theta[..., start : start + size].reshape(*theta.shape[:-1], *shape))
        start += size
    return parts


def check_float32_finite(theta: np.ndarray, what: str) -> None:
    """The model scores in float32: values finite in float64 (1e300, say) overflow to inf there and
    every logit becomes inf or NaN, so finiteness is checked after the cast."""
    with np.errstate(over="ignore"):
        as_float32 = np.asarray(theta, dtype=np.float64).astype(np.float32)
    bad = int((~np.isfinite(as_float32)).sum())
    if bad:
        raise setting_error(
            f"{what} holds {bad} value(s) that are NaN or overflow float32 (|x| > 3.4e38); "
            "retrain with a smaller {sigma0} or pass the right file."
        )


def theta_to_state_dict(
    theta: np.ndarray, embedding_dim: int, num_agents: int, hidden_dim: int, prefix: str = "head."
) -> dict[str, Any]:
    """The RouterModel head's state dict (float32 tensors; `head.` prefix, `head.<name>.` for the
    head of operating point <name>)."""
    import torch

    parts = unflatten_theta(np.asarray(theta), embedding_dim, num_agents, hidden_dim)
    names = ["weight", "bias"] if hidden_dim == 0 else ["0.weight", "0.bias", "2.weight", "2.bias"]
    return {
        prefix + name: torch.from_numpy(np.ascontiguousarray(part.T if part.ndim == 2 else part, dtype=np.float32))
        for name, part in zip(names, parts, strict=True)
    }


def save_operating_heads(path: str | Path, thetas: dict[str, np.ndarray]) -> Path:
    """Write one flat float64 theta per operating point as safetensors, atomically."""
    from safetensors.numpy import save

    from benchgen_router.files import atomic_output

    payload = save({name: np.ascontiguousarray(theta, dtype=np.float64) for name, theta in thetas.items()})
    with atomic_output(Path(path), "wb") as handle:
        handle.write(payload)
    return Path(path)


def load_operating_heads(path: str | Path, names: list[str], expected_size: int) -> dict[str, np.ndarray]:
    """The flat theta of each named operating point from save_operating_heads' file, refusing a
    missing name, a wrong size or values that are not finite in float32."""
    from safetensors import SafetensorError, safe_open

    source = Path(path)
    if not source.is_file():
        raise InputError(
            f"{source} not found; a release with operating points keeps their heads in {OPERATING_HEADS_FILE} "
            "next to head_weights.npy."
        )
    try:
        with safe_open(str(source), framework="np") as handle:
            stored = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 (not a dict)
    except (SafetensorError, OSError, ValueError) as err:
        raise InputError(f"{source} is not a readable safetensors file ({err}).") from None
    thetas = {}
    for name in names:
        if name not in stored:
            raise InputError(f"{source} holds no head for operating point '{name}' (it has {sorted(stored)}).")
        theta = stored[name]
        if theta.ndim != 1 or theta.size != expected_size or not np.issubdtype(theta.dtype, np.floating):
            raise InputError(
                f"{source}: the head of '{name}' is {theta.dtype} {tuple(theta.shape)}, not a flat float vector of "
                f"{expected_size} values; pass the heads that belong to this manifest."
            )
        check_float32_finite(theta, f"{source} ('{name}')")
        thetas[name] = theta.astype(np.float64)
    return thetas


def head_logits(thetas: np.ndarray, embeddings: np.ndarray, num_agents: int, hidden_dim: int) -> np.ndarray:
    """Logits of many candidate heads at once: thetas (P, n_params), embeddings (Q, D) -> (P, Q, N)."""
    parts = unflatten_theta(np.atleast_2d(thetas), embeddings.shape[1], num_agents, hidden_dim)
    if hidden_dim == 0:
        weight, bias = parts
        return np.einsum("qd,pdn->pqn", embeddings, weight) + bias[:, None, :]
    w1, b1, w2, b2 = parts
    hidden = np.tanh(np.einsum("qd,pdh->pqh", embeddings, w1) + b1[:, None, :])
    return np.einsum("pqh,phn->pqn", hidden, w2) + b2[:, None, :]


def head_picks(theta: np.ndarray, embeddings: np.ndarray, num_agents: int, hidden_dim: int) -> np.ndarray:
    """Index of the picked agent per query for one head (the numpy twin of RouterModel's argmax)."""
    return head_logits(theta, embeddings, num_agents, hidden_dim)[0].argmax(axis=-1)
