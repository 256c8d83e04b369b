"""Converting a trainer release (manifest.json + head_weights.npy) into a router folder.

Every input is validated before anything is written: a flat, finite float vector whose length
matches embedding_dim, head_hidden_dim and the number of agents (finite also once cast to float32),
a manifest readers can use, a backbone whose hidden size is embedding_dim, and, when the release
has an out-of-distribution guard (ood_guard.safetensors next to head_weights.npy, or --ood-stats),
statistics that fit embedding_dim (see ood.load_guard) with a fallback agent of the pool. On error
nothing is written.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from benchgen_router.errors import InputError, first_line
from benchgen_router.folder import check_output_folder, render_card, write_router_folder
from benchgen_router.head import (
    OPERATING_HEADS_FILE,
    check_float32_finite,
    head_param_count,
    load_operating_heads,
    theta_to_state_dict,
)
from benchgen_router.manifest import DEFAULT_TRUNCATION_LENGTH, provenance, read_manifest
from benchgen_router.ood import check_fallback_agent, guard_statistics_file, load_guard

logger = logging.getLogger("benchgen_router")
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


def recorded_backbone(manifest: dict[str, Any], backbone: str | None, backbone_id: str | None) -> str:
    """The backbone id a published folder names: --backbone-id, else the manifest's backbone_model,
    else --backbone itself. A local copy is where weights are read from, not what is recorded."""
    recorded = backbone_id or manifest.get("backbone_model") or backbone
    if not recorded:
        raise InputError("the manifest names no backbone_model; pass --backbone ID_OR_PATH.")
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
    model = RouterModel(config, backbone=backbone)
    model.head.load_state_dict({key.removeprefix("head."): value for key, value in state.items()})
    return model


def operating_point_settings(manifest: dict[str, Any]) -> dict[str, Any]:
    """The RouterConfig settings of a release's operating points (none when it has one head): each
    point's weights and its cross-validated figures, and the default point."""
    points = manifest.get("operating_points")
    if not points:
        return {}
    return {
        "operating_points": {name: dict(settings) for name, settings in points.items()},
        "operating_point": manifest.get("default_operating_point") or min(points),
    }


def head_state(
    manifest: dict[str, Any], theta: np.ndarray, weights_path: Path, operating_heads: Path | None = None
) -> dict[str, Any]:
    """The head's state dict: the one head of head_weights.npy, or, for a release with operating points,
    one head per point from operating_heads.safetensors (next to the weights unless `operating_heads`),
    whose default point must be the head of head_weights.npy."""
    agents, dim, hidden = manifest["agent_order"], manifest["embedding_dim"], manifest["head_hidden_dim"]
    settings = operating_point_settings(manifest)
    if not settings:
        return theta_to_state_dict(theta, dim, len(agents), hidden)
    source = operating_heads or Path(weights_path).with_name(OPERATING_HEADS_FILE)
    names = list(settings["operating_points"])
    thetas = load_operating_heads(source, names, theta.size)
    default = settings["operating_point"]
    if not np.array_equal(thetas[default], theta):
        raise InputError(
            f"{weights_path} is not the head of the default operating point '{default}' in {source}; "
            "pass the files the trainer wrote together."
        )
    state: dict[str, Any] = {}
    for name in names:
        state.update(theta_to_state_dict(thetas[name], dim, len(agents), hidden, prefix=f"head.{name}."))
    return state


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
    model = RouterModel(config, backbone=weights)
    model.head.load_state_dict({key.removeprefix("head."): value for key, value in state.items()})
    return model


def release_guard(
    manifest: dict[str, Any], stats_file: Path, fallback: str | None = None
) -> tuple[Any, dict[str, Any]]:
    """(validated guard, its RouterConfig settings). The fallback agent is `fallback` when given;
    it and the calibration record come from the manifest's `ood_guard` when that describes these
    statistics (same threshold), else from the file's own metadata."""
    guard = load_guard(stats_file, manifest["embedding_dim"])
    record = manifest.get("ood_guard") if isinstance(manifest.get("ood_guard"), dict) else {}
    if record.get("threshold") != guard.threshold:
        record = {key: guard.metadata[key] for key in ("keep_share", "n_fit", "n_calibration") if key in guard.metadata}
    fallback = fallback or record.get("fallback_agent") or guard.metadata.get("fallback_agent")
    return guard, {
        "ood_threshold": guard.threshold,
        "ood_fallback_agent": check_fallback_agent(fallback, manifest["agent_order"], str(stats_file)),
        "ood_score": guard.metadata.get("score"),
        "ood_discriminative": guard.discriminative,
        "ood_calibration": {key: value for key, value in record.items() if key != "file"},
    }


def check_not_backbone_folder(output_dir: Path, backbone: str) -> None:
    """Refuse to write a router over its own backbone's files (its config.json and model.safetensors
    would be replaced by the router's), whatever --overwrite says."""
    folder = Path(backbone)
    if folder.is_dir() and output_dir.is_dir() and os.path.samefile(folder, output_dir):
        raise InputError(
            f"output folder {output_dir} is the backbone's folder ({backbone}); writing the router there would "
            "replace the backbone's own config.json and weights: pass another --output-dir."
        )


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
    """Validate a release, then write its router folder.

    `backbone`: where the backbone's config, tokenizer (and, with `bundle`, weights) are read from
    (default: the recorded id). The folder records `backbone_id`, else the manifest's
    backbone_model, else `backbone`. The manifest's backbone_revision applies unless another
    backbone id is named. The guard's statistics come from `ood_stats`, else ood_guard.safetensors
    next to the weights when present; `ood_guard=False` leaves them out. A release with operating
    points carries their heads in operating_heads.safetensors (or `operating_heads`).
    """
    manifest = read_manifest(manifest_path)
    agents = manifest["agent_order"]
    dim, hidden = manifest["embedding_dim"], manifest["head_hidden_dim"]
    theta = load_theta(Path(weights_path), head_param_count(dim, len(agents), hidden), manifest)
    state = head_state(manifest, theta, Path(weights_path), operating_heads)
    guard, guard_settings = None, {}
    stats_file = guard_statistics_file(weights_path, ood_stats) if ood_guard else None
    if ood_fallback_agent is not None and stats_file is None:
        raise InputError(
            "a fallback agent was named but the release has no out-of-distribution guard to use it: "
            f"pass --ood-stats FILE{' without --no-ood-guard' if not ood_guard else ''}, or drop --ood-fallback-agent."
        )
    if stats_file is not None:
        guard, guard_settings = release_guard(manifest, stats_file, ood_fallback_agent)
    check_output_folder(Path(output_dir), overwrite)
    # Imported only now: a bad file is reported before transformers' import (seconds) starts.
    from benchgen_router.loading import load_backbone_config, load_backbone_tokenizer, router_config

    recorded = recorded_backbone(manifest, backbone, backbone_id)
    source = backbone or recorded
    check_not_backbone_folder(Path(output_dir), source)
    same_id = recorded == manifest.get("backbone_model")
    revision = backbone_revision or (manifest.get("backbone_revision") if same_id else None)
    backbone_config = load_backbone_config(source, revision)
    tokenizer = load_backbone_tokenizer(source, revision)
    if backbone_config.hidden_size != dim:
        raise InputError(
            f"backbone '{source}' has hidden size {backbone_config.hidden_size} but the head expects "
            f"embedding_dim={dim}; pass the backbone the head was trained on."
        )
    # 5.x names generic tokenizer.json tokenizers "TokenizersBackend", a class 4.x does not have.
    tokenizer_class = type(tokenizer).__name__.replace("TokenizersBackend", "PreTrainedTokenizerFast")
    config = router_config(
        backbone_config,
        tokenizer,
        recorded,
        agents,
        hidden,
        revision,
        truncation_length=manifest.get("truncation_length", DEFAULT_TRUNCATION_LENGTH),
        query_format=manifest.get("query_format"),
        bundled_backbone=bundle,
        training=provenance(manifest),
        tokenizer_class=tokenizer_class,
        architectures=["RouterModel"],
        **guard_settings,
        **operating_point_settings(manifest),
    )
    config.dtype = "float32"  # the reference embeds in float32; "auto" loading resolves to this
    model = _bundled_router(config, state, source, revision) if bundle else _head_only_router(config, state)
    _set_guard(model, guard)
    card = render_card(config, recorded, revision, note=card_note)
    write_router_folder(Path(output_dir), model, tokenizer, card, overwrite=overwrite)
    logger.info("wrote %s (%s agents, %s head parameters)", output_dir, len(agents), theta.size)
    return Path(output_dir)
