"""A pool of 29 agents through every entry point: `train` (both head kinds), `route`, `evaluate`, the Hub view
(`pipeline(..., top_k=...)`), and the service's gateway in front of 29 upstreams; and what a user reads of
such a router (config.json and the card) stays short."""

from __future__ import annotations

import json

import numpy as np
import pytest
from transformers import AutoModel, AutoTokenizer, pipeline

from helpers import call_record, calls_row, cli, make_queries, run_tool, write_jsonl

AGENTS = [f"model-{j:02d}" for j in range(29)]
PRICES = np.geomspace(1e-5, 1e-3, 29)  # USD per call: dearer agents are better below


def pool_of_29(folder):
    """(rewards, tasks, calls) of 150 tasks: agent j answers a task right with a probability that grows with
    j, and the cheap agent 03 answers every short question right."""
    rng = np.random.default_rng(29)
    prompts = make_queries(150, seed=29)
    rewards, tasks, calls = [], [], []
    for i, prompt in enumerate(prompts):
        correct = rng.random(29) < np.linspace(0.1, 0.8, 29)
        correct[3] = correct[3] or len(prompt) < 60
        made = [call_record(agent, bool(correct[j]), float(PRICES[j])) for j, agent in enumerate(AGENTS)]
        row = calls_row(f"t{i}", AGENTS, made)
        calls.append(row)
        rewards.append({"task_id": f"t{i}", "agent_order": AGENTS, "mean_reward": row["mean_reward"]})
        tasks.append({"task_id": f"t{i}", "prompt": prompt, "split": "test" if i % 5 == 0 else "train"})
    return (
        write_jsonl(folder / "rewards.jsonl", rewards),
        write_jsonl(folder / "tasks.jsonl", tasks),
        write_jsonl(folder / "calls.jsonl", calls),
    )


@pytest.fixture(scope="module")
def routers(tmp_path_factory, backbone_dir):
    """{"probability": folder, "cmaes": folder} trained on the pool of 29, and the data files."""
    folder = tmp_path_factory.mktemp("pool-of-29")
    rewards, tasks, calls = pool_of_29(folder)
    common = ["--rewards", rewards, "--tasks", tasks, "--calls", calls, "--backbone", backbone_dir, "--no-progress"]
    trained = {}
    for kind, extra in (
        ("probability", ["--head-kind", "probability"]),
        ("cmaes", ["--operating-point", "quality=0", "--operating-point", "economy=2", "--generations", "3"]),
    ):
        result = run_tool("train", *common, *extra, "--output-dir", folder / f"run-{kind}", "--export", folder / kind)
        assert result.returncode == 0, result.stderr
        trained[kind] = folder / kind
    return trained, (rewards, tasks, calls)


@pytest.mark.parametrize("kind", ["probability", "cmaes"])
def test_config_and_card_stay_short_and_name_every_agent(routers, kind):
    trained, _ = routers
    config_lines = (trained[kind] / "config.json").read_text().splitlines()
    assert len(config_lines) < 250  # the calibration's arrays are in model.safetensors, not here
    config = json.loads("\n".join(config_lines))
    assert [config["id2label"][str(j)] for j in range(29)] == AGENTS
    card = (trained[kind] / "README.md").read_text()
    rows = [line for line in card.splitlines() if line.startswith("| ") and "`model-" in line]
    assert len(rows) == 29 and rows[0].startswith("| 0 | `model-00` |")  # the pool, one agent a row
    assert max(len(line) for line in card.splitlines() if not line.startswith("The pool")) < 600
    if kind == "probability":
        assert "probability-head" in card and "CMA-ES" not in card and "tradeoff=" in card
        assert f"| {PRICES[28] * 1000:.4g} |" in rows[28]  # each agent's expected cost per 1,000 queries
    else:
        assert "separable CMA-ES" in card


def test_route_and_evaluate_at_29_agents(routers, tmp_path, capsys):
    trained, (rewards, tasks, calls) = routers
    assert cli("route", "--model", trained["probability"], "--json", "--tradeoff", "tolerance=0.05", "What is 2?") == 0
    result = json.loads(capsys.readouterr().out)
    assert result["picked_agent"] in AGENTS and set(result["probabilities"]) == set(AGENTS)
    queries = tmp_path / "queries.txt"
    queries.write_text("\n".join(make_queries(20, seed=3)) + "\n")
    out = tmp_path / "picks.jsonl"
    assert cli("route", "--model", trained["cmaes"], "--input", queries, "--output", out, "--quiet") == 0
    picks = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(picks) == 20 and all(pick["picked_agent"] in AGENTS for pick in picks)
    args = ["--rewards", rewards, "--tasks", tasks, "--calls", calls, "--no-progress"]
    assert cli("evaluate", "--model", trained["probability"], *args, "--tradeoff", "usd-per-1k=0.3") == 0
    assert "usd-per-1k=0.3" in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["probability", "cmaes"])
def test_the_hub_view_ranks_29_agents_with_the_decision_first(routers, kind):
    trained, _ = routers
    queries = make_queries(6, seed=8)
    router = pipeline("text-classification", model=str(trained[kind]), trust_remote_code=True)
    model = AutoModel.from_pretrained(trained[kind], trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(trained[kind])
    picks = model(**tokenizer(queries, return_tensors="pt", padding=True)).picks.tolist()
    for query, pick in zip(queries, picks, strict=True):
        top = router(query, top_k=5)
        assert len(top) == 5 and top[0]["label"] == AGENTS[pick]
        everyone = router(query, top_k=None)
        assert sorted(entry["label"] for entry in everyone) == AGENTS


@pytest.mark.slow  # a Ray Serve service
def test_the_gateway_calls_the_picked_one_of_29_upstreams(routers, tmp_path):
    """29 scripted upstreams, each answering with its own agent id: a routed completion's answer is the
    agent the x-benchgen-agent header names, for a pool file of 29 entries."""
    import contextlib

    import httpx

    from benchgen_router.serving import free_port, serve
    from upstream_server import ReplayUpstream

    trained, _ = routers
    with contextlib.ExitStack() as stack:
        upstreams = [stack.enter_context(ReplayUpstream(lambda body, agent=agent: agent)) for agent in AGENTS]
        pool = tmp_path / "agents.json"
        entries = [
            {"agent_id": agent, "base_url": upstream.base_url, "model": agent, "price_per_1m_prompt_usd": 1.0,
             "price_per_1m_output_usd": 2.0}
            for agent, upstream in zip(AGENTS, upstreams, strict=True)
        ]  # fmt: skip
        pool.write_text(json.dumps({"agents": entries}))
        running = serve(str(trained["probability"]), port=free_port(), pool_file=pool, blocking=False)
        try:
            with httpx.Client(timeout=120, trust_env=False) as http:
                for query in make_queries(8, seed=5):
                    body = {"model": "benchgen-router:tolerance=0.05", "messages": [{"role": "user", "content": query}]}
                    answer = http.post(f"{running.url}/v1/chat/completions", json=body)
                    assert answer.status_code == 200, answer.text
                    agent = answer.headers["x-benchgen-agent"]
                    assert agent in AGENTS and answer.json()["choices"][0]["message"]["content"] == agent
        finally:
            running.close()
    assert sum(len(upstream.requests) for upstream in upstreams) == 8
