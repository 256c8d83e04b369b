"""Converting a trainer release (manifest.json + head_weights.npy) into a router folder.

Every input is validated before anything is written: a flat, finite float vector whose length
matches embedding_dim, head_hidden_dim and the number of agents (finite also once cast to float32),
a manifest readers can use, a backbone whose hidden size is embedding_dim, and, when the release
has an out-of-distribution guard (ood_guard.safetensors next to head_weights.npy, or --ood-stats),
statistics that fit embedding_dim (see ood.load_guard) with a fallback agent of the pool. On error
nothing is written.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchgen_router.errors import InputError, first_line, setting_error
from benchgen_router.head import (
    OPERATING_HEADS_FILE,
    check_float32_finite,
    head_param_count,
    load_operating_heads,
    theta_to_state_dict,
)
from benchgen_router.manifest import DEFAULT_TRUNCATION_LENGTH, provenance, read_manifest
from benchgen_router.ood import check_fallback_agent, guard_statistics_file, load_guard
from benchgen_router.release.card import render_card
from benchgen_router.release.folder import check_output_folder, write_router_folder
from benchgen_router.release.report import GuardReport, TrainingReport

logger = logging.getLogger("benchgen_router")
# What a probability head's manifest adds (training/probability.py): the router's config holds them.
PROBABILITY_KEYS = ("head_kind", "agent_costs_per_1k", "tradeoff_calibration")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def load_theta(path: Path, expected_size: int, manifest: dict[str, Any]) -> np.ndarray:
    """The flat head vector, refusing anything that is not a finite float vector of the right size."""
    try:
        with open(path, "rb") as handle:
            magic = handle.read(6)
        if magic.startswith(b"PK"):
            raise InputError(f"{path} is an .npz archive; pass the single flat vector head_weights.npy.")
        if magic != b"\x93NUMPY":  # checked first: numpy reports any non-.npy file as "pickled data"
            raise InputError(f"{path} is not a readable .npy file (no NumPy header); pass head_weights.npy.")
        theta = np.load(path, allow_pickle=False)  # a pickled .npy is refused here, never executed
    except FileNotFoundError:
        raise InputError(f"weights file not found: {path}") from None
    except ValueError as err:
        if isinstance(err, InputError):
            raise
        if "allow_pickle" in str(err):
            raise InputError(
                f"{path} holds pickled Python objects; it must be a plain float .npy (np.save of a float array)."
            ) from None
        raise InputError(f"{path} is not a readable .npy file ({err}).") from None
    except OSError as err:
        raise InputError(f"{path} is not a readable .npy file ({err}).") from None
    if theta.ndim != 1:
        raise InputError(
            f"{path} has shape {theta.shape}; the head must be one flat 1-D vector "
            "(the weights row-major, then the bias)."
        )
    if not np.issubdtype(theta.dtype, np.floating):
        raise InputError(f"{path} has dtype {theta.dtype}; the head must be a float vector.")
    if theta.size != expected_size:
        raise InputError(
            f"{path} holds {theta.size} values but embedding_dim={manifest['embedding_dim']}, "
            f"head_hidden_dim={manifest['head_hidden_dim']} and {len(manifest['agent_order'])} agents need "
            f"{expected_size}; pass the weights that belong to this manifest."
        )
    check_float32_finite(theta, str(path))
    return theta.astype(np.float64)


def recorded_backbone(trained_on: str | None, backbone: str | None, backbone_id: str | None) -> str:
    """The backbone id a published folder names: `backbone_id`, else the one the head was trained on,
    else `backbone` itself. A local copy is where weights are read from, not what is recorded."""
    recorded = backbone_id or trained_on or backbone
    if not recorded:
        raise setting_error("the manifest names no backbone_model; pass {backbone=ID_OR_PATH}.")
    if not _HUB_ID.match(recorded) and os.path.isdir(recorded):
        logger.warning(
            "recording the local folder %s as the backbone: pass --backbone-id <Hub id> so others can load it", recorded
        )
    return recorded


def _set_guard(model: Any, guard: Any) -> Any:
    """Put the guard's statistics into the model's buffers (saved into model.safetensors with the head)."""
    import torch

    if guard is not None:
        for name, value in guard.tensors().items():
            setattr(model, name, torch.from_numpy(value.copy()))
    return model


def _head_only_router(config: Any, state: dict[str, Any]) -> Any:
    """A RouterModel holding just the head: the backbone is built on the meta device (no memory,
    no weights), since a head-only save writes only the head."""
    import torch
    from transformers import AutoModel

    from benchgen_router.model_code import RouterModel

    with torch.device("meta"):
        backbone = AutoModel.from_config(config.text_config)
    return _with_state(RouterModel(config, backbone=backbone), state)


def _with_state(model: Any, state: dict[str, Any]) -> Any:
    """The model with a release's state: the head's weights, and a probability head's calibration."""
    for name in ("head", "tradeoff", "neighbours"):
        part = {key.removeprefix(f"{name}."): value for key, value in state.items() if key.startswith(f"{name}.")}
        if part:
            getattr(model, name).load_state_dict(part)
    return model


def routing_points(report: TrainingReport) -> dict[str, dict[str, Any]]:
    """What config.json keeps of each operating point: the trade-off and its fallback agent (the
    figures stay in the training report)."""
    points = {}
    for name, point in report.operating_points.items():
        settings: dict[str, Any] = {"cost_weight": point.cost_weight, "latency_weight": point.latency_weight}
        if point.ood_fallback_agent is not None:
            settings["ood_fallback_agent"] = point.ood_fallback_agent
        points[name] = settings
    return points


def default_point(manifest: dict[str, Any]) -> str:
    return manifest.get("default_operating_point") or min(manifest["operating_points"])


def point_heads(
    manifest: dict[str, Any], theta: np.ndarray, weights_path: Path, operating_heads: Path | None = None
) -> dict[str, np.ndarray]:
    """For a release with operating points, one head per point from operating_heads.safetensors (next
    to the weights unless `operating_heads`), whose default point must be the head of head_weights.npy;
    {} for a release with one head."""
    points = manifest.get("operating_points")
    if not points:
        return {}
    source = operating_heads or Path(weights_path).with_name(OPERATING_HEADS_FILE)
    thetas = load_operating_heads(source, list(points), theta.size)
    default = default_point(manifest)
    if not np.array_equal(thetas[default], theta):
        raise InputError(
            f"{weights_path} is not the head of the default operating point '{default}' in {source}; "
            "pass the files the trainer wrote together."
        )
    return thetas


def _bundled_router(config: Any, state: dict[str, Any], source: str, revision: str | None) -> Any:
    """A RouterModel with the backbone's real weights, for a self-contained checkpoint."""
    import torch
    from transformers import AutoModel

    from benchgen_router.loading import backbone_source
    from benchgen_router.model_code import RouterModel

    try:
        weights = AutoModel.from_pretrained(
            backbone_source(source, revision), revision=revision, config=config.text_config, dtype=torch.float32
        )
    except OSError as err:
        raise InputError(
            f"cannot load the weights of backbone '{source}' to bundle them ({first_line(err)})."
        ) from None
    return _with_state(RouterModel(config, backbone=weights), state)


def release_guard(manifest: dict[str, Any], stats_file: Path, fallback: str | None = None) -> tuple[Any, GuardReport]:
    """(validated guard, its report). The fallback agent is `fallback` when given; it and the
    calibration record come from the manifest's `ood_guard` when that describes these statistics
    (same threshold), else from the file's own metadata."""
    guard = load_guard(stats_file, manifest["embedding_dim"])
    record = manifest.get("ood_guard") if isinstance(manifest.get("ood_guard"), dict) else {}
    if record.get("threshold") != guard.threshold:  # the file's own metadata, which stores text
        kinds = {"keep_share": float, "n_fit": int, "n_calibration": int}
        record = {}
        for key, kind in kinds.items():
            with contextlib.suppress(KeyError, ValueError):
                record[key] = kind(guard.metadata[key])
    fallback = fallback or record.get("fallback_agent") or guard.metadata.get("fallback_agent")
    fallback = check_fallback_agent(fallback, manifest["agent_order"], str(stats_file))
    settings = {"threshold": guard.threshold, "fallback_agent": fallback, "score": guard.metadata.get("score")}
    dropped: list[str] = []
    report = GuardReport.from_dict({**record, **settings}, f"{stats_file.name} record", dropped)
    for problem in dropped:
        logger.warning("warning: %s; left out of the training report", problem.split("; pass")[0])
    return guard, report


def check_not_backbone_folder(output_dir: Path, backbone: str) -> None:
    """Refuse to write a router over its own backbone's files (its config.json and model.safetensors
    would be replaced by the router's), whatever --overwrite says."""
    folder = Path(backbone)
    if folder.is_dir() and output_dir.is_dir() and os.path.samefile(folder, output_dir):
        raise setting_error(
            f"output folder {output_dir} is the backbone's folder ({backbone}); writing the router there would "
            "replace the backbone's own config.json and weights: pass another {output_dir}."
        )


@dataclass
class Release:
    """A trained router as the folder writer takes it, from a trainer run or a release's files."""

    agents: list[str]
    embedding_dim: int
    head_hidden_dim: int
    head: np.ndarray  # the flat head (the default operating point's, with several)
    report: TrainingReport
    point_heads: dict[str, np.ndarray] = field(default_factory=dict)  # {point: flat head}
    guard: Any = None  # ood.OODGuard, or None for a router without one
    truncation_length: int = DEFAULT_TRUNCATION_LENGTH
    query_format: dict[str, list[str]] | None = None
    pooling: str = "last-layer"  # or "every-layer": what the head reads (RouterConfig.pooling)
    # With neighbour outcomes: (k, the training rows' unit embeddings (rows, embedding_dim), their rewards).
    neighbours: tuple[int, np.ndarray, np.ndarray] | None = None
    # A probability head (head_kind "probability"): each agent's cost per 1,000 queries and the budget
    # rules' calibration, as RouterConfig takes them.
    head_kind: str = "cmaes"
    agent_costs_per_1k: list[float] | None = None
    tradeoff_calibration: dict[str, Any] | None = None

    def probability_settings(self) -> dict[str, Any]:
        """The config keys of a probability head ({} for a CMA-ES one): the calibration as the sizes of the
        tensors model.safetensors holds (state_dict)."""
        if self.head_kind != "probability":
            return {}
        from benchgen_router.tradeoffs import calibration_state

        record, _ = calibration_state(self.tradeoff_calibration, self.agents)
        return {
            "head_kind": self.head_kind,
            "agent_costs_per_1k": self.agent_costs_per_1k,
            "tradeoff_calibration": record,
        }

    def neighbour_settings(self) -> dict[str, Any]:
        """The config keys of neighbour outcomes ({} without)."""
        if self.neighbours is None:
            return {}
        k, embeddings, _ = self.neighbours
        return {"neighbour_outcomes": k, "neighbour_rows": len(embeddings)}

    def state_dict(self) -> dict[str, Any]:
        dim, count, hidden = self.embedding_dim, len(self.agents), self.head_hidden_dim
        if self.head_kind == "probability":
            from benchgen_router.tradeoffs import calibration_state

            _, tensors = calibration_state(self.tradeoff_calibration, self.agents)
            if self.neighbours is not None:  # the head reads one outcome per agent beside the embedding
                import torch

                _, embeddings, rewards = self.neighbours
                dim += count
                tensors = {
                    **tensors,
                    "neighbours.embeddings": torch.from_numpy(np.ascontiguousarray(embeddings, dtype=np.float32)),
                    "neighbours.rewards": torch.from_numpy(np.ascontiguousarray(rewards, dtype=np.float32)),
                }
            return {**theta_to_state_dict(self.head, dim, count, hidden), **tensors}
        if not self.point_heads:
            return theta_to_state_dict(self.head, dim, count, hidden)
        state: dict[str, Any] = {}
        for name, theta in self.point_heads.items():
            state.update(theta_to_state_dict(theta, dim, count, hidden, prefix=f"head.{name}."))
        return state


def read_release(
    manifest_path: Path,
    weights_path: Path,
    ood_stats: Path | None = None,
    ood_guard: bool = True,
    ood_fallback_agent: str | None = None,
    operating_heads: Path | None = None,
) -> Release:
    """A trainer release's files, each validated (see the module docstring), as one Release."""
    manifest = read_manifest(manifest_path)
    if manifest.get("neighbour_outcomes"):  # the training queries it reads are in the exported folder only
        raise InputError(
            f"{manifest_path} is a head that reads its training queries' outcomes (train --neighbour-outcomes): its "
            "router is the folder that run exported, whose model.safetensors carries those queries' embeddings and "
            "rewards; the run folder does not."
        )
    if manifest.get("finetune"):  # its head fits the trained backbone, which only the exported folder holds
        raise InputError(
            f"{manifest_path} is a head trained with its backbone (train --finetune): its router is the folder "
            "that run exported, whose model.safetensors carries the trained backbone; converting would pair the "
            "head with the untrained one."
        )
    agents = manifest["agent_order"]
    dim, hidden = manifest["embedding_dim"], manifest["head_hidden_dim"]
    theta = load_theta(Path(weights_path), head_param_count(dim, len(agents), hidden), manifest)
    heads = point_heads(manifest, theta, Path(weights_path), operating_heads)
    stats_file = guard_statistics_file(weights_path, ood_stats) if ood_guard else None
    if ood_fallback_agent is not None and stats_file is None:
        raise InputError(
            "a fallback agent was named but the release has no out-of-distribution guard to use it: "
            f"pass --ood-stats FILE{' without --no-ood-guard' if not ood_guard else ''}, or drop --ood-fallback-agent."
        )
    dropped: list[str] = []  # readers rely on the reference's reader keys only: odd provenance is left out
    record = {key: value for key, value in provenance(manifest).items() if key not in PROBABILITY_KEYS}
    report = TrainingReport.from_dict(record, Path(manifest_path).name, dropped)
    for problem in dropped:
        logger.warning("warning: %s; left out of the training report", problem.split("; pass")[0])
    guard = None
    if stats_file is not None:
        guard, report.ood_guard = release_guard(manifest, stats_file, ood_fallback_agent)
    else:
        report.ood_guard = None
    if heads:
        report.default_operating_point = default_point(manifest)
    return Release(
        agents=agents,
        embedding_dim=dim,
        head_hidden_dim=hidden,
        head=theta,
        report=report,
        point_heads=heads,
        guard=guard,
        truncation_length=manifest.get("truncation_length", DEFAULT_TRUNCATION_LENGTH),
        query_format=manifest.get("query_format"),
        pooling=manifest.get("pooling", "last-layer"),
        **probability_head(manifest, manifest_path),
    )


def probability_head(manifest: dict[str, Any], path: Path) -> dict[str, Any]:
    """A probability head's settings from its manifest, checked as the router's config checks them ({} for
    a CMA-ES head)."""
    settings = {key: manifest[key] for key in PROBABILITY_KEYS if manifest.get(key) is not None}
    if settings.get("head_kind", "cmaes") == "cmaes":
        return {}
    from benchgen_router.config_checks import HEAD_KINDS

    agents = manifest["agent_order"]
    costs = settings.get("agent_costs_per_1k")
    calibration = settings.get("tradeoff_calibration")
    if settings["head_kind"] not in HEAD_KINDS:
        problem = f"head_kind must be one of {', '.join(HEAD_KINDS)}, got {settings['head_kind']!r}"
    elif manifest["head_hidden_dim"] or manifest.get("operating_points"):
        problem = "a probability head is one linear layer, with no head_hidden_dim or operating_points"
    elif not (isinstance(costs, list) and len(costs) == len(agents) and all(_cost(c) for c in costs)):
        problem = f"agent_costs_per_1k must list {len(agents)} numbers >= 0 (USD per 1,000 queries per agent)"
    elif not (isinstance(calibration, dict) and set(calibration.get("margins", {})) == set(agents)):
        problem = "tradeoff_calibration must hold each agent's margins (training/probability.py writes it)"
    else:
        return settings
    raise InputError(f"manifest {path}: {problem}; pass the manifest the trainer wrote.")


def _cost(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < float("inf")


def write_release(
    release: Release,
    output_dir: Path,
    backbone: str | None = None,
    backbone_revision: str | None = None,
    backbone_id: str | None = None,
    bundle: bool = False,
    overwrite: bool = False,
    card_note: str | None = None,
) -> Path:
    """Write a release's router folder.

    `backbone`: where the backbone's config, tokenizer (and, with `bundle`, weights) are read from
    (default: the recorded id). The folder records `backbone_id`, else the run's backbone_model,
    else `backbone`. The run's backbone_revision applies unless another backbone id is named.
    """
    check_output_folder(Path(output_dir), overwrite)
    # Imported only now: a bad file is reported before transformers' import (seconds) starts.
    from benchgen_router.loading import load_backbone_config, load_backbone_tokenizer, router_config

    report = release.report
    recorded = recorded_backbone(report.backbone_model, backbone, backbone_id)
    source = backbone or recorded
    check_not_backbone_folder(Path(output_dir), source)
    revision = backbone_revision or (report.backbone_revision if recorded == report.backbone_model else None)
    backbone_config = load_backbone_config(source, revision)
    tokenizer = load_backbone_tokenizer(source, revision)
    states = backbone_config.num_hidden_layers + 1 if release.pooling == "every-layer" else 1
    if backbone_config.hidden_size * states != release.embedding_dim:
        reads = f"{states} hidden states of size" if states > 1 else "hidden size"
        raise InputError(
            f"backbone '{source}' has {reads} {backbone_config.hidden_size} but the head expects "
            f"embedding_dim={release.embedding_dim}; pass the backbone the head was trained on."
        )
    guard_settings = {}
    if release.guard is not None:
        guard_settings = {
            "ood_threshold": release.guard.threshold,
            "ood_fallback_agent": report.ood_guard.fallback_agent,
            "ood_score": release.guard.metadata.get("score"),
            "ood_discriminative": release.guard.discriminative,
        }
    point_settings = {}
    if release.point_heads:
        point_settings = {"operating_points": routing_points(report), "operating_point": report.default_operating_point}
    config = router_config(
        backbone_config,
        tokenizer,
        recorded,
        release.agents,
        release.head_hidden_dim,
        revision,
        truncation_length=release.truncation_length,
        query_format=release.query_format,
        pooling=release.pooling,
        bundled_backbone=bundle,
        training=report.summary(),
        # 5.x names generic tokenizer.json tokenizers "TokenizersBackend", a class 4.x does not have.
        tokenizer_class=type(tokenizer).__name__.replace("TokenizersBackend", "PreTrainedTokenizerFast"),
        architectures=["RouterModel"],
        **guard_settings,
        **point_settings,
        **release.probability_settings(),
        **release.neighbour_settings(),
    )
    config.dtype = "float32"  # the reference embeds in float32; "auto" loading resolves to this
    state = release.state_dict()
    model = _bundled_router(config, state, source, revision) if bundle else _head_only_router(config, state)
    _set_guard(model, release.guard)
    card = render_card(config, report, recorded, revision, note=card_note)
    write_router_folder(Path(output_dir), model, tokenizer, card, report, overwrite=overwrite)
    logger.info("wrote %s (%s agents, %s head parameters)", output_dir, len(release.agents), release.head.size)
    return Path(output_dir)


def convert_release(
    manifest_path: Path,
    weights_path: Path,
    output_dir: Path,
    backbone: str | None = None,
    backbone_revision: str | None = None,
    backbone_id: str | None = None,
    bundle: bool = False,
    overwrite: bool = False,
    card_note: str | None = None,
    ood_stats: Path | None = None,
    ood_guard: bool = True,
    ood_fallback_agent: str | None = None,
    operating_heads: Path | None = None,
) -> Path:
    """Validate a release's files, then write its router folder (read_release, then write_release).
    The guard's statistics come from `ood_stats`, else ood_guard.safetensors next to the weights
    when present; `ood_guard=False` leaves them out."""
    release = read_release(manifest_path, weights_path, ood_stats, ood_guard, ood_fallback_agent, operating_heads)
    return write_release(release, output_dir, backbone, backbone_revision, backbone_id, bundle, overwrite, card_note)
