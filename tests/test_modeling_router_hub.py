"""The real Hub code path with local folders: repo ids resolved through a Hugging Face cache,
revisions of the router and of the backbone, cache_dir, offline mode, and loading options."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer, pipeline

from helpers import AGENTS, build_backbone, convert_release, make_queries, write_release
from reference_impl import ReferenceRouter

QUERIES = make_queries(12, seed=21)


def install_in_hub_cache(folder: Path, repo_id: str, cache_dir: Path, commit: str, refs: tuple[str, ...] = ()) -> None:
    """Lay folder out as huggingface_hub's cache does for repo_id at commit (refs point to it)."""
    repo = cache_dir / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(folder, repo / "snapshots" / commit)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)


def commit_id(n: int) -> str:
    return f"{n:040x}"


@pytest.fixture(scope="module")
def hub(tmp_path_factory, tokenizer_dir):
    """A cache holding backbone 'acme/tiny-qwen3' (main and tag v2, different weights) and router
    'acme/router' (main and tag v1, different heads), the router pinned to backbone revision v2."""

    root = tmp_path_factory.mktemp("hub")
    cache = root / "cache"
    backbones = {
        rev: build_backbone(root / f"backbone-{rev}", tokenizer_dir, seed=seed)
        for rev, seed in (("main", 1), ("v2", 2))
    }
    install_in_hub_cache(backbones["main"], "acme/tiny-qwen3", cache, commit_id(1), ("main",))
    install_in_hub_cache(backbones["v2"], "acme/tiny-qwen3", cache, commit_id(2), ("v2",))
    thetas = {}
    for rev, seed in (("main", 10), ("v1", 11)):
        manifest, weights = write_release(root / f"release-{rev}", 32, seed=seed)
        out = root / f"router-{rev}"
        convert_release(manifest, weights, out, backbones["v2"])
        config = json.loads((out / "config.json").read_text())
        config.update(backbone_name_or_path="acme/tiny-qwen3", backbone_revision="v2")
        (out / "config.json").write_text(json.dumps(config))
        install_in_hub_cache(out, "acme/router", cache, commit_id(100 + seed), ("main",) if rev == "main" else ("v1",))
        thetas[rev] = np.load(weights)
    return {"cache": cache, "backbones": backbones, "thetas": thetas}


def logits_of(model, tokenizer) -> np.ndarray:
    with torch.inference_mode():
        return model(**tokenizer(QUERIES, padding=True, return_tensors="pt")).logits.numpy()


@pytest.mark.parametrize("router_revision", ["main", "v1", commit_id(111)])
def test_hub_ids_and_revisions_resolve_offline_through_cache_dir(hub, router_revision):
    model = AutoModel.from_pretrained(
        "acme/router", revision=router_revision, cache_dir=hub["cache"], trust_remote_code=True
    )
    tokenizer = AutoTokenizer.from_pretrained("acme/router", revision=router_revision, cache_dir=hub["cache"])
    head = "main" if router_revision == "main" else "v1"
    # The router's revision picks the head; the backbone stays at its own pinned revision (v2).
    reference = ReferenceRouter(str(hub["backbones"]["v2"]), hub["thetas"][head], AGENTS)
    expected = reference.batch_logits(QUERIES)
    assert np.abs(logits_of(model, tokenizer) - expected).max() <= 1e-4
    other = ReferenceRouter(str(hub["backbones"]["main"]), hub["thetas"][head], AGENTS).batch_logits(QUERIES)
    assert np.abs(other - expected).max() > 1e-3  # the two backbone revisions really differ


def test_backbone_override_and_local_files_only(hub):
    model = AutoModel.from_pretrained(
        "acme/router",
        cache_dir=hub["cache"],
        trust_remote_code=True,
        local_files_only=True,
        backbone_name_or_path=str(hub["backbones"]["main"]),
    )
    tokenizer = AutoTokenizer.from_pretrained("acme/router", cache_dir=hub["cache"])
    expected = ReferenceRouter(str(hub["backbones"]["main"]), hub["thetas"]["main"], AGENTS).batch_logits(QUERIES)
    assert np.abs(logits_of(model, tokenizer) - expected).max() <= 1e-4


def test_missing_from_cache_offline_is_a_clear_error(hub, tmp_path):
    with pytest.raises(OSError):
        AutoModel.from_pretrained("acme/router", cache_dir=tmp_path, trust_remote_code=True)
    with pytest.raises(OSError, match="acme/tiny-qwen3"):  # the router is cached, its backbone is not
        cache = tmp_path / "only-router"
        shutil.copytree(hub["cache"] / "models--acme--router", cache / "models--acme--router")
        AutoModel.from_pretrained("acme/router", cache_dir=cache, trust_remote_code=True)


def test_pipeline_from_hub_id_in_default_cache(hub, monkeypatch):
    import transformers.utils.hub
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub["cache"]))
    # transformers 4.x reads its default cache once, at import: the pipeline's code lookup uses that copy
    monkeypatch.setattr(transformers.utils.hub, "TRANSFORMERS_CACHE", str(hub["cache"]), raising=False)
    router = pipeline(
        "text-classification", model="acme/router", trust_remote_code=True, model_kwargs={"cache_dir": hub["cache"]}
    )
    assert router.model.backbone.dtype == torch.float32  # the pipeline's dtype="auto" means float32 here
    reference = ReferenceRouter(str(hub["backbones"]["v2"]), hub["thetas"]["main"], AGENTS)
    assert [r["label"] for r in router(QUERIES)] == [AGENTS[i] for i in reference.batch_logits(QUERIES).argmax(1)]


def test_dtype_and_attention_reach_the_backbone_and_head_stays_float32(converted):
    folder, _ = converted[0]
    model = AutoModel.from_pretrained(folder, trust_remote_code=True, dtype=torch.bfloat16, attn_implementation="eager")
    assert model.backbone.dtype == torch.bfloat16 and model.head.weight.dtype == torch.float32
    assert model.backbone.config._attn_implementation == "eager"
    default = AutoModel.from_pretrained(folder, trust_remote_code=True)
    assert default.backbone.dtype == torch.float32 and default.backbone.config._attn_implementation == "sdpa"
    tokenizer = AutoTokenizer.from_pretrained(folder)
    bf16, fp32 = logits_of(model, tokenizer), logits_of(default, tokenizer)
    assert bf16.dtype == np.float32 and np.abs(bf16 - fp32).max() < 0.1 * np.abs(fp32).max()
