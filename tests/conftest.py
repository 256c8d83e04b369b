"""Shared fixtures: tiny random Qwen3 backbones, a byte-level BPE tokenizer and converted routers,
all built at test time. The whole suite runs with HF_HUB_OFFLINE=1 and a private HF_HOME."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Set before transformers / huggingface_hub are imported: they read these once.
_HF_HOME = tempfile.mkdtemp(prefix="router-tests-hf-home-")
os.environ["HF_HOME"] = _HF_HOME
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHARED = PROJECT_ROOT.parent / "shared"
PILOT = SHARED / "benchgen-pilot"
AGENTS = ["frontier_a", "frontier_b", "frontier_c", "open_mid", "open_cheap_reasoning"]
sys.path.insert(0, str(PROJECT_ROOT))

SUBJECTS = [
    "derivative",
    "integral",
    "prime",
    "triangle",
    "photosynthesis",
    "treaty",
    "enzyme",
    "matrix",
    "probability",
    "volcano",
    "sonnet",
    "algorithm",
    "inflation",
    "glacier",
    "vaccine",
    "orbit",
]
VERBS = ["Explain", "Compute", "Prove", "Describe", "Estimate", "Compare", "Summarise", "Find"]


def make_queries(count: int, seed: int = 0) -> list[str]:
    """Deterministic questions of varied length (a few words to a few sentences)."""
    rng = np.random.default_rng(seed)
    queries = []
    for _ in range(count):
        parts = [f"{rng.choice(VERBS)} the {rng.choice(SUBJECTS)} of {int(rng.integers(2, 999))}"]
        for _ in range(int(rng.integers(0, 6))):
            parts.append(f"then relate it to the {rng.choice(SUBJECTS)} and the {rng.choice(SUBJECTS)}")
        queries.append(", ".join(parts) + "?")
    return queries


def build_tokenizer(folder: Path) -> None:
    """A byte-level BPE tokenizer like Qwen's: no BOS/EOS added, pads on the right."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(make_queries(400, seed=123), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|endoftext|>", eos_token="<|endoftext|>")
    fast.save_pretrained(folder)


def build_backbone(
    folder: Path, tokenizer_dir: Path, hidden_size: int = 32, layers: int = 2, seed: int = 0, **overrides
) -> Path:
    """A tiny random Qwen3Model saved with the tokenizer, like a backbone repo on the Hub."""
    from transformers import Qwen3Config, Qwen3Model

    config = Qwen3Config(
        vocab_size=320,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        pad_token_id=0,
        **overrides,
    )
    torch.manual_seed(seed)
    Qwen3Model(config).eval().save_pretrained(folder)
    for item in tokenizer_dir.iterdir():
        shutil.copy(item, folder / item.name)
    return folder


def write_release(
    folder: Path,
    embedding_dim: int,
    head_hidden_dim: int = 0,
    seed: int = 0,
    backbone: str = "Qwen/Qwen3-1.7B",
    agents: list[str] | None = None,
    scale: float = 1.0,
) -> tuple[Path, Path]:
    """manifest.json + head_weights.npy in the trainer's format, with a random head."""
    agents = agents or AGENTS
    n = len(agents)
    size = (
        embedding_dim * n + n
        if head_hidden_dim == 0
        else (embedding_dim * head_hidden_dim + head_hidden_dim + head_hidden_dim * n + n)
    )
    theta = np.random.default_rng(seed).normal(scale=scale, size=size)
    folder.mkdir(parents=True, exist_ok=True)
    manifest = {
        "model_id": f"head-test-{seed}",
        "backbone_model": backbone,
        "rewards_dataset": "benchgen/router-pilot",
        "agent_order": agents,
        "embedding_dim": embedding_dim,
        "head_hidden_dim": head_hidden_dim,
        "n_head_params": size,
        "n_total": 46,
        "n_train": 35,
        "n_test": 11,
        "train_reward": 0.7,
        "test_reward": 0.7,
        "baselines": {"random_agent": 0.5538, "best_fixed_agent": 0.6667, "oracle": 0.7692},
        "beats_best_fixed_agent": True,
        "cma_generations_run": 60,
        "history": [{"generation": 0, "best_reward": 0.6}],
        "duration_seconds": 1.0,
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    np.save(folder / "head_weights.npy", theta)
    return folder / "manifest.json", folder / "head_weights.npy"


def convert_release(manifest: Path, weights: Path, out: Path, backbone: Path | str) -> Path:
    """Convert a release with convert_npy.py's own entry point, as its command line would."""
    from convert_npy import main

    args = ["--manifest", manifest, "--weights", weights, "--output-dir", out, "--backbone", backbone]
    assert main([str(a) for a in args]) == 0
    return out


def run_tool(script: str, *args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run one of the project's command-line tools as a user would."""
    return subprocess.run(
        [sys.executable, str(PROJECT_ROOT / script), *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        timeout=600,
    )


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
        manifest, weights = write_release(workdir / f"release-{hidden}", 32, hidden, seed=hidden)
        out = workdir / f"router-{hidden}"
        convert_release(manifest, weights, out, backbone_dir)
        routers[hidden] = (out, np.load(weights))
    return routers
