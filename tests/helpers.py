"""Builders the tests share: tiny random Qwen3 backbones, a byte-level BPE tokenizer, trainer
releases with random heads, and the command line run as a user runs it. Everything is built at test
time; nothing is downloaded."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHARED = PROJECT_ROOT.parent / "shared"
PILOT = SHARED / "benchgen-pilot"
AGENTS = ["frontier_a", "frontier_b", "frontier_c", "open_mid", "open_cheap_reasoning"]
NO_PILOT = f"pilot data not found at {PILOT} (CI has it)"
RESULT_KEYS = {"picked_agent", "agent_index", "probabilities", "logits"}

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
    import torch
    from transformers import Qwen3Config, Qwen3Model

    settings = {
        "vocab_size": 320,
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": hidden_size // 4,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "tie_word_embeddings": True,
        "pad_token_id": 0,
    }
    config = Qwen3Config(**{**settings, **overrides})
    torch.manual_seed(seed)
    Qwen3Model(config).eval().save_pretrained(folder)
    for item in tokenizer_dir.iterdir():
        shutil.copy(item, folder / item.name)
    return folder


def build_bag_of_tokens(folder: Path, tokenizer_dir: Path) -> Path:
    """A tiny Qwen3 backbone whose layers write nothing into the residual stream (their output projections
    are zero): its frozen embedding is the mean of the token embeddings, the same for any order of the tokens."""
    import torch
    from transformers import AutoModel

    build_backbone(folder, tokenizer_dir)
    model = AutoModel.from_pretrained(folder)
    with torch.no_grad():
        for layer in model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    model.save_pretrained(folder)
    return folder


def order_task() -> tuple[list[str], np.ndarray]:
    """(prompts, rewards of two agents): "<verb> prime <subject>" and "<verb> <subject> prime" for every verb
    and subject, the same tokens in two orders; the first agent answers when "prime" comes first, the second
    otherwise. Only a backbone that sees the order can route them (build_bag_of_tokens' cannot)."""
    prompts, leads = [], []
    for verb in VERBS:
        for subject in (s for s in SUBJECTS if s != "prime"):
            prompts += [f"{verb} prime {subject}", f"{verb} {subject} prime"]
            leads += [1.0, 0.0]
    first = np.array(leads)
    return prompts, np.stack([first, 1 - first], axis=1)


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


def write_operating_release(
    folder: Path, embedding_dim: int, points: dict[str, tuple[float, float]], default: str, seed: int = 0, **kwargs
) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """A release with one random head per operating point (name -> (cost weight, latency weight)):
    manifest.json, head_weights.npy (the default point's head) and operating_heads.safetensors."""
    from safetensors.numpy import save_file

    manifest_path, weights = write_release(folder, embedding_dim, seed=seed, **kwargs)
    size = np.load(weights).size
    rng = np.random.default_rng(seed + 1)
    thetas = {name: rng.normal(size=size) for name in points}
    manifest = json.loads(manifest_path.read_text())
    manifest["operating_points"] = {
        name: {"cost_weight": cost, "latency_weight": latency} for name, (cost, latency) in points.items()
    }
    manifest["default_operating_point"] = default
    manifest_path.write_text(json.dumps(manifest))
    np.save(weights, thetas[default])
    save_file(thetas, str(folder / "operating_heads.safetensors"))
    return manifest_path, weights, thetas


def convert_release(manifest: Path, weights: Path, out: Path, backbone: Path | str) -> Path:
    """Convert a release with the converter's command line, in-process; the folder records `backbone`
    (a local tiny model here), so it loads offline with no override."""
    from benchgen_router.cli.main import main

    args = ["convert", "--manifest", manifest, "--weights", weights, "--output-dir", out, "--backbone", backbone]
    args += ["--backbone-id", backbone]
    assert main([str(a) for a in args]) == 0
    return out


def run_tool(
    command: str, *args: str, env: dict | None = None, cwd: Path | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """Run the command line as a user would: `benchgen-router <command> ...` (as python -m
    benchgen_router), or one of the root scripts when `command` ends in .py. On a timeout the
    whole process group is killed, so no worker process outlives the test."""
    if command.endswith(".py"):  # a root script
        base = [sys.executable, str(PROJECT_ROOT / command)]
    elif "." in command:  # a module run with python -m
        base = [sys.executable, "-m", command]
    else:  # a subcommand
        base = [sys.executable, "-m", "benchgen_router", command]
    process = subprocess.Popen(
        [*base, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT), **(env or {})},
        cwd=cwd,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def run_in_process(command: str, *args: object) -> subprocess.CompletedProcess:
    """run_tool's result without a fresh interpreter: the same main() and arguments, what it prints and
    logs captured as a terminal would show them. For tests of what a command says, writes and exits
    with; how a command starts and stops (signals, child processes) is run_tool's."""
    from benchgen_router.cli.main import main

    argv = [str(a) for a in args]
    if command == "convert_npy.py":  # the root script is `convert` under its own name
        argv, prog = ["convert", *argv], command
    elif command.endswith(".py"):
        raise ValueError(f"{command}: only convert_npy.py runs in-process; use run_tool")
    else:
        argv, prog = [command, *argv], "benchgen-router"
    stdout, stderr = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(stderr)  # the command's basicConfig handler, which pytest's own pre-empt
    handler.setFormatter(logging.Formatter("%(message)s"))
    ours = logging.getLogger("benchgen_router")
    level = ours.level
    logging.getLogger().addHandler(handler)
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                code = main(argv, prog=prog)
            except SystemExit as exit_:  # argparse's usage errors and --help
                code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    finally:
        logging.getLogger().removeHandler(handler)
        ours.setLevel(level)
    return subprocess.CompletedProcess([command, *argv], code, stdout.getvalue(), stderr.getvalue())


def cli(*args: object) -> int:
    """The `benchgen-router` command line, in-process: its exit code (errors are printed, not raised)."""
    from benchgen_router.cli.main import main

    try:
        return main([str(a) for a in args])
    except SystemExit as exit_:  # argparse's own usage errors
        return exit_.code


def listeners(port: int) -> list[tuple[str, str]]:
    """(process name, address) of every socket listening on `port`."""
    import psutil

    found = []
    for connection in psutil.net_connections("tcp"):
        if connection.status == psutil.CONN_LISTEN and connection.laddr.port == port and connection.pid:
            with contextlib.suppress(psutil.Error):
                found.append((psutil.Process(connection.pid).name(), connection.laddr.ip))
    return found


def forged_request_id(request_id: str) -> str:
    """A served request id with its last hex digit changed, so that its signature cannot match (setting
    the digit to a fixed value would leave one id in 16 unchanged)."""
    return request_id[:-1] + format((int(request_id[-1], 16) + 1) % 16, "x")


def check_result(result: dict, expected_logits: np.ndarray) -> None:
    """One pick_agent result: the documented keys, scores keyed by agent in pool order, softmax
    probabilities, and the argmax of the expected logits as the pick."""
    assert set(result) == RESULT_KEYS
    assert list(result["logits"]) == AGENTS and list(result["probabilities"]) == AGENTS
    logits = np.array(list(result["logits"].values()))
    assert np.abs(logits - expected_logits).max() <= 1e-4
    probabilities = np.array(list(result["probabilities"].values()))
    softmax = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    assert np.allclose(probabilities, softmax) and abs(probabilities.sum() - 1) < 1e-9
    assert result["agent_index"] == int(np.argmax(expected_logits))
    assert result["picked_agent"] == AGENTS[result["agent_index"]]


def write_csv(path: Path, header: list[str], rows: list[list[object]]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def call_record(
    agent: str,
    correct: bool,
    cost_usd: float | None = None,
    latency_ms: float = 1000.0,
    prompt_tokens: int = 10,
    completion_tokens: int = 10,
) -> dict:
    """One raw call in the pilot's format (rewards.v1-pilot.jsonl); a cost of None is left out."""
    record = {"agent": agent, "correct": correct, "latency_ms": latency_ms, "prompt_tokens": prompt_tokens}
    record["completion_tokens"] = completion_tokens
    if cost_usd is not None:
        record["cost_usd"] = cost_usd
    return record


def calls_row(task_id: str, agents: list[str], calls: list[dict]) -> dict:
    """One task's raw calls in the pilot's format, its mean_reward the share of each agent's calls graded correct."""
    mean = [float(np.mean([c["correct"] for c in calls if c["agent"] == agent])) for agent in agents]
    return {"task_id": task_id, "agent_order": list(agents), "mean_reward": mean, "calls": calls}


def synthetic_rows(count: int = 14, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(reward rows, task rows) in the pilot schemas; the last 4 tasks are in the 'test' split."""
    rng = np.random.default_rng(seed)
    prompts = make_queries(count, seed=seed)
    rewards, tasks = [], []
    for i, prompt in enumerate(prompts):
        split = "test" if i >= count - 4 else "train"
        rewards.append(
            {
                "task_id": f"t{i}",
                "agent_order": list(AGENTS),
                "split": split,
                "mean_reward": [round(float(v), 4) for v in rng.uniform(size=len(AGENTS))],
            }
        )
        tasks.append({"task_id": f"t{i}", "prompt": prompt, "split": split})
    return rewards, tasks


def pilot_data(rewards_file: str):
    """The real pilot rewards joined with the task prompts, as the trainer joins them."""
    from benchgen_router.data import join_rewards, load_rows

    rewards = load_rows(str(PILOT / rewards_file), "rewards")
    return join_rewards(rewards, load_rows(str(PILOT / "tasks.v1.jsonl"), "tasks"))


def train_probability_router(folder: Path, backbone: Path | str, count: int = 120, seed: int = 11) -> tuple[Path, list]:
    """(exported router, its prompts): probability_training's router."""
    prompts, _ = probability_training(folder, backbone, count, seed)
    return folder / "router", prompts


def probability_training(
    folder: Path, backbone: Path | str, count: int, seed: int, extra: Sequence[str] = ()
) -> tuple[list[str], subprocess.CompletedProcess]:
    """(prompts, the finished command): `train --head-kind probability` (and `extra` flags) over AGENTS into
    folder/out and folder/router, where frontier_a answers every query, open_cheap_reasoning only the short sums (every
    other query, the only ones with " plus "), the rest none; each agent's calls cost its own price, so
    the trade-off rules pick differently."""
    prices = {
        "frontier_a": 2e-3,
        "frontier_b": 3e-3,
        "frontier_c": 1e-3,
        "open_mid": 1e-4,
        "open_cheap_reasoning": 2e-4,
    }
    rng = np.random.default_rng(seed)
    long = make_queries(count, seed=seed)
    prompts = [f"What is {rng.integers(2, 99)} plus {rng.integers(2, 99)}?" if i % 2 else long[i] for i in range(count)]
    rewards, tasks, calls = [], [], []
    for i, prompt in enumerate(prompts):
        split = "test" if i % 5 == 0 else "train"
        records = [
            call_record(agent, agent == "frontier_a" or (agent == "open_cheap_reasoning" and i % 2 == 1), prices[agent])
            for agent in AGENTS
        ]
        calls.append(calls_row(f"t{i}", AGENTS, records))
        rewards.append(
            {"task_id": f"t{i}", "agent_order": AGENTS, "split": split, "mean_reward": calls[-1]["mean_reward"]}
        )
        tasks.append({"task_id": f"t{i}", "prompt": prompt, "split": split})
    args = [
        "--rewards", write_jsonl(folder / "r.jsonl", rewards), "--tasks", write_jsonl(folder / "t.jsonl", tasks),
        "--calls", write_jsonl(folder / "calls.jsonl", calls), "--backbone", backbone, "--head-kind", "probability",
        "--no-ood-guard", "--no-progress", "--cache-dir", folder / "cache", "--output-dir", folder / "out",
        "--export", folder / "router", "--query-format", "none", *extra,
    ]  # fmt: skip
    result = run_tool("train", *args)
    assert result.returncode == 0, result.stderr
    return prompts, result


def route_pilot_prompts(form: str = "formatted", router: tuple | None = None) -> tuple[dict[str, str], Any]:
    """(task_id -> the agent the committed router sends it to (the guard's fallback applied), the routed
    output) for every prompt of the pilot task pool in `form` (forms.FORMS)."""
    from benchgen_router.files import read_jsonl
    from benchgen_router.forms import in_form
    from benchgen_router.loading import load_router
    from benchgen_router.routing import route_queries

    tasks = read_jsonl(PILOT / "tasks.v1.jsonl", "tasks")
    model, tokenizer = router or load_router(None)
    routed = route_queries(model, tokenizer, in_form([task["prompt"] for task in tasks], form), batch_size=32)
    picks = {task["task_id"]: model.config.id2label[int(i)] for task, i in zip(tasks, routed.picks, strict=True)}
    return picks, routed


def weak_and_strong(weak_right: np.ndarray, seed: int = 0, names: Sequence[str] = ()) -> Any:
    """A two-agent OutcomeMatrix: a free weak agent right where `weak_right` (a probability per row) says, a
    strong one (one call each) right on 90% of rows; `names` the prompts (default: "q<i>")."""
    from benchgen_router.bench.value import OutcomeMatrix

    rng = np.random.default_rng(seed)
    rows = len(weak_right)
    rewards = np.stack([rng.random(rows) < weak_right, rng.random(rows) < 0.9], axis=1).astype(float)
    prompts = list(names) or [f"q{i}" for i in range(rows)]
    cost = np.tile([0.0, 1000.0], (rows, 1))
    return OutcomeMatrix(
        "two", ["weak", "strong"], [f"t{i}" for i in range(rows)], prompts, ["g"] * rows, rewards, cost
    )


def mean_apgr(result: Any, router: str) -> float:
    """A router's APGR (RouteLLM's), mean over the result's folds."""
    return float(np.mean([fold.gap["figures"][router]["apgr"] for fold in result.folds]))
