"""What a pool of 29 agents costs beside a pool of 5, in one run: `train`'s time on the same rows (embeddings
cached, so the time after embedding) for both head kinds, and routing speed (docs/benchmarks/mmlu-pro.md).

    benchgen-router import --long outcomes.csv --prompts questions.jsonl --id-column question_id \
        --cost-column cost_usd --drop-incomplete --output-dir mmlu-pro/
    python scripts/pool_size_cost.py --data mmlu-pro/ --rows 8000 --repeats 3

From an imported folder, the first ROWS tasks with every agent, and the same tasks with the 5 agents most
accurate on them, are written side by side; each `train` command runs as a user runs it (a process of its
own, the same MiniLM backbone whose embeddings the first run caches), pools alternated. `--head-kind
probability` and the release's CMA-ES search (one operating point, 60 generations) are timed (`--kinds`); the CMA-ES
runs skip the cross-validated frontier (`--cv-folds 0`), whose cost grows with its own settings. Routing:
both probability routers, loaded in this process on one thread, route the same 256 prompts in batches of
16, alternated; the head's own share is its linear layer timed on the embeddings alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SMALL_POOL = 5


def subset(folder: Path, out: Path, rows: int, agents: list[str] | None) -> list[str]:
    """Write the first `rows` tasks of an imported folder (all agents, or `agents`) into `out`; the agents."""
    out.mkdir(parents=True, exist_ok=True)
    tasks = (folder / "tasks.jsonl").read_text(encoding="utf-8").splitlines()[:rows]
    (out / "tasks.jsonl").write_text("\n".join(tasks) + "\n", encoding="utf-8")
    kept: list[str] = []
    for name in ("rewards.jsonl", "calls.jsonl"):
        written = []
        for line in (folder / name).read_text(encoding="utf-8").splitlines()[:rows]:
            row = json.loads(line)
            order = row["agent_order"]
            kept = agents or order
            index = [order.index(agent) for agent in kept]
            row["agent_order"] = kept
            row["mean_reward"] = [row["mean_reward"][j] for j in index]
            if "calls" in row:
                row["calls"] = [call for call in row["calls"] if call["agent"] in kept]
            if "best_agents" in row:
                row["best_agents"] = [agent for agent in row["best_agents"] if agent in kept]
            written.append(json.dumps(row))
        (out / name).write_text("\n".join(written) + "\n", encoding="utf-8")
    return kept


def most_accurate(folder: Path, rows: int, count: int) -> list[str]:
    rewards = [json.loads(line) for line in (folder / "rewards.jsonl").read_text(encoding="utf-8").splitlines()[:rows]]
    order = rewards[0]["agent_order"]
    accuracy = np.mean([row["mean_reward"] for row in rewards], axis=0)
    return [order[j] for j in np.argsort(-accuracy, kind="stable")[:count]]


def timed_train(data: Path, work: Path, kind: str) -> float:
    """Wall seconds of one `train` command, the way a user runs it."""
    args = ["--rewards", data / "rewards.jsonl", "--tasks", data / "tasks.jsonl", "--calls", data / "calls.jsonl"]
    args += ["--backbone", "sentence-transformers/all-MiniLM-L6-v2", "--query-format", "none", "--no-progress"]
    args += ["--head-kind", "probability"] if kind == "probability" else ["--cv-folds", "0"]
    out = Path(tempfile.mkdtemp(dir=work))
    command = [sys.executable, "-m", "benchgen_router", "train", *map(str, args), "--output-dir", str(out / "run")]
    started = time.perf_counter()
    done = subprocess.run([*command, "--export", str(out / "router")], capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"train failed: {done.stderr.strip().splitlines()[-1]}")
    (work / f"router-{kind}-{data.name}").unlink(missing_ok=True)
    (work / f"router-{kind}-{data.name}").symlink_to(out / "router")
    return seconds


def routing_speed(routers: dict[str, Path], prompts: list[str], repeats: int) -> dict[str, dict[str, float]]:
    """Per router: ms per query routing `prompts` in batches of 16 (median over repeats, alternated), and the
    head's own ms per query (its linear layer on the same embeddings)."""
    import torch

    from benchgen_router.loading import load_router
    from benchgen_router.routing import route_queries

    torch.set_num_threads(1)
    loaded = {name: load_router(str(folder)) for name, folder in routers.items()}
    times: dict[str, list[float]] = {name: [] for name in loaded}
    heads: dict[str, list[float]] = {name: [] for name in loaded}
    for _ in range(repeats):
        for name, (model, tokenizer) in loaded.items():
            started = time.perf_counter()
            routed = route_queries(model, tokenizer, prompts, batch_size=16)
            times[name].append(1000 * (time.perf_counter() - started) / len(prompts))
            vectors = torch.from_numpy(routed.embeddings)
            with torch.inference_mode():
                started = time.perf_counter()
                for start in range(0, len(prompts), 16):
                    model.head(vectors[start : start + 16])
            heads[name].append(1000 * (time.perf_counter() - started) / len(prompts))
    return {name: {"ms": statistics.median(times[name]), "head_ms": statistics.median(heads[name])} for name in loaded}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="an imported folder (tasks, rewards, calls)")
    parser.add_argument("--rows", type=int, default=8000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--kinds", default="probability,cmaes", help="head kinds timed (CMA-ES takes minutes a run at 29 agents)"
    )
    args = parser.parse_args()
    kinds = [kind for kind in args.kinds.split(",") if kind]
    if not kinds or set(kinds) - {"probability", "cmaes"}:
        raise SystemExit(f"--kinds {args.kinds!r}: choose from probability, cmaes")
    from benchgen_router.hardware import cpu_summary

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        small_agents = most_accurate(args.data, args.rows, SMALL_POOL)
        pools = {"29": work / "pool-all", "5": work / "pool-5"}
        all_agents = subset(args.data, pools["29"], args.rows, None)
        subset(args.data, pools["5"], args.rows, small_agents)
        timed_train(pools["29"], work, "probability")  # fills the embedding cache: not counted
        seconds: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.repeats):
            for kind in kinds:
                for size, data in pools.items():
                    seconds.setdefault((kind, size), []).append(timed_train(data, work, kind))
        prompts = [json.loads(line)["prompt"] for line in (pools["29"] / "tasks.jsonl").open(encoding="utf-8")]
        routers = {size: work / f"router-probability-{pools[size].name}" for size in pools}
        speed = routing_speed(routers, prompts[:256], args.repeats) if "probability" in kinds else None
    print(f"CPU: {cpu_summary()}; {args.rows} rows; pools of {len(all_agents)} and {SMALL_POOL} agents")
    print(f"the {SMALL_POOL} agents: {', '.join(small_agents)}")
    print("\n| train (s, wall, whole command) | 29 agents | 5 agents | 29 / 5 |\n| --- | ---: | ---: | ---: |")
    for kind in kinds:
        big, small = (statistics.median(seconds[(kind, size)]) for size in ("29", "5"))
        runs = ", ".join(f"{value:.1f}" for value in seconds[(kind, "29")])
        print(f"| {kind} (runs: {runs}) | {big:.1f} | {small:.1f} | {big / small:.2f} |")
    if speed is None:
        return
    print("\n| routing, 1 thread, batches of 16 | 29 agents | 5 agents | 29 / 5 |\n| --- | ---: | ---: | ---: |")
    for key, label in (("ms", "ms per query"), ("head_ms", "of which the head, ms per query")):
        print(
            f"| {label} | {speed['29'][key]:.4f} | {speed['5'][key]:.4f} | {speed['29'][key] / speed['5'][key]:.2f} |"
        )


if __name__ == "__main__":
    main()
