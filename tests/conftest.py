"""Fixtures: tiny random Qwen3 backbones, a tokenizer and converted routers, built once per run.

The suite runs offline (HF_HUB_OFFLINE=1, LiteLLM's local price map) with a private HF_HOME, set in
pytest_configure before any test module imports transformers, huggingface_hub or litellm (they read them
once, at import).
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path

import numpy as np
import pytest

from helpers import (
    NO_PILOT,
    PILOT,
    build_backbone,
    build_tokenizer,
    convert_release,
    route_pilot_prompts,
    write_operating_release,
    write_release,
)

HF_HOME = pytest.StashKey[str]()  # the private Hub cache of this run, removed at its end


def pytest_configure(config: pytest.Config) -> None:
    config.stash[HF_HOME] = tempfile.mkdtemp(prefix="router-tests-hf-home-")
    os.environ["HF_HOME"] = config.stash[HF_HOME]
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # LiteLLM's price map from its wheel, not from GitHub
    # The Ctrl-C tests send SIGINT to the commands they start, as a terminal does. A shell starts a background
    # job with SIGINT ignored, and every process it starts inherits that: a suite run so would see its
    # commands shrug Ctrl-C off. Python's own handler here is reset to the default in each child at exec.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(config.stash.get(HF_HOME, ""), ignore_errors=True)


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("router")


@pytest.fixture(scope="session")
def tokenizer_dir(workdir) -> Path:
    folder = workdir / "tokenizer"
    build_tokenizer(folder)
    return folder


@pytest.fixture(scope="session")
def backbone_dir(workdir, tokenizer_dir) -> Path:
    return build_backbone(workdir / "backbone", tokenizer_dir)


@pytest.fixture(scope="session")
def converted(workdir, backbone_dir):
    """Converted routers by head shape: {0: (folder, theta), 8: (folder, theta)}."""
    routers = {}
    for hidden in (0, 8):
        manifest, weights = write_release(
            workdir / f"release-{hidden}", 32, hidden, seed=hidden, backbone=str(backbone_dir)
        )
        out = workdir / f"router-{hidden}"
        convert_release(manifest, weights, out, backbone_dir)
        routers[hidden] = (out, np.load(weights))
    return routers


OPERATING_POINTS = {"quality": (0.0, 0.0), "balanced": (0.2, 0.0), "fast": (0.0, 0.01)}


@pytest.fixture(scope="session")
def operating_router(workdir, backbone_dir):
    """(folder, {point name: theta}) of a converted router with three operating points, 'balanced' the default."""
    manifest, weights, thetas = write_operating_release(
        workdir / "release-points", 32, OPERATING_POINTS, "balanced", seed=7, backbone=str(backbone_dir)
    )
    return convert_release(manifest, weights, workdir / "router-points", backbone_dir), thetas


@pytest.fixture(scope="session")
def committed_router() -> tuple:
    """The committed default router (MiniLM) and its tokenizer, loaded once per run."""
    from benchgen_router.loading import load_router

    return load_router(None)


@pytest.fixture(scope="session")
def pilot_routed(committed_router) -> dict[str, tuple[dict[str, str], object]]:
    """Every pilot prompt routed once per form by the committed router: {form: (picks by task_id, the
    routed output)}; the recorded-picks, guard and OOD tests share it instead of embedding 2,220
    prompts each."""
    if not (PILOT / "tasks.v1.jsonl").exists():
        pytest.skip(NO_PILOT)
    return {form: route_pilot_prompts(form, committed_router) for form in ("formatted", "plain")}
