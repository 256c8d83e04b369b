"""The routing benchmark's jobs, each run in a fresh process so one row's memory never counts
towards another's peak."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchgen_router.bench.measure import (
    finish_rss,
    load_time_and_rss,
    matmul_peaks,
    profile_top_ops,
    timed,
    weight_bytes,
)
from benchgen_router.bench.synthetic import build_backbone
from benchgen_router.bench.workload import REPOSITORY_ROOT
from benchgen_router.errors import InputError

REFERENCE_MAX_LENGTH = 1024  # docs/reference.md: truncation=True, max_length=1024
# The command a job runs: this module, with the job's spec file as its one argument.
WORKER_COMMAND = ("-m", "benchgen_router.bench.workers")


def reference_row(spec: dict[str, Any]) -> dict[str, Any]:
    """(a) or (b): docs/reference.md literally. (a) also centres the random head's bias on calibration
    prompts outside the sample, so the picks spread over the agents instead of favouring one."""
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

    w, b, theta = reference_head(np.load(spec["arrays"]), spec["calibration"], embed)
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


def reference_head(
    files: Any, calibration: list[str], embed: Callable[[list[str]], np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(W, b, theta): the given theta, or W with its bias centred; both paths embed calibration
    prompts first, so every row gets a warm-up."""
    weight = files["head_weight"]  # (D, N), float64
    if "theta" in files:
        theta = files["theta"]
        embed(calibration[:2])
    else:
        bias = -(embed(calibration).astype(np.float64).mean(axis=0) @ weight)
        theta = np.concatenate([weight.ravel(), bias])
    d, n = weight.shape
    return theta[: d * n].reshape(d, n), theta[d * n :], theta


def package_row(spec: dict[str, Any]) -> dict[str, Any]:
    """(c) or (d): the package's public path, load_router -> [apply_speed_mode] -> run_router."""
    from benchgen_router import speedups
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
    result["batching"] = package_batching(model, device, batch_size, max_batch_tokens)
    np.savez(spec["output"], logits=logits, embeddings=embeddings)
    return result


def package_batching(model: Any, device: str, batch_size: int | None, max_batch_tokens: int | None) -> str:
    """The table's batching cell: packed rows are bounded by tokens, padded ones by queries."""
    from benchgen_router.hardware import default_batch_tokens

    if model.packs_queries:
        budget = max_batch_tokens or default_batch_tokens(device, model.backbone.dtype)
        return f"packed <= {budget} tokens" + (f", <= {batch_size} queries" if batch_size else "")
    return f"{batch_size or 16} queries, padded"


def worker(spec_path: str) -> None:
    """A worker process's entry point: one job described by a JSON spec, its result to spec['result']."""
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


class Bench:
    """Runs jobs in fresh processes, one at a time and with the same thread count, so rows compare."""

    def __init__(self, workdir: Path, threads: int, device: str) -> None:
        self.workdir, self.threads, self.device = workdir, threads, device
        self.jobs = 0

    def run(self, kind: str, **spec: Any) -> dict[str, Any]:
        self.jobs += 1
        stem = self.workdir / f"job{self.jobs:02d}-{kind}"
        spec.update(kind=kind, threads=self.threads, device=self.device, result=f"{stem}.json", output=f"{stem}.npz")
        Path(f"{stem}.spec.json").write_text(json.dumps(spec), encoding="utf-8")
        with open(f"{stem}.log", "w") as log:
            code = subprocess.call(
                [sys.executable, *WORKER_COMMAND, f"{stem}.spec.json"],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                cwd=REPOSITORY_ROOT,
            )
        if code != 0:
            tail = Path(f"{stem}.log").read_text(errors="replace").strip().splitlines()[-15:]
            raise InputError(f"the {kind} job failed (exit {code}):\n  " + "\n  ".join(tail))
        result = json.loads(Path(f"{stem}.json").read_text(encoding="utf-8"))
        if Path(f"{stem}.npz").exists():
            result["arrays"] = dict(np.load(f"{stem}.npz"))
        return result

    def environment(self) -> dict[str, str]:
        """The same threads for every library, quiet and offline: a worker's log is read only on failure."""
        return {
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


if __name__ == "__main__":  # one job (WORKER_COMMAND): a failure's traceback goes to the job's log
    worker(sys.argv[1])
