"""What the LiteLLM routing plugin adds to a request, beside the router's own run, on loopback. From the
project root (docs/integrations/litellm.md records the output):

    python scripts/litellm_plugin_latency.py --requests 200 --concurrency 16

- the router's own run: pick_agent on one query, in this process (what any caller of the router pays);
- the plugin alone: BenchgenRoutingPlugin.run on a LiteLLM RoutingContext of that query (the router's run
  plus the hop to its worker thread and back);
- a LiteLLM Router call without the plugin and with it, one at a time, alternated so that the machine's
  load falls on both alike: the difference of their medians is what the plugin adds per request;
- the same with `--concurrency` calls in flight: latency, throughput, and queries per forward pass (the
  plugin merges the queries of concurrent requests).

The router is the default one (offline); the upstream answers at once (tests/upstream_server.ReplayUpstream,
five deployments, one per agent), so that the figures are LiteLLM's and the plugin's, not a model's.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM's price map from its wheel, offline
PROJECT_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_ROOT / "tests"))


def quantiles(seconds: list[float]) -> dict[str, float]:
    values = np.asarray(seconds) * 1000
    return {"p50_ms": float(np.median(values)), "p95_ms": float(np.percentile(values, 95)), "n": len(values)}


async def measure(args: argparse.Namespace, queries: list[str], base_url: str) -> dict:
    from litellm import Router
    from litellm.types.router import RoutingContext

    from benchgen_router import pick_agent
    from benchgen_router.integrations.engine import engine_for
    from benchgen_router.integrations.litellm import BenchgenRoutingPlugin

    agents = list(pick_agent("warm up")["probabilities"])
    plugin = BenchgenRoutingPlugin(agents={agent: f"openai/{agent}" for agent in agents})
    model_list = [
        {"model_name": "chat", "litellm_params": {"model": f"openai/{agent}", "api_base": base_url, "api_key": "k"}}
        for agent in agents
    ]
    plain = Router(model_list=model_list, num_retries=0)
    routed = Router(model_list=model_list, plugins=[plugin], num_retries=0)

    def messages(query: str) -> list[dict]:
        return [{"role": "user", "content": query}]

    async def call(router: Router, query: str) -> float:
        started = time.perf_counter()
        await router.acompletion(model="chat", messages=messages(query), metadata={})
        return time.perf_counter() - started

    for query in queries[:20]:  # warm: the router loaded, LiteLLM's clients made, both paths taken
        await call(plain, query)
        await call(routed, query)
    own, alone, without, with_plugin = [], [], [], []
    for index in range(args.requests):
        query = queries[index % len(queries)]
        started = time.perf_counter()
        pick_agent(query)
        own.append(time.perf_counter() - started)
        context = RoutingContext(
            raw_messages=messages(query),
            structured_messages=messages(query),
            candidate_models=[f"openai/{agent}" for agent in agents],
        )
        started = time.perf_counter()
        await plugin.run(context)
        alone.append(time.perf_counter() - started)
        first, second = (plain, routed) if index % 2 else (routed, plain)
        seconds = [await call(first, query), await call(second, query)]
        without.append(seconds[0] if first is plain else seconds[1])
        with_plugin.append(seconds[1] if first is plain else seconds[0])
    sequential = {
        "router_own_run": quantiles(own),
        "plugin_run_alone": quantiles(alone),
        "litellm_without_plugin": quantiles(without),
        "litellm_with_plugin": quantiles(with_plugin),
    }
    medians = [sequential[key]["p50_ms"] for key in ("litellm_with_plugin", "litellm_without_plugin")]
    sequential["added_p50_ms"] = medians[0] - medians[1]

    async def burst(router: Router) -> dict:
        engine = engine_for(plugin.source)
        passes, scored = engine.passes, engine.queries
        slots = asyncio.Semaphore(args.concurrency)

        async def one(query: str) -> float:
            async with slots:
                return await call(router, query)

        started = time.perf_counter()
        seconds = await asyncio.gather(*(one(queries[i % len(queries)]) for i in range(args.requests)))
        wall = time.perf_counter() - started
        record = {**quantiles(list(seconds)), "requests_per_s": args.requests / wall}
        if router is routed:
            record["queries_per_forward_pass"] = (engine.queries - scored) / max(1, engine.passes - passes)
        return record

    concurrent = {"litellm_without_plugin": await burst(plain), "litellm_with_plugin": await burst(routed)}
    return {"sequential": sequential, "concurrent": concurrent}


def main(argv: list[str] | None = None) -> int:
    from benchgen_router.bench.workload import DEFAULT_TASKS, load_workload
    from benchgen_router.hardware import cpu_summary
    from upstream_server import ReplayUpstream

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200, help="requests per measurement (default: %(default)s)")
    parser.add_argument("--concurrency", type=int, default=16, help="calls in flight at once (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    queries, source = load_workload(DEFAULT_TASKS, args.seed)
    with ReplayUpstream(lambda body: "ok") as upstream:
        figures = asyncio.run(measure(args, queries, upstream.base_url))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=PROJECT_ROOT)

    report = {
        "date": datetime.date.today().isoformat(),
        "commit": commit.stdout.strip(),
        "cpu": cpu_summary(),
        "litellm": version("litellm"),
        "command": " ".join(
            ["python scripts/litellm_plugin_latency.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "queries": source,
        **figures,
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
