"""The LiteLLM plugins in LiteLLM's own Router, on loopback: three OpenAI-compatible upstreams (the project's
scripted test upstreams, answering "I am <model>"), real routers, no mocks. A routed call reaches the
deployment of the agent pick_agent picks for the same text, streamed or not; whatever fails leaves
LiteLLM's own choice, says why in one log line, and never fails the call."""

from __future__ import annotations

import asyncio
import logging

import pytest
from litellm import Router

from benchgen_router import pick_agent
from benchgen_router.integrations.litellm import (
    SIGNALS_KEY,
    BenchgenClassifierPlugin,
    BenchgenRoutingPlugin,
    ascii_header,
    check_mapping,
    decision_headers,
)
from helpers import AGENTS, make_queries, train_probability_router
from litellm_pool import POOL, TIER_GROUPS, TIERS, complexity_group, deployment
from upstream_server import MisbehavingUpstream, down_upstream

PLUGIN_LOGGER = "benchgen_router.integrations.litellm"
pytest_plugins = ["litellm_pool"]


def chat_group(upstreams: list[MisbehavingUpstream], agents: list[str] = POOL) -> list[dict]:
    """The group "chat": one deployment per agent, `openai/<agent>`, spread over the upstreams."""
    return [
        deployment("chat", f"openai/{agent}", upstreams[i % len(upstreams)].base_url, f"dep-{agent}")
        for i, agent in enumerate(agents)
    ]


def ask(router: Router, text: str | list, *, model: str = "chat", stream: bool = False, **metadata) -> tuple:
    """(the answer's text, the request's metadata after the call, the answer's hidden params)."""

    async def call() -> tuple:
        sent = dict(metadata)  # LiteLLM writes into it: a fresh dict per call
        response = await router.acompletion(
            model=model, messages=[{"role": "user", "content": text}], stream=stream, metadata=sent
        )
        if stream:
            words = "".join([chunk.choices[0].delta.content or "" async for chunk in response])
            return words, sent, response._hidden_params
        return response.choices[0].message.content, sent, response._hidden_params

    return asyncio.run(call())


def routed(metadata: dict) -> dict:
    return metadata["routing_plugin_signals"][SIGNALS_KEY]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_each_call_reaches_the_deployment_of_the_agent_the_router_picks(upstreams, pool_router, picks, stream):
    plugin = BenchgenRoutingPlugin(pool_router, agents={agent: f"openai/{agent}" for agent in POOL})
    router = Router(model_list=chat_group(upstreams), plugins=[plugin], num_retries=0)
    for agent, query in picks.items():
        before = [len(server.requests) for server in upstreams]
        text, metadata, hidden = ask(router, query, stream=stream)
        expected = pick_agent(query, model=pool_router)
        assert text == f"I am {agent}" and hidden["model_id"] == f"dep-{agent}"
        grew = [len(server.requests) - count for server, count in zip(upstreams, before, strict=True)]
        assert grew == [int(name == agent) for name in POOL]
        decision = routed(metadata)
        assert decision["routed"] is True and decision["agent"] == expected["picked_agent"] == agent
        assert decision["model"] == f"openai/{agent}" and decision["operating_point"] == "balanced"
        assert decision["probabilities"] == pytest.approx(expected["probabilities"], abs=1e-6)
        assert metadata["_routing_plugin_candidate_models"] == [f"openai/{agent}"]


def test_an_operating_point_from_the_plugin_or_the_request_metadata(upstreams, pool_router):
    queries = make_queries(60, seed=4)
    quality = pick_agent(queries, model=pool_router, operating_point="quality")
    balanced = pick_agent(queries, model=pool_router)
    query, expected = next(
        (query, q["picked_agent"])
        for query, q, b in zip(queries, quality, balanced, strict=True)
        if q["picked_agent"] != b["picked_agent"]
    )
    agents = {agent: f"openai/{agent}" for agent in POOL}
    router = Router(model_list=chat_group(upstreams), plugins=[BenchgenRoutingPlugin(pool_router, agents=agents)])
    text, metadata, _ = ask(router, query, benchgen_operating_point="quality")
    assert text == f"I am {expected}" and routed(metadata)["operating_point"] == "quality"
    by_default = BenchgenRoutingPlugin(pool_router, agents=agents, operating_point="quality")
    router = Router(model_list=chat_group(upstreams), plugins=[by_default])
    assert ask(router, query)[0] == f"I am {expected}"
    text, metadata, _ = ask(router, query, benchgen_operating_point="balanced")  # the request's own wins
    assert routed(metadata)["operating_point"] == "balanced" and routed(metadata)["agent"] != expected


def test_a_probability_heads_tradeoff_from_the_plugin_or_the_request_metadata(upstreams, tmp_path, backbone_dir):
    router_folder, prompts = train_probability_router(tmp_path, backbone_dir)
    cheapest = "tolerance=1"  # within 1 of the best: the cheapest agent of the pool (open_mid)
    query = next(
        prompt
        for prompt in prompts
        if pick_agent(prompt, model=router_folder)["picked_agent"]
        != pick_agent(prompt, model=router_folder, tradeoff=cheapest)["picked_agent"]
    )
    expected = pick_agent(query, model=router_folder, tradeoff=cheapest)
    agents = {agent: f"openai/{agent}" for agent in AGENTS}
    model_list = chat_group(upstreams, AGENTS)
    router = Router(model_list=model_list, plugins=[BenchgenRoutingPlugin(router_folder, agents=agents)])
    text, metadata, _ = ask(router, query, benchgen_tradeoff=cheapest)
    assert text == f"I am {expected['picked_agent']}"
    assert routed(metadata)["tradeoff"] == cheapest
    assert routed(metadata)["probabilities"] == pytest.approx(expected["probabilities"], abs=1e-6)
    plugin = BenchgenRoutingPlugin(router_folder, agents=agents, tradeoff=cheapest)
    text, metadata, _ = ask(Router(model_list=model_list, plugins=[plugin]), query)
    assert text == f"I am {expected['picked_agent']}" and routed(metadata)["tradeoff"] == cheapest


FAILURES = {
    "a rule the router refuses": ({"benchgen_tradeoff": "budget=0.3"}, {}, "the router refused: tradeoff="),
    "a setting that is not a string": ({"benchgen_operating_point": 3}, {}, "the router refused metadata"),
    "no user text": ({}, {"content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}, "no text to route on"),
    "an agent with no model": ({}, {"agents": {"alpha": "openai/alpha", "beta": "openai/beta"}}, "no LiteLLM model"),
    "a router that does not load": ({}, {"model": "missing-router"}, "the router did not load"),
}


@pytest.mark.parametrize("case", list(FAILURES))
def test_a_failure_leaves_litellms_choice_with_one_log_line(upstreams, pool_router, picks, tmp_path, caplog, case):
    metadata, options, reason = FAILURES[case]
    query = picks["alpha"]
    model = tmp_path / options["model"] if "model" in options else pool_router
    plugin = BenchgenRoutingPlugin(model, agents=options.get("agents", {agent: f"openai/{agent}" for agent in POOL}))
    router = Router(model_list=chat_group(upstreams), plugins=[plugin], num_retries=0)
    answers = set()
    with caplog.at_level(logging.WARNING, logger=PLUGIN_LOGGER):
        for _ in range(12):
            text, after, _ = ask(router, options.get("content", query), **metadata)
            answers.add(text)
            assert "_routing_plugin_candidate_models" not in after  # LiteLLM's candidates, unnarrowed
            assert routed(after)["routed"] is False and routed(after)["reason"].startswith(reason)
    assert len(answers) > 1, f"12 calls all went to {answers}: LiteLLM's own choice would spread them"
    lines = [record.getMessage() for record in caplog.records if record.name == PLUGIN_LOGGER]
    assert len(lines) == 1, lines  # the first of a kind; the rest are counted for the next minute's line
    assert lines[0].startswith("benchgen-router: LiteLLM's choice stands: " + reason)
    assert query not in caplog.text


def test_a_fallback_group_outside_the_pool_answers_after_the_picked_deployment_fails(upstreams, pool_router, picks):
    """LiteLLM keeps a narrowed candidate list on the request, so the fallback group's deployments would all
    be filtered out by the first group's choice; the plugin leaves each attempt at its own choice."""
    agents = {agent: f"openai/{agent}" for agent in POOL}
    with down_upstream() as dead:
        model_list = [deployment("chat", f"openai/{agent}", dead) for agent in POOL]
        model_list.append(deployment("backup", "openai/backup", upstreams[0].base_url))
        plugin = BenchgenRoutingPlugin(pool_router, agents=agents)
        router = Router(model_list=model_list, plugins=[plugin], num_retries=0, fallbacks=[{"chat": ["backup"]}])
        text, metadata, _ = ask(router, picks["beta"])
    assert text == "I am backup"
    assert routed(metadata)["agent"] == "beta"  # the caller's metadata keeps the first attempt's decision


def test_a_fallback_group_of_other_pool_agents_gets_the_likeliest_of_them(upstreams, pool_router, picks):
    query = picks["beta"]
    probabilities = pick_agent(query, model=pool_router)["probabilities"]
    likeliest = max(["alpha", "gamma"], key=probabilities.__getitem__)
    agents = {agent: f"openai/{agent}" for agent in POOL}
    with down_upstream() as dead:
        model_list = [deployment("chat", "openai/beta", dead)]
        model_list += [deployment(group, f"openai/{agent}", upstreams[0].base_url) for agent in ("alpha", "gamma")
                       for group in ("chat", "rest")]  # fmt: skip
        plugin = BenchgenRoutingPlugin(pool_router, agents=agents)
        router = Router(model_list=model_list, plugins=[plugin], num_retries=0, fallbacks=[{"chat": ["rest"]}])
        calls = [ask(router, query) for _ in range(8)]  # LiteLLM alone would spread them over alpha and gamma
    assert {text for text, _, _ in calls} == {f"I am {likeliest}"}
    metadata = calls[0][1]
    assert routed(metadata)["agent"] == "beta"  # the caller's metadata keeps the first attempt's decision


def test_a_call_to_one_deployment_by_id_is_left_alone(upstreams, pool_router, picks):
    plugin = BenchgenRoutingPlugin(pool_router, agents={agent: f"openai/{agent}" for agent in POOL})
    router = Router(model_list=chat_group(upstreams), plugins=[plugin], num_retries=0)
    text, metadata, hidden = ask(router, picks["alpha"], model="dep-gamma")
    assert text == "I am gamma" and hidden["model_id"] == "dep-gamma"
    assert SIGNALS_KEY not in metadata.get("routing_plugin_signals", {})


def tier_groups(upstreams: list[MisbehavingUpstream]) -> list[dict]:
    """A model group per agent, "<agent>-group", for the complexity router's tiers."""
    return [
        deployment(f"{agent}-group", f"openai/{agent}", server.base_url)
        for agent, server in zip(POOL, upstreams, strict=True)
    ]


def test_the_classifier_names_the_tier_of_the_agent_the_router_picks(upstreams, pool_router, picks):
    classifier = BenchgenClassifierPlugin(pool_router, tiers=TIERS)
    smart = complexity_group("smart", classifier_type="custom", classifier_plugin=classifier, tiers=TIER_GROUPS)
    router = Router(model_list=[*tier_groups(upstreams), smart], num_retries=0)
    for agent, query in picks.items():
        for stream in (False, True):
            text, metadata, hidden = ask(router, query, model="smart", stream=stream)
            assert text == f"I am {agent}"
            decision = metadata["routing_decision"]
            assert decision["cause"] == "classifier_plugin" and decision["tier"] == TIERS[agent]
            assert hidden["additional_headers"]["x-litellm-complexity-router-tier"] == TIERS[agent]


def test_a_classifier_that_fails_leaves_litellms_fallback_classifier(upstreams, pool_router, picks, caplog):
    classifier = BenchgenClassifierPlugin(pool_router, tiers={"alpha": "SIMPLE", "beta": "MEDIUM"})  # no gamma
    smart = complexity_group("smart", classifier_type="custom", classifier_plugin=classifier, tiers=TIER_GROUPS)
    router = Router(model_list=[*tier_groups(upstreams), smart], num_retries=0)
    with caplog.at_level(logging.WARNING, logger=PLUGIN_LOGGER):
        text, metadata, _ = ask(router, picks["alpha"], model="smart")
    assert text.startswith("I am ")
    decision = metadata["routing_decision"]
    assert decision["cause"] != "classifier_plugin" and decision["classifier_failure_reason"] == "declined"
    assert "no LiteLLM model for the pool's agent(s) ['gamma']" in caplog.text


def test_inside_a_tier_the_routing_plugin_keeps_the_model_name_of_the_picked_agent(upstreams, pool_router, picks):
    plugin = BenchgenRoutingPlugin(pool_router, agents={agent: f"{agent}-group" for agent in POOL})
    pool = [f"{agent}-group" for agent in POOL]
    smart = complexity_group("smart", tiers=dict.fromkeys(TIER_GROUPS, pool), plugins=[plugin])
    router = Router(model_list=[*tier_groups(upstreams), smart], num_retries=0)
    for agent, query in picks.items():
        assert ask(router, query, model="smart")[0] == f"I am {agent}"


# The pieces, without LiteLLM


def test_bad_plugin_settings_are_one_line_at_construction():
    with pytest.raises(TypeError, match="agents must map each agent id"):
        BenchgenRoutingPlugin(agents=["alpha"])
    with pytest.raises(ValueError, match="agent ids and LiteLLM model strings are non-empty strings"):
        BenchgenRoutingPlugin(agents={"alpha": ""})
    with pytest.raises(ValueError, match="route_on='last'"):
        BenchgenClassifierPlugin(tiers=TIERS, route_on="last")
    with pytest.raises(ValueError, match="timeout_s must be a positive number"):
        BenchgenClassifierPlugin(tiers=TIERS, timeout_s=0)
    with pytest.raises(TypeError, match="tradeoff must be a string"):
        BenchgenRoutingPlugin(agents={"alpha": "a"}, tradeoff=0.3)
    assert check_mapping({"alpha": "a"}, "agents", "x") == {"alpha": "a"}


def test_decision_headers_name_the_agent_or_why_not():
    signals = {"routed": True, "agent": "alpha", "tradeoff": "budget=0.3", "out_of_distribution": False}
    assert decision_headers(signals) == {
        "x-benchgen-routed": "true",
        "x-benchgen-agent": "alpha",
        "x-benchgen-tradeoff": "budget=0.3",
        "x-benchgen-out-of-distribution": "false",
    }
    assert decision_headers({"routed": False, "reason": "no text to route on: é\r\n"}) == {
        "x-benchgen-routed": "false",
        "x-benchgen-reason": "no text to route on: \\xe9  ",
    }
    assert ascii_header("agent-é") == "agent-\\xe9"
