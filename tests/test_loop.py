"""The whole loop from served traffic to a retrained router, with the commands docs/collect.md gives a user:
`serve --journal --journal-text` in front of `transformers serve` upstreams (two tiny random chat models,
one per agent), chat completions, users' feedback by request id, Ctrl-C, `collect --from-journal` with a
replay judge, `train --reward-column feedback_reward`, and `route` with the router it exported.

What is known in advance: the judge rates every answer of alpha 9 and every answer of beta 2, so the
judge's rewards say alpha everywhere; users score every answer beta served 1.0 and every one alpha
served 0.1, so with feedback beside the judge's ratings beta is the better agent on every prompt,
whichever agent served it. A router trained on feedback_reward must then route the journaled prompts
to beta. One service start (Ray Serve on loopback) and one upstream process; about two minutes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import PROJECT_ROOT, cli, convert_release, forged_request_id, make_queries, write_release
from upstream_server import ReplayUpstream, UpstreamServer, build_tiny_chat_model

httpx = pytest.importorskip("httpx")
pytest.importorskip("ray.serve")
pytest_plugins = ["upstream_server"]
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX sessions")]

AGENTS = ["alpha", "beta"]
PROMPTS = make_queries(20, seed=21)
RATINGS = {"alpha": 9, "beta": 2}  # the replay judge's verdict on each agent's answers
FEEDBACK = {"alpha": 0.1, "beta": 1.0}  # the users' score of each agent's answers
START, END = "[The Start of Assistant's Answer]\n", "\n[The End of Assistant's Answer]"


class OnDemandUpstream(UpstreamServer):
    """`transformers serve` with no model pinned: it loads each model a request names, so one process
    answers for both agents (each a folder of its own tiny model), and the pool starts in one start's time."""

    def command(self) -> list[str]:
        command = super().command()
        command.remove(self.model)
        return command


def write_json(path: Path, value: object) -> Path:
    path.write_text(json.dumps(value), encoding="utf-8")
    return path


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def wait_healthy(url: str, process: subprocess.Popen, log: Path, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=30, trust_env=False) as http:
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if http.get(f"{url}/healthz").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
    raise AssertionError(f"serve did not come up: {log.read_text(errors='replace')[-3000:]}")


def answers_of(base_url: str, model: str, prompts: list[str]) -> list[str]:
    """What an upstream answers each prompt (greedy: the answer collect will get)."""
    with httpx.Client(timeout=120, trust_env=False) as http:
        replies = [
            http.post(
                f"{base_url}/chat/completions", json={"model": model, "messages": [{"role": "user", "content": p}]}
            )
            for p in prompts
        ]
    return [reply.json()["choices"][0]["message"]["content"] for reply in replies]


def test_served_traffic_and_feedback_retrain_the_router(tmp_path, backbone_dir, serve_available):
    from benchgen_router.serving import free_port
    from benchgen_router.serving.journal_reading import read_journal

    models = {agent: build_tiny_chat_model(tmp_path / f"model-{agent}", seed=seed) for seed, agent in enumerate(AGENTS)}
    manifest, weights = write_release(tmp_path / "release", 32, seed=3, backbone=str(backbone_dir), agents=AGENTS)
    router = convert_release(manifest, weights, tmp_path / "router", backbone_dir)
    upstream = OnDemandUpstream(models["alpha"], log_dir=tmp_path)
    pool = write_json(
        tmp_path / "agents.json",
        {"agents": [{"agent_id": a, "base_url": upstream.base_url, "model": str(models[a].resolve())} for a in AGENTS]},
    )
    port, journal = free_port(), tmp_path / "journal"
    url = f"http://127.0.0.1:{port}"
    serve_log = tmp_path / "serve.log"
    upstream.start()  # the upstream and the service start side by side
    with serve_log.open("wb") as log:
        served = subprocess.Popen(
            [sys.executable, "-m", "benchgen_router", "serve", "--model", str(router), "--pool", str(pool),
             "--port", str(port), "--journal", str(journal), "--journal-text"],
            cwd=PROJECT_ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
        )  # fmt: skip
    try:
        upstream.wait_ready()
        wait_healthy(url, served, serve_log)

        # 1. Users chat through the gateway and score the answers by their request id.
        served_by = {}
        with httpx.Client(timeout=120, trust_env=False) as http:
            for prompt in PROMPTS:
                body = {"model": "benchgen-router", "messages": [{"role": "user", "content": prompt}]}
                answer = http.post(f"{url}/v1/chat/completions", json=body)
                assert answer.status_code == 200, answer.text
                request_id, agent = answer.headers["x-benchgen-request-id"], answer.headers["x-benchgen-agent"]
                served_by[prompt] = agent
                scored = http.post(f"{url}/v1/feedback", json={"request_id": request_id, "score": FEEDBACK[agent]})
                assert scored.status_code == 200, scored.text
            forged = http.post(f"{url}/v1/feedback", json={"request_id": forged_request_id(request_id), "score": 1})
            assert 400 <= forged.status_code < 500 and "\n" not in forged.json()["error"]["message"]

        # 2. Ctrl-C: every line is on disk when serve returns.
        os.killpg(served.pid, signal.SIGINT)
        assert served.wait(timeout=120) == 130
        calls = read_journal(journal).calls
        assert [(call["text"], call["agent"]) for call in calls] == [(p, served_by[p]) for p in PROMPTS]
        assert [[item["score"] for item in call["feedback"]] for call in calls] == [
            [FEEDBACK[served_by[p]]] for p in PROMPTS
        ]

        # 3. collect --from-journal, rated by a replay judge that knows alpha's answers.
        alpha_answers = set(answers_of(upstream.base_url, str(models["alpha"].resolve()), PROMPTS))

        def verdict(body: dict) -> str:
            text = body["messages"][-1]["content"]
            answer = text[text.index(START) + len(START) : text.index(END)]
            return f"Rating: [[{RATINGS['alpha' if answer in alpha_answers else 'beta']}]]"

        with ReplayUpstream(verdict) as judge:
            write_json(tmp_path / "judge.json", {"agents": [{"agent_id": "judge", "base_url": judge.base_url}]})
            assert cli(
                "collect", "--from-journal", journal, "--sample", len(PROMPTS), "--pool", pool,
                "--judge-pool", tmp_path / "judge.json", "--repetitions", 1, "--output", tmp_path / "calls.jsonl",
                "--no-progress",
            ) == 0  # fmt: skip
        prompts = {row["task_id"]: row["prompt"] for row in read_rows(tmp_path / "calls.tasks.jsonl")}
        rows = read_rows(tmp_path / "calls.rewards.jsonl")
        assert sorted(prompts.values()) == sorted(PROMPTS) and len(rows) == len(PROMPTS)
        judged = [RATINGS[agent] / 10 for agent in AGENTS]
        for row in rows:
            agent = served_by[prompts[row["task_id"]]]
            assert row["mean_reward"] == judged
            assert row["feedback_reward"] == [FEEDBACK[a] if a == agent else judged[j] for j, a in enumerate(AGENTS)]

        # 4. train on the users' feedback beside the judge's ratings, and 5. route with the new router.
        assert cli(
            "train", "--rewards", tmp_path / "calls.rewards.jsonl", "--tasks", tmp_path / "calls.tasks.jsonl",
            "--reward-column", "feedback_reward", "--backbone", backbone_dir, "--output-dir", tmp_path / "run",
            "--export", tmp_path / "new-router", "--cv-folds", 0, "--no-ood-guard", "--no-cache", "--no-progress",
        ) == 0  # fmt: skip
        trained = json.loads((tmp_path / "run" / "manifest.json").read_text())
        assert trained["evaluation"]["best_fixed_agent_id"] == "beta" and trained["n_total"] == len(PROMPTS)
        (tmp_path / "prompts.txt").write_text("".join(prompt + "\n" for prompt in PROMPTS), encoding="utf-8")
        assert cli(
            "route", "--model", tmp_path / "new-router", "--input", tmp_path / "prompts.txt",
            "--output", tmp_path / "picks.jsonl", "--quiet",
        ) == 0  # fmt: skip
        assert [row["picked_agent"] for row in read_rows(tmp_path / "picks.jsonl")] == ["beta"] * len(PROMPTS)
    finally:
        if served.poll() is None:
            os.killpg(served.pid, signal.SIGKILL)
            served.wait()
        upstream.stop()
