"""Convert a trainer release (manifest.json + head_weights.npy) into a Hugging Face Hub model folder.

    python convert_npy.py --manifest manifest.json --weights head_weights.npy --output-dir router/

The folder holds config.json, model.safetensors (the head only, or backbone + head with
--bundle-backbone), the two remote-code files, the backbone's tokenizer and a model card, and
loads with AutoModel.from_pretrained(folder, trust_remote_code=True) or the text-classification
pipeline. Every input is validated before anything is written; on error nothing is left behind.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from router_utils import (
    PROJECT_ROOT,
    REFERENCE_MAX_LENGTH,
    UsageError,
    first_line,
    head_param_count,
    load_backbone_config,
    load_backbone_tokenizer,
    read_json,
    router_config,
    run_cli,
    staging_dir,
    theta_to_state_dict,
)

logger = logging.getLogger("benchgen_router.convert")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--manifest", required=True, type=Path, help="manifest.json written by the trainer")
    parser.add_argument("--weights", required=True, type=Path, help="head_weights.npy: flat float vector theta")
    parser.add_argument("--output-dir", required=True, type=Path, help="folder to write the Hub repo into")
    parser.add_argument("--backbone", help="backbone Hub id or local folder (default: manifest's backbone_model)")
    parser.add_argument("--backbone-revision", help="pin the backbone to this revision (branch, tag or commit)")
    parser.add_argument(
        "--bundle-backbone", action="store_true", help="store the backbone's weights in model.safetensors too"
    )
    parser.add_argument("--push-to-hub", metavar="REPO_ID", help="upload the folder to this Hub model repo")
    return parser.parse_args(argv)


# ---------------------------------------------------------------------------------------------
# Validation


def validate_manifest(manifest: Any, path: Path) -> dict[str, Any]:
    if not isinstance(manifest, dict):
        raise UsageError(f"manifest {path} must be a JSON object with agent_order, embedding_dim, head_hidden_dim.")
    for key in ("agent_order", "embedding_dim", "head_hidden_dim"):
        if key not in manifest:
            raise UsageError(f"manifest {path} has no '{key}'; pass the manifest.json the trainer wrote.")
    agents = manifest["agent_order"]
    if not isinstance(agents, list) or not agents:
        raise UsageError(f"manifest {path}: agent_order must be a non-empty list of agent ids.")
    if not all(isinstance(a, str) and a.strip() for a in agents):
        raise UsageError(f"manifest {path}: every agent id in agent_order must be a non-empty string.")
    duplicates = sorted({a for a in agents if agents.count(a) > 1})
    if duplicates:
        raise UsageError(f"manifest {path}: agent_order repeats {duplicates}; each agent id must appear once.")
    for key, minimum in (("embedding_dim", 1), ("head_hidden_dim", 0)):
        value = manifest[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise UsageError(f"manifest {path}: {key} must be an integer >= {minimum}, got {value!r}.")
    return manifest


def load_theta(path: Path, expected_size: int, manifest: dict[str, Any]) -> np.ndarray:
    """The flat head vector, refusing anything that is not a finite float vector of the right size."""
    try:
        with open(path, "rb") as handle:
            magic = handle.read(6)
        if magic.startswith(b"PK"):
            raise UsageError(f"{path} is an .npz archive; pass the single flat vector head_weights.npy.")
        if magic != b"\x93NUMPY":  # checked first: numpy reports any non-.npy file as "pickled data"
            raise UsageError(f"{path} is not a readable .npy file (no NumPy header); pass head_weights.npy.")
        theta = np.load(path, allow_pickle=False)  # a pickled .npy is refused here, never executed
    except FileNotFoundError:
        raise UsageError(f"weights file not found: {path}") from None
    except ValueError as err:
        if "allow_pickle" in str(err):
            raise UsageError(
                f"{path} holds pickled Python objects; it must be a plain float .npy (np.save of a float array)."
            ) from None
        raise UsageError(f"{path} is not a readable .npy file ({err}).") from None
    except OSError as err:
        raise UsageError(f"{path} is not a readable .npy file ({err}).") from None
    if theta.ndim != 1:
        raise UsageError(f"{path} has shape {theta.shape}; the head must be one flat 1-D vector (REFERENCE.md layout).")
    if not np.issubdtype(theta.dtype, np.floating):
        raise UsageError(f"{path} has dtype {theta.dtype}; the head must be a float vector.")
    if theta.size != expected_size:
        raise UsageError(
            f"{path} holds {theta.size} values but embedding_dim={manifest['embedding_dim']}, "
            f"head_hidden_dim={manifest['head_hidden_dim']} and {len(manifest['agent_order'])} agents need "
            f"{expected_size}; pass the weights that belong to this manifest."
        )
    if not np.isfinite(theta).all():
        bad = int((~np.isfinite(theta)).sum())
        raise UsageError(f"{path} holds {bad} NaN or infinite values; retrain or pass the right file.")
    return theta.astype(np.float64)


# ---------------------------------------------------------------------------------------------
# Output


def model_card(config: Any, manifest: dict[str, Any], backbone: str, revision: str | None, bundled: bool) -> str:
    """README.md with Hub metadata and what a user needs to know before routing with it."""
    agents = config.agent_order
    baselines = manifest.get("baselines") or {}
    head = (
        "linear (logits = embedding @ W + b)"
        if config.head_hidden_dim == 0
        else (f"MLP (tanh hidden layer of {config.head_hidden_dim})")
    )
    n_params = head_param_count(config.embedding_dim, len(agents), config.head_hidden_dim)

    def figure(value: Any) -> str:
        return "n/a" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)

    rows = [
        ("rewards dataset", manifest.get("rewards_dataset")),
        ("rows (train / held out)", f"{manifest.get('n_train', 'n/a')} / {manifest.get('n_test', 'n/a')}"),
        ("train reward", figure(manifest.get("train_reward"))),
        ("held-out reward (router)", figure(manifest.get("test_reward"))),
        ("held-out best fixed agent", figure(baselines.get("best_fixed_agent"))),
        ("held-out uniform random", figure(baselines.get("random_agent"))),
        ("held-out oracle", figure(baselines.get("oracle"))),
        ("beats best fixed agent", manifest.get("beats_best_fixed_agent", "n/a")),
        ("CMA-ES generations", manifest.get("cma_generations_run", "n/a")),
    ]
    if (cv := manifest.get("cross_validation")) is not None:
        rows.append((f"{cv.get('folds')}-fold CV reward (router)", f"{cv['router_mean']:.4f} ± {cv['router_std']:.4f}"))
        rows.append((f"{cv.get('folds')}-fold CV best fixed agent", f"{cv['best_fixed_mean']:.4f}"))
    table = "\n".join(f"| {name} | {value} |" for name, value in rows)
    pool = "\n".join(f"| {i} | `{agent}` |" for i, agent in enumerate(agents))
    revision_line = f" at revision `{revision}`" if revision else ""
    weights_line = (
        "`model.safetensors` holds the backbone and the head: this folder loads with no other repository."
        if bundled
        else f"`model.safetensors` holds only the head ({n_params:,} values); the backbone's weights load from "
        f"`{backbone}`{revision_line} through the normal Hub cache."
    )
    return f"""---
library_name: transformers
pipeline_tag: text-classification
base_model: {backbone}
license: apache-2.0
tags:
- router
- model-routing
- benchgen
- cma-es
---

# {manifest.get("model_id", "BenchGen Router Lite")}

A router, not a chat model: a frozen `{backbone}` backbone embeds a query (masked mean of the last
hidden state, {config.embedding_dim}-d), a tiny head scores the {len(agents)} agents of a pool, and the
highest-scoring agent is the one that should answer. The head is {head}, {n_params:,} parameters,
trained gradient-free with separable CMA-ES against a measured reward matrix.

{weights_line}

## Pool (logit order)

| index | agent id |
| ---: | --- |
{pool}

The ids are stable names; which real model answers for each is a serving-time mapping.

## Training figures (from the trainer's manifest)

| | |
| --- | ---: |
{table}

## Usage

```python
from transformers import AutoModel, AutoTokenizer, pipeline

router = pipeline("text-classification", model="<this repo>", trust_remote_code=True)
router("What is the derivative of x^3 + 2x?")  # [{{'label': '<agent id>', 'score': ...}}]

tokenizer = AutoTokenizer.from_pretrained("<this repo>", trust_remote_code=True)
model = AutoModel.from_pretrained("<this repo>", trust_remote_code=True)
logits = model(**tokenizer(["a query"], return_tensors="pt")).logits
picked = model.config.id2label[int(logits.argmax(-1))]
```

Queries are truncated to {config.truncation_length} tokens, as in training. An empty query (no tokens
besides the tokenizer's special ones) raises a `ValueError`. The backbone runs in float32 unless
`dtype=` asks otherwise.

## Limitations

- In-distribution only: trained on English math, knowledge and reasoning prompts; far outside
  that, the pick is closer to arbitrary than a routing decision.
- Pool-specific: it chooses only between the agents above, in that order. A new pool needs retraining.
- Small data: held-out figures come from few labelled tasks and are directional.
"""


# Files a conversion writes besides config, code and card: removed from the output folder first, so
# stale weights (old shards, an index) or another backbone's tokenizer files never survive next to the new ones.
REPLACED_PATTERNS = (
    "model*.safetensors*",
    "pytorch_model*.bin*",
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.*",
    "merges.txt",
    "chat_template.*",
)


def validate_provenance(manifest: dict[str, Any], path: Path) -> None:
    """The optional keys the converter reads beyond the reference's four must have the right shape."""
    limit = manifest.get("truncation_length", REFERENCE_MAX_LENGTH)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise UsageError(f"manifest {path}: truncation_length must be a positive integer, got {limit!r}.")
    for key in ("baselines", "cross_validation"):
        if key in manifest and manifest[key] is not None and not isinstance(manifest[key], dict):
            raise UsageError(f"manifest {path}: {key} must be a JSON object, got {manifest[key]!r}.")
    cv = manifest.get("cross_validation") or {}
    missing = [k for k in ("folds", "router_mean", "router_std", "best_fixed_mean") if cv and k not in cv]
    if missing:
        raise UsageError(f"manifest {path}: cross_validation lacks {missing}; pass the manifest the trainer wrote.")


def convert(args: argparse.Namespace, load_from: str | None = None) -> Path:
    """Validate, then write the Hub folder. load_from: where to read the backbone's config, tokenizer
    (and weights when bundling) if not from the recorded id itself, e.g. a local copy of it."""
    manifest = validate_manifest(read_json(args.manifest, "manifest"), args.manifest)
    agents = manifest["agent_order"]
    dim, hidden = manifest["embedding_dim"], manifest["head_hidden_dim"]
    theta = load_theta(args.weights, head_param_count(dim, len(agents), hidden), manifest)
    backbone = args.backbone or manifest.get("backbone_model")
    if not backbone:
        raise UsageError(f"manifest {args.manifest} names no backbone_model; pass --backbone ID_OR_PATH.")

    validate_provenance(manifest, args.manifest)
    # The trainer pins the revision it embedded with; it applies unless another backbone is named.
    revision = args.backbone_revision or (None if args.backbone else manifest.get("backbone_revision"))
    backbone_config = load_backbone_config(load_from or backbone, revision)
    tokenizer = load_backbone_tokenizer(load_from or backbone, revision)
    backbone_config._name_or_path = backbone  # the recorded id, also when read from a local copy
    if backbone_config.hidden_size != dim:
        raise UsageError(
            f"backbone '{backbone}' has hidden size {backbone_config.hidden_size} but the head expects "
            f"embedding_dim={dim}; pass the backbone the head was trained on."
        )

    from modeling_router import AUTO_MAP, CODE_FILES

    provenance_keys = (
        "model_id",
        "backbone_model",
        "rewards_dataset",
        "n_head_params",
        "n_total",
        "n_train",
        "n_test",
        "train_reward",
        "test_reward",
        "baselines",
        "beats_best_fixed_agent",
        "cma_generations_run",
        "duration_seconds",
        "cross_validation",
    )
    # 5.x names generic tokenizer.json tokenizers "TokenizersBackend", a class 4.x does not have.
    tokenizer_class = type(tokenizer).__name__.replace("TokenizersBackend", "PreTrainedTokenizerFast")
    config = router_config(
        backbone_config,
        tokenizer,
        backbone,
        agents,
        hidden,
        revision,
        truncation_length=manifest.get("truncation_length", REFERENCE_MAX_LENGTH),
        bundled_backbone=args.bundle_backbone,
        training={key: manifest[key] for key in provenance_keys if key in manifest},
        tokenizer_class=tokenizer_class,
        architectures=["RouterModel"],
    )
    config.dtype = "float32"  # the reference embeds in float32; "auto" loading resolves to this

    with staging_dir(args.output_dir) as staging:
        state = theta_to_state_dict(theta, dim, len(agents), hidden)
        if args.bundle_backbone:
            save_bundled(config, state, load_from or backbone, revision, staging)
        else:
            from safetensors.torch import save_file

            config.auto_map = dict(AUTO_MAP)
            config.save_pretrained(staging)
            save_file(state, str(staging / "model.safetensors"), metadata={"format": "pt"})
            for name in CODE_FILES:
                shutil.copyfile(PROJECT_ROOT / name, staging / name)
        tokenizer.save_pretrained(staging)
        tokenizer_config = staging / "tokenizer_config.json"
        if tokenizer_config.exists():
            tokenizer_config.write_text(
                tokenizer_config.read_text().replace('"TokenizersBackend"', f'"{tokenizer_class}"')
            )
        (staging / "README.md").write_text(
            model_card(config, manifest, backbone, revision, args.bundle_backbone), encoding="utf-8"
        )
        if args.output_dir.is_dir():
            for pattern in REPLACED_PATTERNS:
                for stale in args.output_dir.glob(pattern):
                    stale.unlink()
    logger.info("wrote %s (%s agents, %s head parameters)", args.output_dir, len(agents), theta.size)
    return args.output_dir


def save_bundled(config: Any, state: dict, backbone: str, revision: str | None, staging: Path) -> None:
    """Load the backbone once and save it with the head as one self-contained checkpoint."""
    import torch
    from transformers import AutoModel

    from modeling_router import RouterModel

    try:
        weights = AutoModel.from_pretrained(backbone, revision=revision, config=config.text_config, dtype=torch.float32)
    except OSError as err:
        raise UsageError(
            f"cannot load the weights of backbone '{backbone}' to bundle them ({first_line(err)})."
        ) from None
    model = RouterModel(config, backbone=weights)
    model.head.load_state_dict({key.removeprefix("head."): value for key, value in state.items()})
    model.save_pretrained(staging)


def push_to_hub(folder: Path, repo_id: str) -> str:
    """Upload the converted folder with huggingface_hub (token from the usual HF_TOKEN / login)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    api = HfApi()
    try:
        api.create_repo(repo_id, repo_type="model", exist_ok=True)
        commit = api.upload_folder(
            folder_path=str(folder),
            repo_id=repo_id,
            repo_type="model",
            commit_message="Upload BenchGen router (convert_npy.py)",
        )
    except (HfHubHTTPError, OfflineModeIsEnabled, OSError, ValueError) as err:
        raise UsageError(
            f"wrote {folder} but could not push it to '{repo_id}' ({first_line(err)}); check the network and "
            "`huggingface-cli login` (or HF_TOKEN), then rerun."
        ) from None
    logger.info("pushed %s to %s", folder, repo_id)
    return str(commit)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    folder = convert(args)
    if args.push_to_hub:
        push_to_hub(folder, args.push_to_hub)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
