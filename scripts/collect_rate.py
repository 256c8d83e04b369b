"""Calls per second of `benchgen-router collect` against local upstreams: `transformers serve` on loopback,
each agent its own server over a tiny random chat model (as the tests build it), at each concurrency.

    python scripts/collect_rate.py                       # 24 tasks x 2 agents x 2 repetitions, concurrency 1 and 4
    python scripts/collect_rate.py --tasks 48 --agents 3 --concurrency 1,2,4,8

What it measures is collect's own overhead plus the servers' answering time on this machine's CPUs: the
tiny model answers in tens of milliseconds, so the rate is an upper bound on what collect adds, not a
prediction for a hosted API, where the upstream's latency dominates and concurrency is what buys speed.
Each concurrency runs once, into a fresh output, after one untimed warm-up call per server.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the package, and the tests' upstream builders

from benchgen_router.collect import CollectConfig, collect  # noqa: E402
from benchgen_router.hardware import cpu_features, cpu_summary  # noqa: E402
from helpers import make_queries  # noqa: E402
from upstream_server import build_tiny_chat_model, start_upstreams  # noqa: E402


def concurrency_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("concurrency values must be integers >= 1")
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=24)
    parser.add_argument("--agents", type=int, default=2)
    parser.add_argument("--repetitions", type=int, default=2)
    parser.add_argument("--concurrency", type=concurrency_list, default=[1, 4])
    args = parser.parse_args()

    import transformers

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    features = cpu_features()
    print(f"date: {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}")
    print(f"command: python {shlex.join(['scripts/collect_rate.py', *sys.argv[1:]])}")
    print(f"commit: {commit.stdout.strip() or 'unknown'} (plus the working tree)")
    print(f"cpu: {cpu_summary()}")
    print(f"avx512_bf16: {features['avx512_bf16']}, amx_bf16: {features['amx_bf16']}, amx_int8: {features['amx_int8']}")
    print(f"python {platform.python_version()}, transformers {transformers.__version__}")

    with tempfile.TemporaryDirectory(prefix="collect-rate-") as scratch:
        folder = Path(scratch)
        models = [build_tiny_chat_model(folder / f"model-{seed}", seed) for seed in range(args.agents)]
        servers = start_upstreams(models, log_dir=folder)
        try:
            agents = [
                {"agent_id": f"agent{i}", "base_url": server.base_url, "model": server.model}
                | {"price_per_1m_prompt_usd": 0.1, "price_per_1m_output_usd": 0.4}
                for i, server in enumerate(servers)
            ]
            (folder / "pool.json").write_text(json.dumps({"agents": agents}))
            rows = [
                {"task_id": f"t{i}", "prompt": prompt, "answer": "7", "grader": "numeric_match"}
                for i, prompt in enumerate(make_queries(args.tasks, seed=11))
            ]
            (folder / "tasks.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))

            def run(name: str, concurrency: int, limit: int | None = None, repetitions: int = args.repetitions):
                config = CollectConfig(
                    tasks=folder / "tasks.jsonl",
                    pool=folder / "pool.json",
                    output=folder / f"{name}.jsonl",
                    repetitions=repetitions,
                    limit=limit,
                    concurrency=concurrency,
                )
                return collect(config)

            run("warm-up", len(servers), limit=1, repetitions=1)
            cells = args.tasks * args.agents * args.repetitions
            print(f"\n{args.tasks} tasks x {args.agents} agents x {args.repetitions} repetitions = {cells} calls\n")
            print("| concurrency | calls | failed | seconds | calls/s |")
            print("| ---: | ---: | ---: | ---: | ---: |")
            for concurrency in args.concurrency:
                result = run(f"c{concurrency}", concurrency)
                print(
                    f"| {concurrency} | {result.made} | {result.failed} | {result.seconds:.2f} "
                    f"| {result.calls_per_s:.1f} |"
                )
        finally:
            for server in servers:
                server.stop()


if __name__ == "__main__":
    main()
