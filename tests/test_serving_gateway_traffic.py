"""The gateway's traffic through the service's real app on real HTTP (the harness of
test_serving_gateway_hostile: uvicorn on 127.0.0.1, a RouterService holding a real tiny router, a scripted
loopback upstream): conversations routed on their first user message."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from test_serving_gateway_hostile import AppServer, answered, build_router, make_service, pool_of

from benchgen_router.serving.gateway import GatewaySettings
from helpers import make_queries
from upstream_server import MisbehavingUpstream

QUERIES = make_queries(40, seed=21)


@pytest.fixture(scope="module")
def upstream() -> Iterator[MisbehavingUpstream]:
    with MisbehavingUpstream(lambda body: answered()) as server:
        yield server


@pytest.fixture(scope="module")
def router_dir(backbone_dir, tmp_path_factory) -> Path:
    return build_router(tmp_path_factory.mktemp("traffic-router"), backbone_dir)


@pytest.fixture(scope="module")
def services(router_dir, upstream) -> Iterator[dict[str, AppServer]]:
    """One app per way of choosing the text routed on."""
    servers = {}
    try:
        for route_on in ("first-user", "last-user"):
            settings = GatewaySettings(pool_of(upstream.base_url), route_on=route_on, timeout_s=30.0)
            servers[route_on] = AppServer(make_service(router_dir, settings)).__enter__()
        yield servers
    finally:
        for server in servers.values():
            server.__exit__()


def picks(app: AppServer, texts: list[str]) -> list[str]:
    with httpx.Client(timeout=30, trust_env=False) as http:
        answer = http.post(f"{app.url}/v1/route", json={"queries": texts})
    assert answer.status_code == 200, answer.text
    return [result["picked_agent"] for result in answer.json()["results"]]


def agent_of(app: AppServer, messages: list[dict]) -> str:
    with httpx.Client(timeout=30, trust_env=False) as http:
        response = http.post(f"{app.url}/v1/chat/completions", json={"model": "benchgen-router", "messages": messages})
    assert response.status_code == 200, response.text
    return response.headers["x-benchgen-agent"]


def test_first_user_routes_every_turn_of_a_conversation_to_the_agent_of_its_opening(services):
    """A conversation whose later user turns, scored alone, would go to the other agent: with first-user,
    each turn goes to the agent the opening message is routed to; with last-user, the turns move."""
    first, last = services["first-user"], services["last-user"]
    chosen = picks(first, QUERIES)
    opening = QUERIES[chosen.index("alpha")]
    later = [query for query, agent in zip(QUERIES, chosen, strict=True) if agent == "beta"][:3]
    assert len(later) == 3, chosen  # both agents are picked among these queries
    messages = [{"role": "system", "content": "answer briefly"}, {"role": "user", "content": opening}]
    first_agents, last_agents = [], []
    for turn in later:
        messages += [{"role": "assistant", "content": "4"}, {"role": "user", "content": turn}]
        first_agents.append(agent_of(first, messages))
        last_agents.append(agent_of(last, messages))
    assert first_agents == ["alpha"] * 3
    assert last_agents == ["beta"] * 3
