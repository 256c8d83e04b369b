"""The OpenAI-compatible gateway. Fast, without a service: model names, the text routed on, costs, the
choice of the retry agent, usage read from a stream, the retry rules over a mock transport, and a service
without upstreams. Slow, on a real Ray Serve service (127.0.0.1) in front of real `transformers serve`
upstreams (tests/upstream_server.py): routed, streamed and passed-through completions with their headers
and costs, /v1/models, bad requests, 100 concurrent requests, metrics; then, with one agent's upstream
stalled (HeldUpstream, scripts/gateway_overhead.py) and the other real, retries on the fallback, a client
that disconnects, /v1/route beside held streams, a 502 without the key in its body or in any log, every
agent down; a bad pool refused at start, one line per problem; and, with a probability head in place
of the router, trade-offs in the model name or body routed as pick_agent routes them.

A tiny router over two agents (alpha, beta, three operating points) is converted at test time; one Ray
and port serve the module, the stalled pool's application replacing the first after its tests."""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import time
from pathlib import Path
from types import MethodType, SimpleNamespace

import pytest

from helpers import (
    convert_release,
    forged_request_id,
    make_queries,
    run_tool,
    train_probability_router,
    write_operating_release,
)
from scripts.gateway_overhead import HeldUpstream
from upstream_server import parse_sse

# Before Ray starts (its workers inherit this process's environment): a key recognisable anywhere it
# might leak, and metrics that reach the Prometheus endpoint within a second.
KEY_ENV = "BENCHGEN_GATEWAY_TEST_KEY"
KEY = "sk-gateway-test-7f3a9c1e5b"
os.environ[KEY_ENV] = KEY
os.environ.setdefault("RAY_metrics_report_interval_ms", "1000")

httpx = pytest.importorskip("httpx")
pytest.importorskip("ray.serve")
pytest_plugins = ["upstream_server"]

from benchgen_router.chat_text import ROUTE_ON, ROUTING_TEXT_MAX_CHARS  # noqa: E402
from benchgen_router.errors import InputError  # noqa: E402
from benchgen_router.serving.app import RouterService, api  # noqa: E402
from benchgen_router.serving.call_plan import routed_plan  # noqa: E402
from benchgen_router.serving.gateway import (  # noqa: E402
    Gateway,
    GatewayError,
    GatewaySettings,
    Target,
    chosen_tradeoff,
    names_upstreams,
    parse_model,
    routing_text,
)
from benchgen_router.serving.service_settings import read_gateway  # noqa: E402
from benchgen_router.serving.upstream_call import encode_body  # noqa: E402
from benchgen_router.upstreams import Upstream, UpstreamPool  # noqa: E402

AGENTS = ["alpha", "beta"]
PRICES = {"alpha": (1.0, 2.0), "beta": (0.5, 4.0)}  # USD per 1M prompt, output tokens
POINTS = {"quality": (0.0, 0.0), "balanced": (0.2, 0.0), "fast": (0.0, 0.01)}
QUERIES = make_queries(40, seed=13)


def upstream_of(agent: str, base_url: str = "http://127.0.0.1:9/v1", model: str | None = None) -> Upstream:
    prompt, output = PRICES[agent]
    return Upstream(
        agent=agent,
        model=model or f"served-{agent}",
        base_url=base_url,
        api_key_env=KEY_ENV,
        slug=f"tiny/{agent}",
        price_per_1m_prompt_usd=prompt,
        price_per_1m_output_usd=output,
    )


POOL = UpstreamPool(agents=tuple(AGENTS), upstreams={agent: upstream_of(agent) for agent in AGENTS})


def gateway_error(call, *args) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        call(*args)
    return caught.value


# ---------------------------------------------------------------------------------------------
# Without a service


def test_model_names_route_at_a_point_or_pass_to_an_agent():
    assert parse_model("benchgen-router", POOL, ["fast", "quality"]).upstream is None
    assert parse_model("benchgen-router", POOL, ["fast", "quality"]).point is None  # the service's default
    assert parse_model("benchgen-router:fast", POOL, ["fast", "quality"]).point == "fast"
    assert parse_model("alpha", POOL, []).upstream is POOL.upstreams["alpha"]  # an agent id
    assert parse_model("tiny/beta", POOL, []).upstream is POOL.upstreams["beta"]  # its slug
    assert parse_model("served-beta", POOL, []).upstream is POOL.upstreams["beta"]  # its upstream's name
    unknown_point = gateway_error(parse_model, "benchgen-router:cheap", POOL, ["fast", "quality"])
    assert (unknown_point.status, unknown_point.param) == (400, "model")
    assert "benchgen-router:fast, benchgen-router:quality" in str(unknown_point)
    assert "single head" in str(gateway_error(parse_model, "benchgen-router:fast", POOL, []))
    unknown = gateway_error(parse_model, "gpt-4o", POOL, [])
    assert (unknown.status, unknown.code, unknown.param) == (404, "model_not_found", "model")
    for missing in (None, "", 3):
        assert gateway_error(parse_model, missing, POOL, []).status == 400


def test_a_model_suffix_with_an_equals_sign_is_a_tradeoff_and_the_body_field_must_agree():
    assert parse_model("benchgen-router:budget=0.3", POOL, ["fast"]) == Target(tradeoff="budget=0.3")
    assert parse_model("benchgen-router:usd-per-1k=2.5", POOL, []) == Target(tradeoff="usd-per-1k=2.5")
    assert parse_model("benchgen-router:fast", POOL, ["fast"]) == Target(point="fast")  # no "=": a point
    assert chosen_tradeoff(Target(tradeoff="budget=0.3"), {}) == "budget=0.3"
    assert chosen_tradeoff(Target(), {"tradeoff": "lambda=1"}) == "lambda=1"
    assert chosen_tradeoff(Target(tradeoff="lambda=1"), {"tradeoff": "lambda=1"}) == "lambda=1"
    assert chosen_tradeoff(Target(), {}) is None
    both = gateway_error(chosen_tradeoff, Target(tradeoff="budget=0.3"), {"tradeoff": "budget=0.5"})
    assert (both.status, both.param) == (400, "tradeoff") and "send one" in str(both)
    assert gateway_error(chosen_tradeoff, Target(), {"tradeoff": 0.3}).status == 400
    # The router's own field never reaches an upstream, which would refuse it.
    body = json.loads(encode_body({"model": "benchgen-router", "tradeoff": "lambda=1", "messages": []}, "served"))
    assert body == {"model": "served", "messages": []}


def test_the_text_routed_on_is_the_last_user_message_or_the_conversation():
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "first answer"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "t"}]},
        {"role": "tool", "content": "tool output"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "second"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "text", "text": "question"},
            ],
        },
    ]
    assert routing_text(messages, "last-user").text == "second\nquestion"
    assert routing_text(messages, "conversation").text == "first question\n\nfirst answer\n\nsecond\nquestion"
    assert routing_text(messages, "first-user").text == "first question"  # every turn: one agent
    image_only = [*messages, {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    assert routing_text(image_only, "last-user").text == "second\nquestion"  # the last user message with text
    routed = routing_text([{"role": "user", "content": "x" * 200_000}], "last-user")
    assert routed.text == "x" * ROUTING_TEXT_MAX_CHARS and routed.cut  # the journal line says it was cut
    exact = routing_text([{"role": "user", "content": "x" * ROUTING_TEXT_MAX_CHARS}], "last-user")
    assert len(exact.text) == ROUTING_TEXT_MAX_CHARS and not exact.cut  # whole, though as long as the limit
    halves = [{"role": "user", "content": "y" * (ROUTING_TEXT_MAX_CHARS // 2)}] * 2  # joined with "\n\n": 2 more
    assert routing_text(halves, "conversation").cut and not routing_text(halves, "last-user").cut
    for bad in (None, [], "hi", [{"role": "system", "content": "only a system prompt"}], [{"role": "user"}]):
        problem = gateway_error(routing_text, bad, "last-user")
        assert (problem.status, problem.param) == (400, "messages")
    assert "not valid UTF-8" in str(gateway_error(routing_text, [{"role": "user", "content": "\ud800"}], "last-user"))
    assert gateway_error(routing_text, [{"role": "assistant", "content": "hi"}], "conversation").status == 400


@pytest.mark.parametrize("invisible", ["\u200b", "\x00", "\ufeff\u200d", " \t\u00a0", "\u0301"])
def test_a_message_without_visible_text_is_skipped_like_an_image(invisible):
    """A zero-width space, a NUL, joiners, blanks or a lone combining mark: the router would score nothing
    (or an unknown token), so the text routed on is the nearest message with words, whichever the rule."""
    messages = [
        {"role": "user", "content": invisible},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": invisible},
        {"role": "user", "content": "last question"},
        {"role": "user", "content": [{"type": "text", "text": invisible}]},
    ]
    assert routing_text(messages, "last-user").text == "last question"
    assert routing_text(messages, "first-user").text == "first question"
    assert routing_text(messages, "conversation").text == "first question\n\nlast question"
    for route_on in ROUTE_ON:
        nothing = gateway_error(routing_text, [{"role": "user", "content": invisible}] * 2, route_on)
        assert (nothing.status, nothing.param) == (400, "messages") and "\n" not in str(nothing)


def forward_over(answers: list, payload: dict | None = None) -> tuple[object, list[httpx.Request]]:
    """Gateway.forward of a routed plan (alpha, then beta) over a mock transport that gives `answers`
    in turn (a status with a JSON body, or an exception to raise): (its answer or error, the requests)."""
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        outcome = answers[len(sent) - 1]
        if isinstance(outcome, Exception):
            raise outcome
        status, body = outcome
        return httpx.Response(status, json=body, headers={"x-ratelimit-remaining": "9", "server": "upstream"})

    async def scenario() -> object:
        gateway = Gateway(GatewaySettings(POOL, timeout_s=1.0))
        gateway.http = httpx.AsyncClient(transport=httpx.MockTransport(answer))
        plan = routed_plan({"picked_agent": "alpha", "probabilities": {"alpha": 0.6, "beta": 0.4}}, POOL, None, None)
        try:
            return await gateway.forward(payload or {"messages": [], "model": "benchgen-router"}, plan, False)
        except GatewayError as err:
            return err
        finally:
            await gateway.close()

    return asyncio.run(scenario()), sent


OK_BODY = {"choices": [], "usage": {"prompt_tokens": 1000, "completion_tokens": 1000}}


@pytest.mark.parametrize(
    "failure",
    [
        (503, {"error": "down"}),
        (500, {}),
        (429, {"error": "slow down"}),
        httpx.ConnectError("refused"),
        httpx.ReadTimeout("slow"),
    ],
    ids=["503", "500", "429", "connect", "timeout"],
)
def test_a_5xx_429_timeout_or_connection_error_is_retried_once_on_the_fallback(failure):
    response, sent = forward_over([failure, (200, OK_BODY)])
    assert [request.url.host for request in sent] == ["127.0.0.1", "127.0.0.1"]
    assert [json.loads(request.content)["model"] for request in sent] == ["served-alpha", "served-beta"]
    assert sent[0].headers["authorization"] == f"Bearer {KEY}"
    assert response.status_code == 200
    assert response.headers["x-benchgen-agent"] == "beta" and response.headers["x-benchgen-retried-from"] == "alpha"
    assert float(response.headers["x-benchgen-cost-usd"]) == pytest.approx((1000 * 0.5 + 1000 * 4.0) / 1e6)
    assert response.headers["x-ratelimit-remaining"] == "9" and "server" not in response.headers


def test_an_upstream_4xx_passes_through_and_two_failures_are_a_502():
    response, sent = forward_over([(400, {"error": {"message": "bad max_tokens"}})])
    assert len(sent) == 1 and response.status_code == 400  # not retried: the request is at fault
    assert json.loads(response.body) == {"error": {"message": "bad max_tokens"}}
    assert "x-benchgen-cost-usd" not in response.headers
    failed, sent = forward_over([(502, {}), httpx.ConnectError("refused")])
    assert len(sent) == 2 and isinstance(failed, GatewayError)
    assert (failed.status, failed.code) == (502, "upstream_error")
    assert "agent 'alpha': answered 502" in str(failed) and "agent 'beta': connection failed" in str(failed)
    body = {"model": "benchgen-router", "messages": [{"role": "user", "content": "hé"}], "temperature": 0}
    _, sent = forward_over([(200, OK_BODY)], body)
    assert json.loads(sent[0].content) == {**body, "model": "served-alpha"}  # only the model changes
    assert list(json.loads(sent[0].content)) == ["model", "messages", "temperature"]


def test_a_service_without_upstreams_answers_the_gateway_routes_with_a_404_in_openais_shape():
    from starlette.requests import Request

    cls = RouterService.func_or_class  # the class Ray Serve deploys, its methods run without Ray
    refused: list[str] = []
    service = SimpleNamespace(
        gateway=None,
        journal_metrics=None,
        rejected=SimpleNamespace(inc=lambda n, tags: refused.append(tags["status"])),
    )
    for name in ("chat_counted", "gateway_on", "count_refusal", "update_journal_metrics"):
        setattr(service, name, MethodType(getattr(cls, name), service))
    request = Request({"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []})
    with pytest.raises(GatewayError) as caught:
        asyncio.run(cls.chat_completions(service, request))
    assert refused == ["404"]  # counted among the refused requests
    handler = next(api.exception_handlers[cls] for cls in type(caught.value).__mro__ if cls in api.exception_handlers)
    response = asyncio.run(handler(request, caught.value))
    body = json.loads(response.body)
    assert response.status_code == 404 and set(body["error"]) == {"message", "type", "param", "code"}
    assert "names no upstreams" in body["error"]["message"] and body["error"]["code"] == "gateway_not_configured"
    plain = Request({"type": "http", "method": "POST", "path": "/v1/route", "headers": []})  # /v1/route: one line
    assert json.loads(asyncio.run(handler(plain, caught.value)).body) == {"error": str(caught.value)}


def test_a_pool_names_upstreams_with_a_base_url_for_the_pool_or_an_agent(tmp_path):
    assert names_upstreams({"base_url": "http://h/v1", "agents": []})
    assert names_upstreams([{"agent_id": "a"}, {"agent_id": "b", "base_url": "http://h/v1"}])
    assert not names_upstreams([{"agent_id": "a", "slug": "x"}]) and not names_upstreams({"agents": [{}]})
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps([{"agent_id": agent} for agent in AGENTS]))
    assert read_gateway(plain, None, None) is None  # the service as before: no gateway
    with pytest.raises(InputError, match="needs a pool file whose agents have a base_url"):
        read_gateway(plain, None, None, gateway_fallback="alpha")
    with pytest.raises(InputError, match="journal needs a pool file whose agents have a base_url") as refused:
        read_gateway(plain, None, None, journal=tmp_path / "journal")
    assert refused.value.cli.startswith("--journal needs")
    with pytest.raises(InputError, match="journal_text needs journal"):
        read_gateway(plain, None, None, journal_text=True)
    (tmp_path / "a-file").write_text("")
    good = tmp_path / "good.json"
    default_agents = ["frontier_a", "frontier_b", "frontier_c", "open_mid", "open_cheap_reasoning"]
    good.write_text(json.dumps({"base_url": "http://h:9/v1", "agents": [{"agent_id": a} for a in default_agents]}))
    with pytest.raises(InputError, match="is a file; pass a folder"):
        read_gateway(good, None, None, journal=tmp_path / "a-file")
    relative = read_gateway(good, None, None, journal="journal", journal_text=True)  # the default router
    assert relative.journal == str(Path("journal").resolve()) and relative.journal_text  # a replica's cwd differs


def test_serve_run_passes_the_gateway_settings_to_the_ingress(tmp_path):
    """`serve run ...:app_builder pool=... route_on=conversation gateway_timeout_s=5`: the pool's upstreams,
    checked against the default router's agents, and the settings reach the ingress; bad ones are one line."""
    from benchgen_router.serving.service import app_builder

    default_agents = ["frontier_a", "frontier_b", "frontier_c", "open_mid", "open_cheap_reasoning"]
    pool = tmp_path / "agents.json"
    pool.write_text(
        json.dumps({"base_url": "https://openrouter.ai/api/v1", "agents": [{"agent_id": a} for a in default_agents]})
    )
    application = app_builder({"pool": str(pool), "route_on": "conversation", "gateway_timeout_s": "5"})
    settings = application._bound_deployment.init_kwargs["gateway"]
    assert isinstance(settings, GatewaySettings) and settings.upstreams.agents == tuple(default_agents)
    assert (settings.route_on, settings.timeout_s, settings.fallback_agent) == ("conversation", 5.0, None)
    assert settings.upstreams.upstreams["open_mid"].base_url == "https://openrouter.ai/api/v1"
    with pytest.raises(InputError, match="route_on must be one of last-user, first-user, conversation"):
        app_builder({"pool": str(pool), "route_on": "everything"})
    with pytest.raises(InputError, match="gateway_fallback='nobody' is not an agent of the pool"):
        app_builder({"pool": str(pool), "gateway_fallback": "nobody"})
    plain = app_builder({})  # no pool: no gateway, the service as before
    assert plain._bound_deployment.init_kwargs["gateway"] is None
    journaled = {"pool": str(pool), "journal": str(tmp_path / "journal")}
    application = app_builder({**journaled, "journal_max_bytes": "64MiB", "journal_max_days": "7"})
    retention = application._bound_deployment.init_kwargs["gateway"].journal_retention
    assert (retention.max_bytes, retention.max_days) == (64 << 20, 7.0)
    with pytest.raises(InputError, match="journal_max_bytes='64MB' is not a size"):
        app_builder({**journaled, "journal_max_bytes": "64MB"})


# ---------------------------------------------------------------------------------------------
# A real service in front of real upstreams


@pytest.fixture(scope="module")
def router_dir(backbone_dir, tmp_path_factory) -> Path:
    """A converted router over alpha and beta, with three operating points ("balanced" the default)."""
    folder = tmp_path_factory.mktemp("gateway-router")
    manifest, weights, _ = write_operating_release(
        folder / "release", 32, POINTS, "balanced", seed=5, backbone=str(backbone_dir), agents=AGENTS
    )
    return convert_release(manifest, weights, folder / "router", backbone_dir)


@pytest.fixture(scope="module")
def upstreams(make_upstreams) -> list:
    return make_upstreams(2)  # one `transformers serve` per agent, different seeds: different answers


def write_pool(path: Path, base_urls: dict[str, str], models: dict[str, str]) -> Path:
    agents = [
        {
            "agent_id": agent,
            "slug": f"tiny/{agent}",
            "base_url": base_urls[agent],
            "model": models[agent],
            "price_per_1m_prompt_usd": PRICES[agent][0],
            "price_per_1m_output_usd": PRICES[agent][1],
        }
        for agent in AGENTS
    ]
    path.write_text(json.dumps({"api_key_env": KEY_ENV, "agents": agents}))
    return path


@pytest.fixture(scope="module")
def journal_folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("traffic") / "journal"  # made by the replica


@pytest.fixture(scope="module")
def service(router_dir, upstreams, journal_folder, tmp_path_factory):
    from benchgen_router.serving import free_port, serve

    pool = write_pool(
        tmp_path_factory.mktemp("pool") / "agents.json",
        {agent: server.base_url for agent, server in zip(AGENTS, upstreams, strict=True)},
        {agent: server.model for agent, server in zip(AGENTS, upstreams, strict=True)},
    )
    running = serve(
        str(router_dir),
        port=free_port(),
        pool_file=pool,
        max_batch_size=16,
        blocking=False,
        journal=journal_folder,
    )
    try:
        yield running
    finally:
        running.close()


def client(timeout: float = 120) -> httpx.Client:
    return httpx.Client(timeout=timeout, trust_env=False)


def chat(url: str, model: str = "benchgen-router", content: str = QUERIES[0], **fields) -> httpx.Response:
    with client() as http:
        return http.post(f"{url}/v1/chat/completions", json={"model": model, "messages": user(content), **fields})


def user(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


def routed_picks(url: str, texts: list[str], **fields) -> list[str]:
    with client() as http:
        answer = http.post(f"{url}/v1/route", json={"queries": texts, **fields})
    assert answer.status_code == 200, answer.text
    return [result["picked_agent"] for result in answer.json()["results"]]


def is_openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and "\n" not in error["message"]
    return error


@pytest.mark.slow
def test_models_lists_the_router_its_operating_points_and_the_agents(service):
    with client() as http:
        listing = http.get(f"{service.url}/v1/models").json()
        slug = http.get(f"{service.url}/v1/models/tiny/alpha")
        missing = http.get(f"{service.url}/v1/models/gpt-4o")
    assert listing["object"] == "list"
    assert [entry["id"] for entry in listing["data"]] == [
        "benchgen-router",
        "benchgen-router:balanced",
        "benchgen-router:fast",
        "benchgen-router:quality",
        *AGENTS,
    ]
    assert all(entry["object"] == "model" and isinstance(entry["created"], int) for entry in listing["data"])
    assert slug.status_code == 200 and slug.json()["id"] == "tiny/alpha"
    assert is_openai_error(missing, 404)["code"] == "model_not_found"


@pytest.mark.slow
def test_a_routed_completion_is_the_picked_agents_answer_with_the_decision_and_cost_in_headers(service, upstreams):
    """Each query goes to the agent /v1/route picks for it, whose upstream's answer comes back as it is
    (the same greedy answer as asking that upstream directly), its cost from the usage and the pool's prices."""
    picks = routed_picks(service.url, QUERIES[:12])
    assert set(picks) == set(AGENTS), picks  # both agents are exercised
    by_agent = dict(zip(AGENTS, upstreams, strict=True))
    with client() as http:
        for query, pick in zip(QUERIES[:12], picks, strict=True):
            response = chat(service.url, content=query, max_tokens=6)
            assert response.status_code == 200, response.text
            headers = response.headers
            assert headers["x-benchgen-agent"] == pick and headers["x-benchgen-routed"] == "true"
            assert headers["x-benchgen-operating-point"] == "balanced"  # the router's default
            assert headers["x-benchgen-out-of-distribution"] == "false"  # a router without a guard
            assert "x-benchgen-retried-from" not in headers
            body = response.json()
            direct = http.post(
                f"{by_agent[pick].base_url}/chat/completions", json=by_agent[pick].chat_body(query, max_tokens=6)
            )
            assert body["choices"][0]["message"] == direct.json()["choices"][0]["message"]
            assert body["model"] == by_agent[pick].model  # the upstream's own answer
            usage, (prompt_price, output_price) = body["usage"], PRICES[pick]
            expected = (usage["prompt_tokens"] * prompt_price + usage["completion_tokens"] * output_price) / 1e6
            assert float(headers["x-benchgen-cost-usd"]) == pytest.approx(expected, abs=1e-10)


@pytest.mark.slow
def test_the_model_name_chooses_the_operating_point(service):
    for point in POINTS:
        picks = routed_picks(service.url, QUERIES[:6], operating_point=point)
        for query, pick in zip(QUERIES[:6], picks, strict=True):
            response = chat(service.url, f"benchgen-router:{point}", query, max_tokens=2)
            assert response.status_code == 200, response.text
            assert response.headers["x-benchgen-operating-point"] == point
            assert response.headers["x-benchgen-agent"] == pick
    error = is_openai_error(chat(service.url, "benchgen-router:cheap"), 400)
    assert error["param"] == "model" and "benchgen-router:balanced" in error["message"]


@pytest.mark.slow
def test_a_stream_is_relayed_chunk_by_chunk_with_the_headers_first(service, upstreams):
    pick = routed_picks(service.url, QUERIES[:1])[0]
    with client() as http:
        body = {
            "model": "benchgen-router",
            "messages": user(QUERIES[0]),
            "stream": True,
            "max_tokens": 5,
            "stream_options": {"include_usage": True},  # relayed as asked: OpenAI's way to get a stream's usage
        }
        with http.stream("POST", f"{service.url}/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            assert response.headers["x-benchgen-agent"] == pick and response.headers["x-benchgen-routed"] == "true"
            assert "x-benchgen-cost-usd" not in response.headers  # sent before the usage is known
            pieces = list(response.iter_raw())
    chunks, _ = parse_sse(b"".join(pieces).decode().splitlines())
    # Several events, in order. How they fall into reads depends on the machine's load (a busy one
    # delivers a short stream in one read); that the first event is relayed while the upstream still
    # writes is shown by the held stream of test_a_client_that_disconnects_mid_stream_cancels_the_upstream_call.
    assert len(chunks) > 1 and chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert chunks[-1]["usage"]["completion_tokens"] == 5
    streamed = "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks if chunk["choices"])
    assert streamed == chat(service.url, content=QUERIES[0], max_tokens=5).json()["choices"][0]["message"]["content"]


@pytest.mark.slow
def test_an_agent_id_or_slug_is_passed_through_unrouted(service, upstreams):
    for name in ("beta", "tiny/beta"):
        response = chat(service.url, name, max_tokens=3)
        assert response.status_code == 200, response.text
        assert response.headers["x-benchgen-agent"] == "beta" and response.headers["x-benchgen-routed"] == "false"
        assert "x-benchgen-operating-point" not in response.headers
        assert response.json()["model"] == upstreams[1].model
        assert float(response.headers["x-benchgen-cost-usd"]) > 0
        assert len(response.headers.get_list("x-request-id")) == 1  # the service's; the upstream's is renamed
    error = is_openai_error(chat(service.url, "gpt-4o"), 404)
    assert (error["code"], error["param"], error["type"]) == ("model_not_found", "model", "invalid_request_error")


@pytest.mark.slow
def test_bad_requests_get_openai_errors_and_an_upstreams_4xx_passes_through(service):
    with client() as http:
        url = f"{service.url}/v1/chat/completions"
        system_only = {"model": "benchgen-router", "messages": [{"role": "system", "content": "be brief"}]}
        assert "no user text" in is_openai_error(http.post(url, json=system_only), 400)["message"]
        assert is_openai_error(http.post(url, json={"model": "benchgen-router"}), 400)["param"] == "messages"
        assert "not valid JSON" in is_openai_error(http.post(url, content=b"{oops"), 400)["message"]
        assert is_openai_error(http.post(url, json=["a list"]), 400)
        # transformers serve refuses fields outside OpenAI's schema with a 422: the gateway passes it on
        refused = http.post(url, json={"model": "alpha", "messages": user("hi"), "not_a_field": 1})
        assert refused.status_code == 422 and "error" not in refused.json()
        assert refused.headers["x-benchgen-agent"] == "alpha"
        assert http.get(f"{service.url}/healthz").status_code == 200


@pytest.mark.slow
def test_a_hundred_concurrent_requests_are_all_answered(service):
    async def scenario() -> list[int]:
        limits = httpx.Limits(max_connections=None)
        async with httpx.AsyncClient(timeout=300, limits=limits, trust_env=False) as http:
            calls = [
                http.post(
                    f"{service.url}/v1/chat/completions",
                    json={"model": "benchgen-router", "messages": user(QUERIES[i % len(QUERIES)]), "max_tokens": 2},
                )
                for i in range(100)
            ]
            return [response.status_code for response in await asyncio.gather(*calls)]

    started = time.monotonic()
    statuses = asyncio.run(scenario())
    print(f"100 concurrent routed completions answered in {time.monotonic() - started:.1f} s")
    assert statuses == [200] * 100


def metric_sum(text: str, name: str, **tags: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{key}="{value}"' in line for key, value in tags.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.slow
def test_calls_and_feedback_are_journaled_by_the_replicas(service, journal_folder):
    """serve(journal=...): a routed answer carries its request id, feedback on it is taken, and both
    lines reach the journal's folder, written by the replica."""
    from benchgen_router.serving.journal_reading import read_journal

    folder = journal_folder
    response = chat(service.url, content=QUERIES[1], max_tokens=2)
    assert response.status_code == 200, response.text
    request_id = response.headers["x-benchgen-request-id"]
    with client() as http:
        feedback = http.post(f"{service.url}/v1/feedback", json={"request_id": request_id, "score": 1})
        forged = http.post(f"{service.url}/v1/feedback", json={"request_id": forged_request_id(request_id), "score": 1})
    assert feedback.status_code == 200, feedback.text
    assert is_openai_error(forged, 404)["code"] == "request_not_found"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        calls = {call["request_id"]: call for call in read_journal(folder).calls} if folder.is_dir() else {}
        if calls.get(request_id, {}).get("feedback"):
            break
        time.sleep(0.2)
    call = calls[request_id]
    assert call["agent"] == response.headers["x-benchgen-agent"] and call["status"] == 200
    assert call["completion_tokens"] == response.json()["usage"]["completion_tokens"]
    assert [feedback["score"] for feedback in call["feedback"]] == [1.0]


@pytest.mark.slow
def test_metrics_count_requests_tokens_cost_and_latency_per_agent(service):
    assert chat(service.url, "alpha", max_tokens=3).status_code == 200
    names = {
        "requests": (
            "ray_benchgen_router_gateway_requests_total",
            {"agent": "alpha", "kind": "passthrough", "status": "2xx"},
        ),
        "routed": ("ray_benchgen_router_gateway_requests_total", {"kind": "routed", "status": "2xx"}),
        "prompt": ("ray_benchgen_router_gateway_prompt_tokens_total", {"agent": "alpha"}),
        "completion": ("ray_benchgen_router_gateway_completion_tokens_total", {"agent": "alpha"}),
        "cost": ("ray_benchgen_router_gateway_cost_usd_total", {"agent": "alpha"}),
        "latency": ("ray_benchgen_router_gateway_upstream_latency_seconds_count", {"agent": "alpha"}),
        "streamed": ("ray_benchgen_router_gateway_upstream_latency_seconds_count", {"stream": "true"}),
    }
    deadline = time.monotonic() + 30
    while True:
        with client() as http:
            text = http.get(service.metrics_url).text
        values = {key: metric_sum(text, name, **tags) for key, (name, tags) in names.items()}
        if all(values.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert all(value > 0 for value in values.values()), values
    assert values["completion"] >= 3 and values["routed"] >= 100  # the tests before this one
    assert 0 < values["cost"] < 1
    series = [line for line in text.splitlines() if line.startswith("ray_benchgen_router_")]
    assert series and all(math.isfinite(float(line.rsplit(" ", 1)[1])) for line in series)
    assert metric_sum(text, "ray_benchgen_router_routed_queries_total") >= values["routed"]  # routing counted too


# ---------------------------------------------------------------------------------------------
# One agent's upstream stalled (alpha, HeldUpstream), the other real (beta); routed on the conversation


@pytest.fixture(scope="module")
def held():
    with HeldUpstream() as upstream:
        yield upstream


@pytest.fixture(scope="module")
def stalled_service(service, router_dir, upstreams, held, tmp_path_factory):
    """The module's application replaced, on the same Ray and port: alpha's upstream never answers (a
    2 s timeout), the router scores the whole conversation."""
    from benchgen_router.serving import serve

    pool = write_pool(
        tmp_path_factory.mktemp("stalled-pool") / "agents.json",
        {"alpha": held.base_url, "beta": upstreams[1].base_url},
        {"alpha": "held", "beta": upstreams[1].model},
    )
    running = serve(
        str(router_dir),
        port=int(service.url.rsplit(":", 1)[1]),
        pool_file=pool,
        blocking=False,
        gateway_timeout_s=2,
        route_on="conversation",
    )
    try:
        yield running
    finally:
        running.close()


FOLLOW_UP = ("the answer is 4", "then relate it to the river")


def conversation(index: int) -> list[dict]:
    """A conversation whose last user message is the same for every index: only the whole of it tells them apart."""
    return [
        {"role": "system", "content": "answer briefly"},
        {"role": "user", "content": QUERIES[index]},
        {"role": "assistant", "content": FOLLOW_UP[0]},
        {"role": "user", "content": FOLLOW_UP[1]},
    ]


CONVERSATION_TEXTS = ["\n\n".join([QUERIES[index], *FOLLOW_UP]) for index in range(20)]  # what the router scores


@pytest.mark.slow
def test_a_stalled_agent_is_retried_on_the_fallback(stalled_service, held):
    """The router scores the conversation's user and assistant text (as /v1/route does that text); a
    call to alpha times out, its connection is closed, and beta answers."""
    picks = routed_picks(stalled_service.url, CONVERSATION_TEXTS)
    assert set(picks) == set(AGENTS), picks
    first = next(i for i, pick in enumerate(picks) if pick == "alpha")
    other = next(i for i, pick in enumerate(picks) if pick == "beta")
    closed = held.closed
    with client() as http:
        url = f"{stalled_service.url}/v1/chat/completions"
        started = time.monotonic()
        retried = http.post(url, json={"model": "benchgen-router", "messages": conversation(first), "max_tokens": 3})
        waited = time.monotonic() - started
        direct = http.post(url, json={"model": "benchgen-router", "messages": conversation(other), "max_tokens": 3})
    assert retried.status_code == 200, retried.text
    assert retried.headers["x-benchgen-agent"] == "beta" and retried.headers["x-benchgen-retried-from"] == "alpha"
    assert 2 <= waited < 30 and held.closed > closed  # the timeout, then the stalled call closed
    assert f"Bearer {KEY}".encode() in held.last_head  # the upstream got its key
    assert direct.status_code == 200 and direct.headers["x-benchgen-agent"] == "beta"
    assert "x-benchgen-retried-from" not in direct.headers


@pytest.mark.slow
def test_a_client_that_disconnects_mid_stream_cancels_the_upstream_call(stalled_service, held):
    closed = held.closed
    body = {"model": "alpha", "messages": user("hold on"), "stream": True}
    with client() as http, http.stream("POST", f"{stalled_service.url}/v1/chat/completions", json=body) as response:
        assert response.status_code == 200 and response.headers["x-benchgen-agent"] == "alpha"
        first = next(response.iter_raw())
        assert b"chat.completion.chunk" in first
        assert held.holding == 1
    # the client is gone: Ray Serve cancels the request, and the gateway closes its upstream connection
    deadline = time.monotonic() + 15
    while (held.holding or held.closed == closed) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert held.holding == 0 and held.closed == closed + 1


@pytest.mark.slow
def test_a_client_that_leaves_before_a_json_answer_cancels_the_upstream_call(stalled_service, held):
    """In the service's default mode (throughput, HAProxy in front): the upstream never answers, the
    client closes its connection; the upstream sees its own closed within seconds."""
    closed = held.closed
    data = json.dumps({"model": "alpha", "messages": user("hold on")}).encode()
    host, port = stalled_service.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port))) as connection:
        connection.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(data)}\r\n\r\n".encode()
            + data
        )
        deadline = time.monotonic() + 15
        while held.holding == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert held.holding == 1
    left = time.monotonic()
    while (held.holding or held.closed == closed) and time.monotonic() < left + 15:
        time.sleep(0.05)
    assert held.holding == 0 and held.closed == closed + 1 and time.monotonic() - left < 5


@pytest.mark.slow
def test_route_stays_fast_while_streams_are_held_open(stalled_service, held):
    """48 streams held open against an upstream that never ends them (2 cores): /v1/route answers
    every request meanwhile, as fast as before to within a second."""
    count = 48
    body = {"model": "alpha", "messages": user("hold on"), "stream": True}

    async def scenario() -> tuple[list[float], list[float], int]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=120, limits=limits, trust_env=False) as http:

            async def timed_routes() -> list[float]:
                seconds = []
                for query in QUERIES[:15]:
                    started = time.perf_counter()
                    answer = await http.post(f"{stalled_service.url}/v1/route", json={"queries": [query]})
                    assert answer.status_code == 200
                    seconds.append(time.perf_counter() - started)
                return seconds

            before = await timed_routes()
            opened, release = asyncio.Event(), asyncio.Event()
            started = [0]

            async def hold() -> None:
                async with http.stream("POST", f"{stalled_service.url}/v1/chat/completions", json=body) as response:
                    assert response.status_code == 200
                    chunks = response.aiter_raw()  # kept: a dropped iterator would close the connection
                    await anext(chunks)
                    started[0] += 1
                    if started[0] == count:
                        opened.set()
                    await release.wait()

            streams = [asyncio.create_task(hold()) for _ in range(count)]
            await asyncio.wait_for(opened.wait(), 120)
            during = await timed_routes()
            holding = held.holding
            release.set()
            await asyncio.gather(*streams)
            return before, during, holding

    before, during, holding = asyncio.run(scenario())
    median = lambda values: sorted(values)[len(values) // 2]  # noqa: E731
    print(
        f"/v1/route beside {holding} held streams: median {1000 * median(during):.0f} ms, max "
        f"{1000 * max(during):.0f} ms (alone: median {1000 * median(before):.0f} ms)"
    )
    assert holding == count
    assert median(during) < median(before) + 1.0 and max(during) < 5.0
    deadline = time.monotonic() + 15
    while held.holding and time.monotonic() < deadline:
        time.sleep(0.1)
    assert held.holding == 0


def ray_log_text() -> str:
    """Everything the Ray of this module has logged so far (Serve's replica logs included)."""
    import ray

    logs = Path(ray._private.worker._global_node.get_logs_dir_path())
    return "\n".join(path.read_text(errors="replace") for path in logs.rglob("*") if path.is_file())


@pytest.mark.slow
def test_a_failed_passthrough_is_a_502_in_openais_shape_and_the_key_appears_nowhere(stalled_service, held, capfd):
    """A pass-through call is not re-routed to another agent: alpha's timeout is the answer, a 502.
    The key sent upstream is in neither the answer nor any log line of the service."""
    response = chat(stalled_service.url, "alpha", max_tokens=2)
    error = is_openai_error(response, 502)
    assert (error["type"], error["code"]) == ("server_error", "upstream_error")
    assert "agent 'alpha': no answer within 2 s" in error["message"]
    assert KEY not in response.text and f"Bearer {KEY}".encode() in held.last_head
    deadline = time.monotonic() + 30  # Serve writes its replica logs within a second or two
    while "gateway: agent alpha" not in (logs := ray_log_text()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert "gateway: agent alpha" in logs  # the failure was logged: these are the right logs
    assert KEY not in logs and KEY not in "".join(capfd.readouterr())


@pytest.mark.slow
def test_when_every_agent_fails_the_answer_is_a_502_naming_each(stalled_service, upstreams):
    """Last of the stalled service's tests: beta's upstream stops too."""
    upstreams[1].stop()
    beta = routed_picks(stalled_service.url, CONVERSATION_TEXTS).index("beta")
    with client() as http:
        response = http.post(
            f"{stalled_service.url}/v1/chat/completions",
            json={"model": "benchgen-router", "messages": conversation(beta)},
        )
    error = is_openai_error(response, 502)
    assert "agent 'beta': connection failed" in error["message"] and "agent 'alpha': no answer" in error["message"]
    assert KEY not in response.text
    assert http_ok(stalled_service.url + "/healthz")


def http_ok(url: str) -> bool:
    with client() as http:
        return http.get(url).status_code == 200


@pytest.mark.slow
def test_a_bad_pool_is_refused_at_start_one_line_per_problem(router_dir, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps(
            [
                {"agent_id": "alpha", "base_url": "ftp://example.com/v1"},
                {"agent_id": "beta", "base_url": "http://127.0.0.1:9/v1", "api_key_env": "BENCHGEN_UNSET_TEST_KEY"},
                {"agent_id": "gamma", "base_url": "http://127.0.0.1:9/v1"},
            ]
        )
    )
    started = time.monotonic()
    result = run_tool("serve", "--model", router_dir, "--pool", bad, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 3 and lines[0].startswith("error: pool file"), lines
    assert "agent 'alpha': base_url 'ftp://example.com/v1' is not an http(s) URL" in lines[0]
    assert "BENCHGEN_UNSET_TEST_KEY (its api_key_env) is not set" in lines[1]
    assert "agent 'gamma' is not one of the router's ['alpha', 'beta']" in lines[2]
    assert time.monotonic() - started < 60  # refused before Ray starts
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"base_url": "http://127.0.0.1:9/v1", "agents": [{"agent_id": a} for a in AGENTS]}))
    result = run_tool("serve", "--model", router_dir, "--pool", good, "--gateway-fallback", "nobody", timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: --gateway-fallback nobody is not an agent of the pool; pass one of alpha, beta."
    ]


# ---------------------------------------------------------------------------------------------
# A probability head: the trade-off chosen per request (docs/tradeoff.md)

PROBABILITY_AGENTS = ["frontier_a", "frontier_b", "frontier_c", "open_mid", "open_cheap_reasoning"]


@pytest.fixture(scope="module")
def probability_service(service, upstreams, backbone_dir, tmp_path_factory):
    """The module's application replaced, on the same Ray and port, by a probability-head router over five
    agents, all answered by the first upstream (the x-benchgen-agent header tells them apart)."""
    from benchgen_router.serving import serve

    folder = tmp_path_factory.mktemp("probability")
    router, prompts = train_probability_router(folder, backbone_dir)
    pool = folder / "agents.json"
    server = upstreams[0]
    agents = [{"agent_id": agent, "base_url": server.base_url, "model": server.model} for agent in PROBABILITY_AGENTS]
    pool.write_text(json.dumps({"api_key_env": KEY_ENV, "agents": agents}))
    running = serve(str(router), port=int(service.url.rsplit(":", 1)[1]), pool_file=pool, blocking=False)
    try:
        yield running, router, prompts
    finally:
        running.close()


@pytest.mark.slow
def test_a_tradeoff_in_the_model_name_or_body_routes_as_pick_agent_does(probability_service):
    from benchgen_router.routing import pick_agent

    running, router, prompts = probability_service
    queries = prompts[40:46]
    decided = {}
    for rule in ("budget=0.3@frontier_a", "usd-per-1k=1.0", "tolerance=0.05"):
        expected = [result["picked_agent"] for result in pick_agent(queries, model=str(router), tradeoff=rule)]
        decided[rule] = expected
        assert routed_picks(running.url, queries, tradeoff=rule) == expected, rule
        for query, pick in zip(queries, expected, strict=True):
            for response in (
                chat(running.url, f"benchgen-router:{rule}", query, max_tokens=2),
                chat(running.url, "benchgen-router", query, max_tokens=2, tradeoff=rule),
            ):
                assert response.status_code == 200, response.text
                assert response.headers["x-benchgen-agent"] == pick
                assert response.headers["x-benchgen-tradeoff"] == rule
    assert len({tuple(picks) for picks in decided.values()}) > 1, decided  # the rules decide differently here


@pytest.mark.slow
def test_a_bad_tradeoff_is_a_400_with_one_line_on_both_routes(probability_service):
    running, _, prompts = probability_service
    with client() as http:
        refused = http.post(f"{running.url}/v1/route", json={"queries": prompts[:2], "tradeoff": "budget=30%"})
    assert refused.status_code == 400 and set(refused.json()) == {"error"}, refused.text
    assert "tolerance=T" in refused.json()["error"] and "\n" not in refused.json()["error"]
    error = is_openai_error(chat(running.url, "benchgen-router:budget=2", prompts[0]), 400)
    assert error["param"] == "model" and "tolerance=T" in error["message"]
    error = is_openai_error(chat(running.url, "benchgen-router:budget=0.3", prompts[0], tradeoff="lambda=1"), 400)
    assert error["param"] == "tradeoff"
    assert http_ok(running.url + "/healthz")  # and it keeps serving
