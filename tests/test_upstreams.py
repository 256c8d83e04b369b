"""upstreams.py: the pool file's endpoints, validated all at once with one line per problem, keys
read from the environment only, and a call's cost from usage or prices."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchgen_router.costs import load_pool
from benchgen_router.errors import InputError
from benchgen_router.upstreams import Upstream, read_upstream_pool, url_problem
from helpers import AGENTS, PILOT


def write_pool(path: Path, document: object) -> Path:
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def test_pool_defaults_apply_to_every_agent_and_per_agent_keys_win(tmp_path):
    document = {
        "base_url": "http://127.0.0.1:9000/v1/",
        "api_key_env": "POOL_KEY",
        "agents": [
            {"agent_id": "a", "slug": "org/a", "price_per_1m_prompt_usd": 1, "price_per_1m_output_usd": 2},
            {
                "agent_id": "b",
                "base_url": "https://other.example/api/v1",
                "model": "served-b",
                "api_key_env": "B_KEY",
                "price_per_1m_prompt_usd": 3,
                "price_per_1m_output_usd": 4,
            },
        ],
    }
    pool = read_upstream_pool(
        write_pool(tmp_path / "pool.json", document), ["a", "b"], {"POOL_KEY": "k1", "B_KEY": "k2"}
    )
    a, b = pool.upstreams["a"], pool.upstreams["b"]
    assert pool.agents == ("a", "b")
    assert (a.base_url, a.model, a.api_key_env) == ("http://127.0.0.1:9000/v1", "org/a", "POOL_KEY")
    assert (b.base_url, b.model, b.api_key_env) == ("https://other.example/api/v1", "served-b", "B_KEY")
    assert pool.resolve("a") is a and pool.resolve("org/a") is a and pool.resolve("served-b") is b
    assert pool.resolve("nobody") is None
    assert a.headers({"POOL_KEY": "k1"}) == {"Authorization": "Bearer k1"}
    assert "k1" not in repr(a)  # only the variable's name is held
    # the same file still prices calls for the trainer
    assert load_pool(tmp_path / "pool.json", ["a", "b"])["b"].prompt_usd_per_1m == 3


def test_every_problem_is_reported_at_once_one_line_each(tmp_path):
    document = [
        {"agent_id": "a", "base_url": "ftp://host/v1"},
        {"agent_id": "b", "base_url": "https://user:secret@host/v1"},
        {"agent_id": "c", "base_url": "http://host/v1", "api_key_env": "UNSET_KEY"},
        {"agent_id": "d"},
        {"agent_id": "stranger", "base_url": "http://host/v1"},
    ]
    with pytest.raises(InputError) as caught:
        read_upstream_pool(write_pool(tmp_path / "pool.json", document), ["a", "b", "c", "d", "e"], {})
    lines = str(caught.value).splitlines()
    assert len(lines) == 6 and all(line.startswith(f"pool file {tmp_path / 'pool.json'}: ") for line in lines)
    text = str(caught.value)
    assert "agent 'a': base_url 'ftp://host/v1' is not an http(s) URL" in text
    assert "agent 'b': base_url holds credentials" in text and "secret" not in text
    assert "environment variable UNSET_KEY (its api_key_env) is not set" in text
    assert "agent 'd' has no base_url" in text
    assert "the router's agent 'e' is not in the file" in text
    assert "agent 'stranger' is not one of the router's" in text


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("https://openrouter.ai/api/v1", None),
        ("http://127.0.0.1:8080/v1", None),
        ("openrouter.ai/api/v1", "not an http(s) URL"),
        ("http://host/v1?key=x", "query or fragment"),
        ("http://host:99999/v1", "invalid port"),
        (42, "is not a URL"),
    ],
)
def test_url_problems_name_what_is_wrong(url, problem):
    found = url_problem(url)
    assert found is None if problem is None else problem in found


def test_a_call_costs_the_billed_figure_or_its_tokens_at_the_pool_prices():
    priced = Upstream("a", "m", "http://h/v1", price_per_1m_prompt_usd=0.5, price_per_1m_output_usd=2.0)
    assert priced.cost_usd({"prompt_tokens": 1000, "completion_tokens": 500}) == pytest.approx(0.0015)
    assert priced.cost_usd({"prompt_tokens": 1000, "completion_tokens": 500, "cost": 0.01}) == 0.01
    assert priced.cost_usd(None) is None and priced.cost_usd({"prompt_tokens": "many"}) is None
    assert Upstream("b", "m", "http://h/v1").cost_usd({"prompt_tokens": 1, "completion_tokens": 1}) is None


@pytest.mark.skipif(not (PILOT / "agents.json").is_file(), reason="the pilot's agents.json is not next to the project")
def test_the_pilot_pool_with_one_endpoint_routes_to_its_slugs(tmp_path):
    agents = json.loads((PILOT / "agents.json").read_text())
    document = {"base_url": "https://openrouter.ai/api/v1", "api_key_env": "OPENROUTER_API_KEY", "agents": agents}
    pool = read_upstream_pool(write_pool(tmp_path / "pool.json", document), AGENTS, {"OPENROUTER_API_KEY": "x"})
    assert [pool.upstreams[agent].model for agent in AGENTS] == [row["slug"] for row in agents]
