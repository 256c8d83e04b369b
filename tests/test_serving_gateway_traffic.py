"""The gateway's traffic through the service's real app on real HTTP (the harness of
test_serving_gateway_hostile: uvicorn on 127.0.0.1, a RouterService holding a real tiny router, a scripted
loopback upstream): conversations routed on their first user message; every call journaled once, feedback
beside it, bad feedback refused, the journal closed with the replica."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from test_serving_gateway_hostile import (
    AppServer,
    answered,
    assert_the_loop_was_free,
    build_router,
    checking_alone_s,
    invisible_body,
    loop_lag_beside_a_body,
    make_service,
    pool_of,
)

from benchgen_router.chat_text import ROUTING_TEXT_MAX_CHARS
from benchgen_router.errors import InputError
from benchgen_router.serving.feedback import FEEDBACK_MAX_COMMENT_CHARS
from benchgen_router.serving.gateway import GatewaySettings
from benchgen_router.serving.journal import FEEDBACK_PER_REQUEST, Retention
from benchgen_router.serving.journal_reading import read_journal
from helpers import make_queries
from upstream_server import MisbehavingUpstream, Scripted

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


# ---------------------------------------------------------------------------------------------
# The traffic journal and feedback

USAGE = {"prompt_tokens": 10, "completion_tokens": 2}


def by_kind(body: dict) -> Scripted:
    """JSON for a plain request; for a stream, SSE events with the usage in the last one."""
    if body.get("stream") is not True:
        return answered(USAGE)
    events = [{"choices": [{"index": 0, "delta": {"content": word}}]} for word in ("4", ".")]
    events.append({"choices": [], "usage": USAGE})
    data = "".join(f"data: {json.dumps(event)}\n\n" for event in events) + "data: [DONE]\n\n"
    return Scripted(body=data.encode(), headers={"content-type": "text/event-stream"})


@pytest.fixture(scope="module")
def journal_apps(router_dir, upstream, tmp_path_factory) -> Iterator[dict[object, tuple[AppServer, Path]]]:
    """Apps journaling to their own folders: without the text (the default), with it, and one that stays
    up for the feedback tests (the first two are stopped by their tests)."""
    apps = {}
    try:
        for keep_text in (False, True, "feedback"):
            folder = tmp_path_factory.mktemp(f"journal-{keep_text}")
            settings = GatewaySettings(pool_of(upstream.base_url), journal=str(folder), journal_text=keep_text is True)
            apps[keep_text] = (AppServer(make_service(router_dir, settings)).__enter__(), folder)
        yield apps
    finally:
        for app, _ in apps.values():
            app.__exit__()


def post(app: AppServer, path: str, body: object) -> httpx.Response:
    with httpx.Client(timeout=30, trust_env=False) as http:
        if isinstance(body, bytes):
            return http.post(f"{app.url}{path}", content=body, headers={"content-type": "application/json"})
        return http.post(f"{app.url}{path}", json=body)


def openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and "\n" not in error["message"], error
    return error


def test_every_call_is_journaled_once_and_feedback_lands_beside_it(journal_apps, upstream):
    """Routed and passed through, streamed and not: one line each, with the decision, the status, the usage
    and the times; the text as a salted hash only. Feedback by the answer's request id joins its call."""
    upstream.script = by_kind
    app, folder = journal_apps[False]
    sent = []
    for model in ("benchgen-router", "beta"):
        for stream in (False, True):
            body = {"model": model, "messages": [{"role": "user", "content": QUERIES[0]}], "stream": stream}
            response = post(app, "/v1/chat/completions", body)
            assert response.status_code == 200, response.text
            request_id = response.headers["x-benchgen-request-id"]
            assert request_id.startswith("bgr-")
            sent.append((model, stream, request_id, response.headers["x-benchgen-agent"]))
    routed_agent = picks(app, [QUERIES[0]])[0]
    assert post(app, "/v1/feedback", {"request_id": sent[0][2], "score": 1}).json() == {
        "object": "feedback",
        "request_id": sent[0][2],
        "score": 1.0,
    }
    second = {"request_id": sent[3][2], "score": 0.25, "comment": "too short"}
    assert post(app, "/v1/feedback", second).status_code == 200
    app.stop_replica()  # the journal is closed with the replica: every line is on disk
    calls = {call["request_id"]: call for call in read_journal(folder).calls}
    assert list(calls) == [request_id for _, _, request_id, _ in sent]
    for model, stream, request_id, agent in sent:
        call = calls[request_id]
        routed = model == "benchgen-router"
        assert (call["kind"], call["model"], call["stream"], call["status"], call["agent"]) == (
            "call",
            model,
            stream,
            200,
            agent,
        )
        assert (call["prompt_tokens"], call["completion_tokens"]) == (10, 2)
        assert call["cost_usd"] == pytest.approx((10 * 1.0 + 2 * 2.0) / 1e6)
        assert call["operating_point"] == ("quality" if routed else None)
        assert call["head_pick"] == (routed_agent if routed else None) and call["retried_from"] is None
        assert call["out_of_distribution"] is None and call["guard_score"] is None  # a router without a guard
        assert 0 <= call["first_byte_s"] <= call["total_s"] < 30
        assert "text" not in call and len(call["text_sha256"]) == 64
    assert len({call["text_sha256"] for call in calls.values()}) == 1  # one prompt, one hash
    assert QUERIES[0] not in (folder.glob("calls-*.jsonl").__next__()).read_text()
    assert [(f["score"], "comment" in f) for f in calls[sent[0][2]]["feedback"]] == [(1.0, False)]
    assert [f["score"] for f in calls[sent[3][2]]["feedback"]] == [0.25]  # the comment is user text: not kept


def test_with_journal_text_the_text_and_comment_are_kept(journal_apps, upstream):
    upstream.script = by_kind
    app, folder = journal_apps[True]
    response = post(app, "/v1/chat/completions", {"model": "alpha", "messages": [{"role": "user", "content": "hi"}]})
    request_id = response.headers["x-benchgen-request-id"]
    assert post(app, "/v1/feedback", {"request_id": request_id, "score": 0, "comment": "wrong"}).status_code == 200
    app.stop_replica()
    (call,) = read_journal(folder).calls
    assert call["text"] == "hi" and call["feedback"][0]["comment"] == "wrong"


def test_a_line_the_journal_cannot_write_is_counted_in_the_metrics(journal_apps, upstream):
    """After the journal is closed (the replica stopping), a call is still answered, and its line is
    dropped and counted: the journal's write_failures, then the Prometheus counter."""
    upstream.script = by_kind
    app, _ = journal_apps[True]  # stopped by the test before
    gateway = app.service.gateway
    increments: list[float] = []
    counter, gateway.metrics.journal_failures = (
        gateway.metrics.journal_failures,
        SimpleNamespace(inc=lambda value=1: increments.append(value)),
    )
    try:
        before = gateway.journal.write_failures
        response = post(
            app, "/v1/chat/completions", {"model": "alpha", "messages": [{"role": "user", "content": "hi"}]}
        )
        assert response.status_code == 200
        assert gateway.journal.write_failures == before + 1 and increments == [1]
    finally:
        gateway.metrics.journal_failures = counter
    with httpx.Client(timeout=30, trust_env=False) as http:
        health = http.get(f"{app.url}/healthz")
    assert health.status_code == 200  # the journal costs no answer, so it never takes the replica out
    journal = health.json()["journal"]
    assert journal["writing"] is False and "cannot write (the journal is closed)" in journal["error"]
    assert journal["lines_lost"] == gateway.journal.write_failures


def test_healthz_shows_a_journal_that_writes(journal_apps):
    app, _ = journal_apps["feedback"]
    with httpx.Client(timeout=30, trust_env=False) as http:
        health = http.get(f"{app.url}/healthz").json()
    assert health["status"] == "ok" and health["journal"]["writing"] is True and "error" not in health["journal"]


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"request_id": "bgr-000000000000000000000000-forged", "score": 1}, 404, "request_id"),
        ({"request_id": "chatcmpl-123", "score": 1}, 404, "request_id"),
        ({"score": 1}, 400, "request_id"),
        ({"request_id": "ID", "score": 1.5}, 400, "score"),
        ({"request_id": "ID", "score": -0.1}, 400, "score"),
        ({"request_id": "ID", "score": "1"}, 400, "score"),
        ({"request_id": "ID", "score": True}, 400, "score"),
        ({"request_id": "ID"}, 400, "score"),
        ({"request_id": "ID", "score": 1, "comment": 3}, 400, "comment"),
        ({"request_id": "ID", "score": 1, "comment": "x" * (FEEDBACK_MAX_COMMENT_CHARS + 1)}, 400, "comment"),
        (b'{"request_id": "ID", "score": 1, "comment": "lone \\ud800"}', 400, "comment"),
        ({"request_id": "ID", "score": 1, "scroe": 1}, 400, "scroe"),
        (b'{"request_id": "ID", "score": NaN}', 400, None),
        (b"thumbs up", 400, None),
        (b"[1]", 400, None),
    ],
)
def test_bad_feedback_is_a_4xx_with_one_line(journal_apps, upstream, body, status, param):
    upstream.script = by_kind
    app, _ = journal_apps["feedback"]
    answer = post(app, "/v1/chat/completions", {"model": "alpha", "messages": [{"role": "user", "content": "hi"}]})
    request_id = answer.headers["x-benchgen-request-id"]
    if isinstance(body, dict):
        body = {key: request_id if value == "ID" else value for key, value in body.items()}
    else:
        body = body.replace(b"ID", request_id.encode())
    error = openai_error(post(app, "/v1/feedback", body), status)
    assert error["param"] == param
    if status == 404:
        assert error["code"] == "request_not_found"


def test_feedback_past_its_cap_per_request_is_a_409_and_minus_zero_is_zero(journal_apps, upstream):
    upstream.script = by_kind
    app, _ = journal_apps["feedback"]
    answer = post(app, "/v1/chat/completions", {"model": "alpha", "messages": [{"role": "user", "content": "hi"}]})
    request_id = answer.headers["x-benchgen-request-id"]
    taken = post(app, "/v1/feedback", {"request_id": request_id, "score": -0.0})
    assert taken.status_code == 200 and '"score":0.0' in taken.text.replace(" ", "")
    for _ in range(FEEDBACK_PER_REQUEST - 1):
        assert post(app, "/v1/feedback", {"request_id": request_id, "score": 1}).status_code == 200
    error = openai_error(post(app, "/v1/feedback", {"request_id": request_id, "score": 1}), 409)
    assert (error["code"], error["param"]) == ("feedback_limit_reached", "request_id")


def test_a_prompt_longer_than_the_gateway_routes_on_is_marked_cut_in_its_line(journal_apps, upstream):
    """The gateway routes on the first 65,536 characters, and says in the journal line whether it cut the text
    it journals: a prompt of exactly that length is whole (it was marked cut, inferred from its length), one
    character more is cut, routed or passed through."""
    upstream.script = by_kind
    app, folder = journal_apps["feedback"]
    limit = ROUTING_TEXT_MAX_CHARS
    sent = {  # what the line is named in a failure: (model, the prompt, whether it is marked cut)
        "routed, 100,000 characters": ("benchgen-router", "word " * 20_000, True),
        "routed, the limit": ("benchgen-router", "w" * limit, False),
        "routed, the limit + 1": ("benchgen-router", "w" * (limit + 1), True),
        "passed through, the limit": ("alpha", "p" * limit, False),
        "passed through, the limit + 1": ("alpha", "p" * (limit + 1), True),
        "routed, short": ("benchgen-router", "a short prompt", False),
    }
    ids = {}
    for name, (model, content, _) in sent.items():
        body = {"model": model, "messages": [{"role": "user", "content": content}]}
        ids[name] = post(app, "/v1/chat/completions", body).headers["x-benchgen-request-id"]
    deadline, calls = time.monotonic() + 30, {}
    while not all(request_id in calls for request_id in ids.values()) and time.monotonic() < deadline:
        time.sleep(0.1)  # written by the journal's thread
        with contextlib.suppress(InputError):  # no file yet
            calls = {call["request_id"]: call for call in read_journal(folder).calls}
    marks = {name: calls[request_id]["text_truncated"] for name, request_id in ids.items()}
    assert marks == {name: cut for name, (_, _, cut) in sent.items()}


def test_the_loop_stays_free_while_a_passed_through_body_is_checked_for_its_journal_line(journal_apps, upstream):
    """A journaled pass-through's line holds the text the router would have scored, looked for as a routed
    request's is: in a worker thread for a large body, not on the event loop that /v1/route requests wait on."""
    upstream.script = by_kind
    app, _ = journal_apps["feedback"]
    body = invisible_body("alpha")
    alone_s = checking_alone_s(body)
    answer, beside_s = loop_lag_beside_a_body(app, invisible_body("alpha", lettered=True))
    assert answer.status_code == 200, answer.text
    answer, lag_s = loop_lag_beside_a_body(app, body)
    assert answer.status_code == 200, answer.text  # passed through: nothing to route on is no refusal
    late = f"{1000 * lag_s:.0f} ms, {1000 * beside_s:.0f} ms unchecked"
    print(f"checked alone in {alone_s:.2f} s; the loop late by {late}")
    assert_the_loop_was_free(alone_s, lag_s, beside_s)


def test_a_service_keeps_its_journal_within_the_budget_it_was_given(router_dir, upstream, tmp_path):
    """GatewaySettings(journal_retention=...), as serve(journal_max_bytes=...) hands it to each replica: 40 calls
    (about 22 kB of lines) to a journal given 8 KiB keep the calls' 6 KiB share, the newest calls, and /healthz
    counts the files removed; with the default 1 GiB nothing would be removed."""
    upstream.script = by_kind
    retention = Retention(max_bytes=8192)
    settings = GatewaySettings(pool_of(upstream.base_url), journal=str(tmp_path), journal_retention=retention)
    with AppServer(make_service(router_dir, settings)) as app:
        ids = []
        for query in QUERIES:
            body = {"model": "alpha", "messages": [{"role": "user", "content": query}]}
            ids.append(post(app, "/v1/chat/completions", body).headers["x-benchgen-request-id"])
        deadline, kept = time.monotonic() + 30, []
        while ids[-1] not in kept and time.monotonic() < deadline:
            time.sleep(0.1)  # written by the journal's thread
            kept = [call["request_id"] for call in read_journal(tmp_path).calls]
        with httpx.Client(timeout=30, trust_env=False) as http:
            health = http.get(f"{app.url}/healthz").json()["journal"]
        app.stop_replica()  # the journal closed: every line written
    calls_bytes = sum(path.stat().st_size for path in tmp_path.glob("calls-*.jsonl"))
    assert calls_bytes <= retention.budget("calls") == 6144
    kept = [call["request_id"] for call in read_journal(tmp_path).calls]
    assert 0 < len(kept) < len(ids) and kept == ids[-len(kept) :]  # the newest calls, every one of them
    assert health["files_removed"] >= len(ids) - len(kept) - 1 > 0  # the writer's own file is never removed


def test_feedback_without_a_journal_is_a_404_saying_how_to_get_one(services):
    error = openai_error(post(services["last-user"], "/v1/feedback", {"request_id": "x", "score": 1}), 404)
    assert error["code"] == "journal_not_configured" and "--journal DIR" in error["message"]
