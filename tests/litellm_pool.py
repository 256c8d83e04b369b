"""A three-agent pool for the LiteLLM tests: scripted OpenAI-compatible upstreams (the project's test upstreams,
answering "I am <model>"), a converted router over the pool, and a query the router sends to each agent.

A test module takes the fixtures with `pytest_plugins = ["litellm_pool"]` (one definition, shared by the run).

PYTEST_DONT_REWRITE: test modules import this file before pytest loads it as their plugin (see upstream_server).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchgen_router import pick_agent
from helpers import convert_release, make_queries, write_operating_release
from upstream_server import MisbehavingUpstream, Scripted

POOL = ["alpha", "beta", "gamma"]


def answer(body: dict) -> Scripted:
    """An OpenAI chat completion (or its stream) saying which model the request named."""
    text = f"I am {body.get('model')}"
    if not body.get("stream"):
        message = {"role": "assistant", "content": text}
        return Scripted(
            body={
                "id": "scripted",
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model"),
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6},
            }
        )
    chunk = {"id": "scripted", "object": "chat.completion.chunk", "created": 0, "model": body.get("model")}
    events = [
        {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": None}]},
        {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    pieces = [f"data: {json.dumps(event)}\n\n".encode() for event in events] + [b"data: [DONE]\n\n"]
    return Scripted(pieces=pieces, every_s=0.0, headers={"content-type": "text/event-stream"})


@pytest.fixture(scope="session")
def upstreams() -> Iterator[list[MisbehavingUpstream]]:
    servers = [MisbehavingUpstream(answer) for _ in POOL]
    for server in servers:
        server.__enter__()
    yield servers
    for server in servers:
        server.__exit__()


@pytest.fixture(scope="session")
def pool_router(tmp_path_factory, backbone_dir) -> Path:
    """A converted router over the pool alpha, beta, gamma with three operating points ('balanced' the default)."""
    folder = tmp_path_factory.mktemp("litellm-router")
    points = {"quality": (0.0, 0.0), "balanced": (0.2, 0.0), "fast": (0.0, 0.01)}
    manifest, weights, _ = write_operating_release(
        folder / "release", 32, points, "balanced", seed=3, backbone=str(backbone_dir), agents=POOL
    )
    return convert_release(manifest, weights, folder / "router", backbone_dir)


@pytest.fixture(scope="session")
def picks(pool_router) -> dict[str, str]:
    """A query the router sends to each agent of the pool, at its default point (every agent is picked)."""
    found: dict[str, str] = {}
    queries = make_queries(80, seed=21)
    for query, result in zip(queries, pick_agent(queries, model=pool_router), strict=True):
        found.setdefault(result["picked_agent"], query)
    if sorted(found) != POOL:
        raise RuntimeError(f"the test router never picks {set(POOL) - set(found)}: choose other queries")
    return found


def deployment(group: str, model: str, base_url: str, identifier: str | None = None) -> dict:
    """A model_list entry: `model` (litellm_params.model) of group `group` at `base_url`, with an id if given."""
    entry = {"model_name": group, "litellm_params": {"model": model, "api_base": base_url, "api_key": "sk-test"}}
    return {**entry, "model_info": {"id": identifier}} if identifier else entry


def complexity_group(name: str, **config) -> dict:
    return {
        "model_name": name,
        "litellm_params": {"model": "auto_router/complexity_router", "complexity_router_config": config},
    }


# The complexity router's tiers: an agent's tier, and the model group each tier is served by.
TIERS = {"alpha": "SIMPLE", "beta": "MEDIUM", "gamma": "COMPLEX"}
TIER_GROUPS = {"SIMPLE": "alpha-group", "MEDIUM": "beta-group", "COMPLEX": "gamma-group", "REASONING": "gamma-group"}
