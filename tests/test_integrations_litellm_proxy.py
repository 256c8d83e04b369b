"""The plugins in the LiteLLM Proxy, started as its own process from a config.yaml that names them by dotted
path, called with the openai SDK on loopback: each answer comes from the deployment of the agent the router
picks and carries the decision in x-benchgen-* headers; SIGTERM stops it, with nothing left running and its
port free."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from benchgen_router import pick_agent
from helpers import PROJECT_ROOT, listeners
from litellm_pool import POOL, TIER_GROUPS, TIERS, complexity_group, deployment
from upstream_server import HOST, MisbehavingUpstream, free_port, server_env

pytestmark = pytest.mark.slow
pytest_plugins = ["litellm_pool"]

# What `litellm --config` imports to start and serve beyond LiteLLM itself (pyproject's dev extra).
PROXY_MODULES = ("orjson", "backoff", "redis", "apscheduler", "jwt", "semver", "multipart", "expression")
PROXY_MODULES += ("fastapi_sso", "mcp", "soundfile")
STARTUP_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 30.0

PLUGINS_MODULE = """\
from benchgen_router.integrations.litellm import BenchgenClassifierPlugin, BenchgenRoutingPlugin

routing = BenchgenRoutingPlugin({router!r}, agents={agents!r})
classifier = BenchgenClassifierPlugin({router!r}, tiers={tiers!r})
"""


def proxy_skip_reason() -> str | None:
    missing = [name for name in PROXY_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        return f"the LiteLLM Proxy cannot start without {', '.join(missing)} (pip install -e '.[dev]')"
    return None


@dataclass
class Proxy:
    process: subprocess.Popen
    port: int
    key: str
    log: Path

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"


def write_config(folder: Path, router: Path, upstreams: list[MisbehavingUpstream], key: str) -> Path:
    agents = {agent: f"openai/{agent}" for agent in POOL}
    (folder / "benchgen_plugins.py").write_text(PLUGINS_MODULE.format(router=str(router), agents=agents, tiers=TIERS))
    servers = list(zip(POOL, upstreams, strict=True))
    models = [deployment("chat", f"openai/{agent}", server.base_url) for agent, server in servers]
    models += [deployment(f"{agent}-group", f"openai/{agent}", server.base_url) for agent, server in servers]
    smart = {"classifier_type": "custom", "classifier_plugin": "benchgen_plugins.classifier", "tiers": TIER_GROUPS}
    models.append(complexity_group("smart", **smart))
    config = {
        "model_list": models,
        "router_settings": {"plugins": ["benchgen_plugins.routing"], "num_retries": 0},
        "litellm_settings": {"callbacks": ["benchgen_router.integrations.litellm_proxy.response_headers"]},
        "general_settings": {"master_key": key},
    }
    path = folder / "config.yaml"
    path.write_text(json.dumps(config, indent=1))  # JSON is YAML
    return path


def healthy(proxy: Proxy) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"{proxy.base_url}/health/liveliness", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, pool_router, upstreams) -> Iterator[Proxy]:
    reason = proxy_skip_reason()
    if reason:
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("litellm-proxy")
    key = f"sk-{secrets.token_hex(12)}"  # the Proxy refuses the documented default key
    config = write_config(folder, pool_router, upstreams, key)
    port = free_port()
    env = {**server_env(), "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONPATH": str(PROJECT_ROOT)}
    log = folder / "proxy.log"
    start = "import sys; from litellm_cli.main import proxy_server; sys.exit(proxy_server())"
    command = [sys.executable, "-c", start, "--config", str(config), "--host", HOST, "--port", str(port)]
    with open(log, "wb") as output:
        process = subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=folder,
            start_new_session=True,
        )  # fmt: skip
    running = Proxy(process, port, key, log)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not healthy(running):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the LiteLLM Proxy did not start:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.25)
        yield running
    finally:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def client(proxy: Proxy):
    from openai import OpenAI

    return OpenAI(base_url=f"{proxy.base_url}/v1", api_key=proxy.key, max_retries=0)


def test_the_proxy_routes_each_call_to_the_picked_agent_and_says_so(proxy, pool_router, picks):
    openai = client(proxy)
    for agent, query in picks.items():
        expected = pick_agent(query, model=pool_router)["picked_agent"]
        messages = [{"role": "user", "content": query}]
        raw = openai.chat.completions.with_raw_response.create(model="chat", messages=messages)
        assert raw.parse().choices[0].message.content == f"I am {agent}" and expected == agent
        assert raw.headers["x-benchgen-routed"] == "true" and raw.headers["x-benchgen-agent"] == agent
        assert raw.headers["x-benchgen-operating-point"] == "balanced"
        assert raw.headers["x-litellm-model-name"] == f"openai/{agent}"
        with openai.chat.completions.with_streaming_response.create(model="chat", messages=messages, stream=True) as s:
            assert s.headers["x-benchgen-agent"] == agent
            words = "".join(chunk.choices[0].delta.content or "" for chunk in s.parse() if chunk.choices)
        assert words == f"I am {agent}"


def test_the_request_metadata_chooses_the_setting_and_a_bad_one_leaves_litellms_choice(proxy, pool_router, picks):
    openai = client(proxy)
    query = picks["gamma"]
    expected = pick_agent(query, model=pool_router, operating_point="quality")["picked_agent"]
    messages = [{"role": "user", "content": query}]
    metadata = {"metadata": {"benchgen_operating_point": "quality"}}
    raw = openai.chat.completions.with_raw_response.create(model="chat", messages=messages, extra_body=metadata)
    assert raw.headers["x-benchgen-operating-point"] == "quality" and raw.headers["x-benchgen-agent"] == expected
    assert raw.parse().choices[0].message.content == f"I am {expected}"
    refused = {"metadata": {"benchgen_tradeoff": "budget=0.3"}}
    raw = openai.chat.completions.with_raw_response.create(model="chat", messages=messages, extra_body=refused)
    assert raw.http_response.status_code == 200 and raw.parse().choices[0].message.content.startswith("I am ")
    assert raw.headers["x-benchgen-routed"] == "false"
    assert raw.headers["x-benchgen-reason"].startswith("the router refused: tradeoff='budget=0.3'")
    log = proxy.log.read_text(errors="replace")
    assert "LiteLLM's choice stands: the router refused" in log and query not in log


def test_the_classifier_named_in_the_config_picks_the_tier(proxy, picks):
    openai = client(proxy)
    for agent, query in picks.items():
        raw = openai.chat.completions.with_raw_response.create(
            model="smart", messages=[{"role": "user", "content": query}]
        )
        assert raw.parse().choices[0].message.content == f"I am {agent}"
        assert raw.headers["x-litellm-complexity-router-tier"] == TIERS[agent]


def test_sigterm_stops_the_proxy_with_nothing_left_running_and_its_port_free(proxy):
    """Last in this file: a process manager's stop (systemd, Docker, Kubernetes send SIGTERM)."""
    group = [proxy.process.pid, *(child.pid for child in psutil.Process(proxy.process.pid).children(recursive=True))]
    assert listeners(proxy.port)
    proxy.process.send_signal(signal.SIGTERM)
    proxy.process.wait(STOP_TIMEOUT_S)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in group):
        assert time.monotonic() < deadline, f"processes {group} outlived the proxy's stop"
        time.sleep(0.1)
    assert listeners(proxy.port) == []
