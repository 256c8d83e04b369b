"""Helpers shared by the command-line tools (convert, train, evaluate, route, benchmark).

Not part of the Hub package: the two remote-code files stay self-contained.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger("benchgen_router")

PROJECT_ROOT = Path(__file__).resolve().parent
REFERENCE_MAX_LENGTH = 1024


class UsageError(Exception):
    """A problem with the user's input: reported as one line naming the problem and the fix."""


def run_cli(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """Run a tool's main(): bad input becomes one 'error: ...' line on stderr and exit code 2."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        return main(argv)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


# ---------------------------------------------------------------------------------------------
# The head's flat parameter vector (REFERENCE.md "Head"): the trainer's and the converter's format.


def head_param_count(embedding_dim: int, num_agents: int, hidden_dim: int) -> int:
    if hidden_dim == 0:
        return embedding_dim * num_agents + num_agents
    return embedding_dim * hidden_dim + hidden_dim + hidden_dim * num_agents + num_agents


def unflatten_theta(theta: np.ndarray, embedding_dim: int, num_agents: int, hidden_dim: int) -> list[np.ndarray]:
    """Split theta into [W, b] (linear) or [W1, b1, W2, b2] (MLP), each W as (in, out), in order."""
    if hidden_dim == 0:
        shapes = [(embedding_dim, num_agents), (num_agents,)]
    else:
        shapes = [(embedding_dim, hidden_dim), (hidden_dim,), (hidden_dim, num_agents), (num_agents,)]
    parts, start = [], 0
    for shape in shapes:
        size = int(np.prod(shape))
        parts.append(theta[start : start + size].reshape(shape))
        start += size
    return parts


def theta_to_state_dict(theta: np.ndarray, embedding_dim: int, num_agents: int, hidden_dim: int) -> dict:
    """The RouterModel head's state dict (float32, `head.` prefix); nn.Linear stores W transposed."""
    import torch

    parts = unflatten_theta(theta, embedding_dim, num_agents, hidden_dim)
    names = ["head.weight", "head.bias"] if hidden_dim == 0 else [
        "head.0.weight", "head.0.bias", "head.2.weight", "head.2.bias"
    ]
    return {
        name: torch.from_numpy(np.ascontiguousarray(part.T if part.ndim == 2 else part, dtype=np.float32))
        for name, part in zip(names, parts)
    }


def head_logits(thetas: np.ndarray, embeddings: np.ndarray, num_agents: int, hidden_dim: int) -> np.ndarray:
    """Logits of many candidate heads at once: thetas (P, n_params), embeddings (Q, D) -> (P, Q, N)."""
    thetas = np.atleast_2d(thetas)
    dim = embeddings.shape[1]
    parts = [np.stack(p) for p in zip(*(unflatten_theta(t, dim, num_agents, hidden_dim) for t in thetas))]
    if hidden_dim == 0:
        weight, bias = parts
        return np.einsum("qd,pdn->pqn", embeddings, weight) + bias[:, None, :]
    w1, b1, w2, b2 = parts
    hidden = np.tanh(np.einsum("qd,pdh->pqh", embeddings, w1) + b1[:, None, :])
    return np.einsum("pqh,phn->pqn", hidden, w2) + b2[:, None, :]


# ---------------------------------------------------------------------------------------------
# Files


def read_json(path: str | os.PathLike, what: str) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{what} not found: {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UsageError(f"{what} {path} is not valid JSON ({err}); pass the file the tool wrote.") from None


def read_jsonl(path: str | os.PathLike, what: str) -> list[dict[str, Any]]:
    """All rows of a JSON-lines file; a malformed line is an error naming its line number."""
    rows = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise UsageError(f"{what} not found: {path}") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise UsageError(f"{what} {path} line {number} is not valid JSON ({err.msg}); fix or remove it.") from None
        if not isinstance(row, dict):
            raise UsageError(f"{what} {path} line {number} is not a JSON object; each line must be one.")
        rows.append(row)
    return rows


@contextlib.contextmanager
def staging_dir(final_dir: str | os.PathLike) -> Iterator[Path]:
    """A temporary folder beside final_dir; on success its files are moved into final_dir.

    On any error the temporary folder is removed and final_dir is left as it was, so a failed run
    never leaves half-written output.
    """
    final = Path(final_dir)
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{final.name}.tmp-", dir=final.parent) as tmp:
        yield Path(tmp)
        final.mkdir(parents=True, exist_ok=True)
        for source in sorted(Path(tmp).rglob("*")):
            if source.is_file():
                target = final / source.relative_to(tmp)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(source, target)


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, mode: str = "w") -> Iterator[Any]:
    """Open a temporary file next to path; it replaces path only if the block finishes."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as handle:
            yield handle
        os.replace(tmp, final)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
