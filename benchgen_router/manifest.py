"""The manifest schema, in one place: what the trainer writes next to head_weights.npy and the
converter reads (docs/reference.md, "manifest.json").

Readers depend only on READER_KEYS; everything else is provenance, which the converter keeps as
the router's training report (release/report.py).
"""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Any

from benchgen_router.errors import InputError
from benchgen_router.files import read_json

# What a reader of a manifest may rely on.
READER_KEYS = ("agent_order", "embedding_dim", "head_hidden_dim", "backbone_model")
# The reference trainer's keys, in its order; the first three are required.
REFERENCE_KEYS = (
    "model_id",
    "backbone_model",
    "rewards_dataset",
    "agent_order",
    "embedding_dim",
    "head_hidden_dim",
    "n_head_params",
    "n_total",
    "n_train",
    "n_test",
    "train_reward",
    "test_reward",
    "baselines",
    "beats_best_fixed_agent",
    "cma_generations_run",
    "history",
    "duration_seconds",
)
REQUIRED_KEYS = ("agent_order", "embedding_dim", "head_hidden_dim")
# Keys this project's trainer adds: how it held rows out, what it measured, how it searched.
PROJECT_KEYS = (
    "backbone_revision",
    "held_out",
    "truncation_length",
    "query_format",
    "evaluation",
    "cross_validation",
    "cma",
    "timings",
    "ood_guard",
    "operating_points",
    "default_operating_point",
    "frontier",
    "target_mode",
    "pooling",
    "neighbour_outcomes",
)
# The structure of the head and its inputs, which the router's config holds; the rest is the report.
STRUCTURE_KEYS = ("agent_order", "embedding_dim", "head_hidden_dim", "query_format", "pooling", "neighbour_outcomes")
# What the head reads (RouterConfig.POOLINGS, which the remote code keeps to itself): the last hidden state's
# mean, the reference's, or every hidden state's mean side by side. A manifest without "pooling" is the first.
POOLINGS = ("last-layer", "every-layer")
DEFAULT_TRUNCATION_LENGTH = 1024  # docs/reference.md: truncation=True, max_length=1024


def agent_id_problem(agent: Any) -> str | None:
    """Why `agent` cannot be an agent id (it becomes a label, a JSON key and a card line), or None."""
    if not isinstance(agent, str) or not agent.strip():
        return "every agent id in agent_order must be a non-empty string"
    if any(unicodedata.category(ch).startswith("C") for ch in agent):
        return f"agent id {agent!r} holds a newline or control character"
    return None


def validate_manifest(manifest: Any, path: str | Path) -> dict[str, Any]:
    """The manifest if readers can use it; one clear line naming the first problem otherwise."""
    if not isinstance(manifest, dict):
        raise InputError(f"manifest {path} must be a JSON object with agent_order, embedding_dim, head_hidden_dim.")
    for key in REQUIRED_KEYS:
        if key not in manifest:
            raise InputError(f"manifest {path} has no '{key}'; pass the manifest.json the trainer wrote.")
    agents = manifest["agent_order"]
    if not isinstance(agents, list) or not agents:
        raise InputError(f"manifest {path}: agent_order must be a non-empty list of agent ids.")
    for agent in agents:
        if problem := agent_id_problem(agent):
            raise InputError(f"manifest {path}: {problem}.")
    duplicates = sorted({a for a in agents if agents.count(a) > 1})
    if duplicates:
        raise InputError(f"manifest {path}: agent_order repeats {duplicates}; each agent id must appear once.")
    for key, minimum in (("embedding_dim", 1), ("head_hidden_dim", 0)):
        value = manifest[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise InputError(f"manifest {path}: {key} must be an integer >= {minimum}, got {value!r}.")
    backbone = manifest.get("backbone_model")
    if backbone is not None and (not isinstance(backbone, str) or not backbone.strip()):
        raise InputError(f"manifest {path}: backbone_model must be a Hub id or folder name, got {backbone!r}.")
    if manifest.get("query_format") is not None:
        from benchgen_router.config_checks import check_query_format

        try:
            check_query_format(manifest["query_format"])
        except ValueError as err:
            raise InputError(f"manifest {path}: {err}") from None
    limit = manifest.get("truncation_length", DEFAULT_TRUNCATION_LENGTH)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise InputError(f"manifest {path}: truncation_length must be a positive integer, got {limit!r}.")
    if manifest.get("pooling", POOLINGS[0]) not in POOLINGS:
        raise InputError(f"manifest {path}: pooling must be one of {', '.join(POOLINGS)}, got {manifest['pooling']!r}.")
    check_operating_points(manifest, path)
    return manifest


def check_operating_points(manifest: dict[str, Any], path: str | Path) -> None:
    """operating_points: {name: {"cost_weight", "latency_weight", ...}} with default_operating_point among them."""
    points = manifest.get("operating_points")
    if points is None:
        if manifest.get("default_operating_point") is not None:
            raise InputError(f"manifest {path} names a default_operating_point but has no operating_points.")
        return
    from benchgen_router.config_checks import check_operating_points as check_points  # the config's rule

    if not isinstance(points, dict) or not points:
        raise InputError(f"manifest {path}: operating_points must be a non-empty object of name -> weights.")
    try:
        check_points(points)
    except ValueError as err:
        raise InputError(f"manifest {path}: {err}") from None
    default = manifest.get("default_operating_point", min(points))
    if default not in points:
        raise InputError(
            f"manifest {path}: default_operating_point {default!r} is not one of its operating points {list(points)}."
        )


def read_manifest(path: str | Path) -> dict[str, Any]:
    return validate_manifest(read_json(path, "manifest"), path)


def provenance(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest's provenance: every key but the head's structure, for the training report."""
    return {key: value for key, value in manifest.items() if key not in STRUCTURE_KEYS}


def make_manifest(**fields: Any) -> dict[str, Any]:
    """A manifest in schema order from the trainer's fields; a key the schema lacks is a bug here."""
    unknown = set(fields) - set(REFERENCE_KEYS) - set(PROJECT_KEYS)
    if unknown:
        raise KeyError(f"not manifest keys: {sorted(unknown)}")
    ordered = {key: fields[key] for key in REFERENCE_KEYS + PROJECT_KEYS if key in fields}
    return validate_manifest(ordered, "(being written)")
