"""The routing speed benchmark: the package's routing rows side by side with the reference's and
this machine's matmul peak, all on one synthetic Qwen3 backbone (docs/benchmark.md)."""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchgen_router.bench.synthetic import (
    AGENTS,
    QWEN3_1_7B,
    TINY,
    VOCAB_SIZE,
    convert_router,
    install_tokenizer,
)
from benchgen_router.bench.synthetic import qwen3_tokenizer_dir as qwen3_tokenizer_dir  # re-exported
from benchgen_router.bench.workers import REFERENCE_MAX_LENGTH, Bench
from benchgen_router.bench.workload import DEFAULT_TASKS, load_workload, stratified_sample
from benchgen_router.errors import InputError

DEFAULT_CPU_QUERIES = 40  # the CPU sample: at 28 layers the default rows take minutes on 2 cores
OFFERED_MODES = ("bf16",)  # speedups.SPEED_MODES, named here so that --help imports no torch
TRIAL_MODE_NAMES = ("padded", "bf16-padded", "int8", "compile", "bf16-compile")  # speedups.TRIAL_MODES
BASE_ROWS = ("ref-batch16", "default")  # the rows after (a) that are not speed modes

ROW_TITLES = {
    "ref-single": "(a) reference, one query at a time, float32",
    "ref-batch16": "(b) reference, batches of 16 padded to the longest, float32",
    "default": "(c) package default: load_router + run_router, float32",
}
FLOP_FORMULA = "2 x non-embedding params x real tokens (padding and attention scores not counted)"


@dataclass(frozen=True)
class BenchOptions:
    """One run's settings, as `benchgen-router bench` takes them (its default modes add bf16 where it is fast)."""

    device: str = "cpu"
    modes: Sequence[str] = BASE_ROWS
    layers: int | None = None
    queries: int | None = None
    threads: int | None = None
    batch_size: int | None = None
    max_batch_tokens: int | None = None
    tasks: Path = DEFAULT_TASKS
    seed: int = 0
    checkpoint_dtype: str = "bfloat16"
    profile: bool = False
    workdir: Path | None = None
    tiny: bool = False

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")


@dataclass
class Sample:
    """The queries every row routes, the prompts that warm rows up, and the token counts behind GFLOP/s."""

    queries: list[str]
    calibration: list[str]
    lengths: list[int]  # of the whole workload
    sample_lengths: np.ndarray
    tokenizer_vocab: int
    tokenizer_kind: str

    @property
    def tokens(self) -> int:
        return int(self.sample_lengths.sum())


@dataclass
class Measured:
    """What the worker jobs returned."""

    built: dict[str, Any]
    sample: Sample
    peak_spec: dict[str, Any]
    peaks_start: dict[str, float]
    peaks_end: dict[str, float]
    rows: dict[str, dict[str, Any]]


def run_benchmark(options: BenchOptions, command: str) -> dict[str, Any]:
    """Every row of `options`, measured in worker processes, as the report that the markdown and the
    JSON output are written from; `command` is recorded so a report says how to reproduce it."""
    import torch

    started = time.perf_counter()
    load_start = os.getloadavg()
    if options.on_gpu and not torch.cuda.is_available():
        reason = "torch sees no CUDA device here (torch.cuda.is_available() is False)."
        raise InputError(f"device={options.device!r}: {reason}", cli=f"--device cuda: {reason}")
    threads = options.threads or torch.get_num_threads()
    geometry = model_geometry(options)
    prompts, source = load_workload(options.tasks, options.seed)
    tmp_parent = options.workdir or Path(tempfile.gettempdir())
    tmp_parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-routing-", dir=tmp_parent) as tmp:
        measured = measure(Bench(Path(tmp), threads, options.device), options, geometry, prompts)
    report = report_facts(options, command, threads, geometry, source, measured)
    report["loadavg"] = {"start": load_start, "end": os.getloadavg()}
    report["flop_formula"] = FLOP_FORMULA
    peaks = report["peaks_gflops"]["used"]
    flops = 2.0 * measured.built["non_embedding_params"] * measured.sample.tokens
    report["rows"] = table_rows(measured.rows, measured.sample.tokens, flops, peaks, threads)
    picks = np.array(report["rows"]["ref-single"]["picks"])
    report["pick_distribution"] = np.bincount(picks, minlength=len(AGENTS)).tolist()
    report["seconds_total"] = time.perf_counter() - started
    return report


def model_geometry(options: BenchOptions) -> dict[str, int]:
    geometry = dict(TINY if options.tiny else QWEN3_1_7B)
    if options.layers:
        geometry["num_hidden_layers"] = options.layers
    return geometry


def measure(bench: Bench, options: BenchOptions, geometry: dict[str, int], prompts: list[str]) -> Measured:
    """Backbone, sample, peaks at the start, the rows, peaks at the end: the peaks bracket the rows so
    that a machine whose speed drifts during the run shows it."""
    backbone = bench.workdir / "backbone"
    say(f"building the synthetic backbone ({geometry['num_hidden_layers']} layers, {options.checkpoint_dtype}) ...")
    dtype, seed = options.checkpoint_dtype, options.seed
    built = bench.run("build", folder=str(backbone), geometry=geometry, dtype=dtype, seed=seed)
    count = min(options.queries or (len(prompts) if options.on_gpu else DEFAULT_CPU_QUERIES), len(prompts))
    sample = draw_sample(prompts, backbone, count, seed)
    spec = peak_spec(geometry, options.on_gpu, options.tiny)
    say("measuring the matmul peaks ...")
    peaks_start = bench.run("peak", **spec)
    rows = measure_rows(bench, backbone, options, geometry["hidden_size"], sample)
    peaks_end = bench.run("peak", **spec)
    return Measured(built, sample, spec, peaks_start, peaks_end, rows)


def draw_sample(prompts: list[str], backbone: Path, count: int, seed: int) -> Sample:
    """A length-stratified sample in the backbone's own tokens, and calibration prompts from outside
    it (spread over the lengths), so warm-up and the head's bias never see the measured queries."""
    tokenizer, tokenizer_kind = install_tokenizer(prompts, backbone)
    encoded = tokenizer(prompts, truncation=True, max_length=REFERENCE_MAX_LENGTH)["input_ids"]
    lengths = [len(ids) for ids in encoded]
    sample = stratified_sample(lengths, count, seed)
    chosen = set(sample)
    rest = [int(i) for i in np.argsort(lengths, kind="stable") if i not in chosen]
    calibration = [prompts[i] for i in rest[len(rest) // 8 :: max(1, len(rest) // 6)][:6]] or prompts[:2]
    return Sample(
        queries=[prompts[i] for i in sample],
        calibration=calibration,
        lengths=lengths,
        sample_lengths=np.array([lengths[i] for i in sample]),
        tokenizer_vocab=len(tokenizer),
        tokenizer_kind=tokenizer_kind,
    )


def peak_spec(geometry: dict[str, int], on_gpu: bool, tiny: bool) -> dict[str, Any]:
    """Products at the model's own shapes (a tiny geometry stays tiny); bfloat16 only where it is not
    emulated, which would take minutes."""
    from benchgen_router.hardware import bf16_is_fast

    tokens_per_pass = 8192 if on_gpu else (2048 if not tiny else 256)
    return {
        "repeats": 10 if not tiny else 3,
        "shape": [tokens_per_pass, geometry["hidden_size"], geometry["intermediate_size"]],
        "dtypes": ["float32", "bfloat16"] if on_gpu or bf16_is_fast("cpu") else ["float32"],
    }


def measure_rows(
    bench: Bench, backbone: Path, options: BenchOptions, hidden: int, sample: Sample
) -> dict[str, dict[str, Any]]:
    """Row (a) first: it fixes the random head (bias included) that every later row converts and routes with."""
    rng = np.random.default_rng(options.seed)
    head_weight = rng.normal(size=(hidden, len(AGENTS)))
    head_file = bench.workdir / "head.npz"
    np.savez(head_file, head_weight=head_weight)
    common = {"queries": sample.queries, "calibration": sample.calibration}
    reference = functools.partial(bench.run, "reference", backbone=str(backbone), arrays=str(head_file), **common)
    say(f"row ref-single: {len(sample.queries)} queries one at a time ...")
    rows = {"ref-single": reference(batch_size=1)}
    theta = rows["ref-single"]["arrays"]["theta"]
    np.savez(head_file, head_weight=head_weight, theta=theta)
    router = convert_router(bench.workdir, backbone, theta, hidden)
    progress(rows["ref-single"], "ref-single", rows["ref-single"]["seconds"])
    for name in options.modes:
        say(f"row {name} ...")
        if name == "ref-batch16":
            rows[name] = reference(batch_size=16)
        else:
            rows[name] = bench.run(
                "package",
                router=str(router),
                mode=name,
                **common,
                batch_size=options.batch_size,
                max_batch_tokens=options.max_batch_tokens,
                profile=options.profile,
            )
        progress(rows[name], name, rows["ref-single"]["seconds"])
    return rows


def report_facts(
    options: BenchOptions,
    command: str,
    threads: int,
    geometry: dict[str, int],
    source: str,
    measured: Measured,
) -> dict[str, Any]:
    """The run's facts, in the JSON report's key order."""
    peaks = {key: max(measured.peaks_start[key], measured.peaks_end[key]) for key in measured.peaks_start}
    return {
        "command": command,
        "machine": machine_summary(options.device, threads),
        "device": options.device,
        "geometry": {**geometry, "vocab_size": VOCAB_SIZE},
        "params": measured.built["params"],
        "non_embedding_params": measured.built["non_embedding_params"],
        "checkpoint_dtype": options.checkpoint_dtype,
        "workload": source,
        "sample": sample_summary(measured.sample, options.seed),
        "peaks_gflops": {"start": measured.peaks_start, "end": measured.peaks_end, "used": peaks},
        "peak_shape": measured.peak_spec,
    }


def sample_summary(sample: Sample, seed: int) -> dict[str, Any]:
    lengths = sample.sample_lengths
    return {
        "queries": len(sample.queries),
        "seed": seed,
        "tokens_total": sample.tokens,
        "tokens_mean": float(lengths.mean()),
        "tokens_min": int(lengths.min()),
        "tokens_max": int(lengths.max()),
        "workload_tokens_mean": float(np.mean(sample.lengths)),
        "workload_tokens_max": int(np.max(sample.lengths)),
        "tokenizer_vocab": sample.tokenizer_vocab,
        "tokenizer": sample.tokenizer_kind,
    }


def machine_summary(device: str, threads: int) -> dict[str, Any]:
    """What a reader needs to compare two reports: the CPU and its matrix features, versions, threads."""
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


def say(message: str) -> None:
    """Progress on stderr, so stdout carries the table alone."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def progress(row: dict[str, Any], name: str, ref_seconds: float) -> None:
    say(
        f"  {name}: {row['seconds']:.1f} s routing ({ref_seconds / row['seconds']:.2f}x row a), "
        f"load {row['load_seconds']:.1f} s, CPU share {row['cpu_seconds'] / row['seconds']:.2f} cores"
    )


if __name__ == "__main__":  # deprecated way in, kept until the next minor version
    from benchgen_router.bench import hand_over_to_command

    hand_over_to_command("benchgen_router.bench.routing", ["bench"])
