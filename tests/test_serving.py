"""The HTTP routing service on a real Ray Serve (127.0.0.1, a free port, the default router) and
bulk routing with Ray Data: answers equal pick_agent's, every kind of bad request gets a 4xx with
one line and leaves the service answering, concurrency, a replica killed under load, metrics,
clean shutdown (no Ray process left behind), and Ray Data's records equal the local engine's.
Operating points: a tiny router with three heads answers each request at the point it asks for
(the literal reference's picks over that point's weights), also when requests at different points
share a batch, and so does bulk routing.

One Ray and one service serve the whole module (starting Ray takes seconds); the operating-point
router is deployed in place of the default one, on the same Ray and port, after the tests of the
default router; the last tests stop them and check that nothing is left."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import psutil
import pytest

from helpers import AGENTS, PILOT, PROJECT_ROOT, check_result, cli, make_queries, run_tool, train_probability_router
from http_client import raw_exchange, request
from reference_impl import ReferenceRouter

# Before Ray starts: its workers read this once. Metrics reach the Prometheus endpoint within a
# second instead of ten.
os.environ.setdefault("RAY_metrics_report_interval_ms", "1000")

ray = pytest.importorskip("ray")
pytest.importorskip("ray.serve")
pytestmark = pytest.mark.slow  # a real Ray and service: a minute before the first answer

from benchgen_router.errors import InputError  # noqa: E402
from benchgen_router.loading import load_router  # noqa: E402
from benchgen_router.model_code import default_router_dir  # noqa: E402
from benchgen_router.routing import pick_agent  # noqa: E402
from benchgen_router.serving import (  # noqa: E402
    APP_NAME,
    free_port,
    pool_for_router,
    read_pool_file,
    route_file_with_ray,
    route_items,
    serve,
)

MAX_QUERIES = 8
MAX_BYTES = 4096
QUERIES = make_queries(40, seed=7)
POOL = [
    {
        "agent_id": agent,
        "slug": f"vendor/model-{i}",
        "price_per_1m_prompt_usd": 0.1 * (i + 1),
        "price_per_1m_output_usd": i,
    }
    for i, agent in enumerate(reversed(AGENTS))  # listed out of pool order: the service reorders
]


def route(service, queries, timeout: float = 60, **fields) -> tuple[int, dict]:
    """POST /v1/route with these queries and any other body fields (operating_point=...)."""
    body = json.dumps({"queries": queries, **fields}).encode()
    return request(service.url + "/v1/route", body, timeout=timeout)


def same_result(got: dict, expected: dict) -> bool:
    """The service's result is pick_agent's: same keys, pick and agent order; scores equal to
    float32 rounding (a query's sums depend on which queries share its batch)."""
    return (
        list(got) == list(expected)
        and got["picked_agent"] == expected["picked_agent"]
        and got["agent_index"] == expected["agent_index"]
        and list(got["logits"]) == list(expected["logits"])
        and np.allclose(list(got["logits"].values()), list(expected["logits"].values()), atol=1e-4)
        and np.allclose(list(got["probabilities"].values()), list(expected["probabilities"].values()), atol=1e-5)
        and got.get("out_of_distribution") == expected.get("out_of_distribution")
        and got.get("head_pick") == expected.get("head_pick")
        and np.isclose(got.get("ood_score", 0.0), expected.get("ood_score", 0.0), rtol=1e-4)
    )


@pytest.fixture(scope="module")
def expected_soon():
    """pick_agent's answer for each query, one query at a time, worked out in a thread while the
    services start (loading the router here takes seconds too)."""
    with ThreadPoolExecutor(1) as worker:
        yield worker.submit(lambda: {query: pick_agent(query) for query in QUERIES})


@pytest.fixture(scope="module")
def expected(expected_soon) -> dict[str, dict]:
    return expected_soon.result()


@pytest.fixture(scope="module")
def pool_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pool") / "agents.json"
    path.write_text(json.dumps(POOL))
    return path


@pytest.fixture(scope="module")
def service(pool_file, expected_soon):
    """The default router with 2 replicas (so one can be killed), small limits, on a local Ray
    with a few spare CPUs for the Ray Data test's actor."""
    running = serve(
        None,
        port=free_port(),
        replicas=2,
        max_batch_size=16,
        batch_wait_ms=2,
        pool_file=pool_file,
        max_queries=MAX_QUERIES,
        max_request_bytes=MAX_BYTES,
        blocking=False,
        ray_cpus=4,
    )
    try:
        yield running
    finally:
        running.close()


def ray_processes() -> list[psutil.Process]:
    """The Ray processes this process started (raylet, GCS, workers, ...)."""
    names = ("raylet", "gcs_server", "ray::", "default_worker", "dashboard", "log_monitor", "runtime_env")
    found = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if any(name in " ".join(child.cmdline()) for name in names):
                found.append(child)
    return found


def router_replicas() -> list[str]:
    """The names of the service's replicas' actors."""
    return [
        actor["name"]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["name"].startswith("SERVE_REPLICA::") and "#Router#" in actor["name"]
    ]


# ---------------------------------------------------------------------------------------------
# Routing


def test_route_answers_equal_pick_agent(service, expected):
    status, body = route(service, QUERIES[:5])
    assert status == 200
    assert [r["picked_agent"] for r in body["results"]] == [expected[q]["picked_agent"] for q in QUERIES[:5]]
    assert all(same_result(got, expected[q]) for got, q in zip(body["results"], QUERIES[:5], strict=True))
    assert body["router"]["name"] == "default"
    assert body["router"]["revision"].startswith("sha256:")
    status, body = route(service, QUERIES[:5], operating_point=None)  # null: the service's default
    assert status == 200 and all(
        same_result(got, expected[q]) for got, q in zip(body["results"], QUERIES[:5], strict=True)
    )


def test_healthz_pool_and_openapi(service):
    status, health = request(service.url + "/healthz")
    assert status == 200 and health["status"] == "ok"
    with urllib.request.urlopen(urllib.request.Request(service.url + "/healthz", method="HEAD"), timeout=30) as head:
        assert head.status == 200 and head.read() == b""  # load balancers probe with HEAD
    status, pool = request(service.url + "/v1/pool")
    assert status == 200
    assert [agent["id"] for agent in pool["agents"]] == AGENTS  # pool (logit) order, not the file's
    declared = json.loads((default_router_dir() / "config.json").read_text())
    listed = {point["name"]: point for point in pool["operating_points"]}
    assert set(listed) == set(declared["operating_points"])
    assert [name for name, point in listed.items() if point["default"]] == [declared["operating_point"]]
    for name, point in listed.items():
        assert point["cost_weight"] == declared["operating_points"][name]["cost_weight"]
    by_id = {entry["agent_id"]: entry for entry in POOL}
    for agent in pool["agents"]:
        assert agent["slug"] == by_id[agent["id"]]["slug"]
        assert agent["price_per_1m_prompt_usd"] == by_id[agent["id"]]["price_per_1m_prompt_usd"]
        assert agent["price_per_1m_output_usd"] == by_id[agent["id"]]["price_per_1m_output_usd"]
    status, schema = request(service.url + "/openapi.json")
    assert status == 200
    assert {"/v1/route", "/v1/pool", "/healthz"} <= set(schema["paths"])
    body_schema = schema["paths"]["/v1/route"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body_schema["properties"]["queries"]["type"] == "array"
    assert "operating_point" in body_schema["properties"] and "operating_point" not in body_schema["required"]
    assert {"200", "400", "413", "422"} <= set(schema["paths"]["/v1/route"]["post"]["responses"])


def test_pool_without_a_pool_file_and_pool_file_checks(tmp_path):
    assert pool_for_router(AGENTS, None) == ([{"id": agent} for agent in AGENTS], None)
    agents, problem = pool_for_router(AGENTS, [{"id": "frontier_a", "slug": "x"}])
    assert agents == [] and "pass the pool file made for this router" in problem and "\n" not in problem
    bad = tmp_path / "bad.json"
    for content, words in (
        ("{", "is not valid JSON"),
        ("{}", "must be a JSON list of agent objects"),
        ("[]", "must be a JSON list of agent objects"),
        ('[{"slug": "x"}]', "entry 1 has no agent_id"),
        ('[{"agent_id": "a", "price_per_1m_prompt_usd": "cheap"}]', "prices must be numbers from 0 to"),
        ('[{"agent_id": "a", "price_per_1m_output_usd": -1}]', "prices must be numbers from 0 to"),
        ('[{"agent_id": "a", "slug": 3}]', "a slug must be"),
        ('[{"agent_id": "a"}, {"agent_id": "a"}]', "twice"),
    ):
        bad.write_text(content)
        with pytest.raises(InputError, match=words):
            read_pool_file(bad)
    with pytest.raises(InputError, match="not found"):
        read_pool_file(tmp_path / "missing.json")
    with pytest.raises(InputError, match="cannot read pool file"):
        read_pool_file(tmp_path)  # a folder
    bad.write_text('[{"agent_id": "a", "slug": "x"}]')  # prices are optional for the service
    assert read_pool_file(bad) == [
        {"id": "a", "slug": "x", "price_per_1m_prompt_usd": None, "price_per_1m_output_usd": None}
    ]


@pytest.mark.skipif(not (PILOT / "agents.json").exists(), reason="the pilot data (../shared) is not here")
def test_the_pilot_pool_file_fits_the_default_router():
    agents, problem = pool_for_router(AGENTS, read_pool_file(PILOT / "agents.json"))
    assert problem is None and [agent["id"] for agent in agents] == AGENTS
    assert all(isinstance(agent["slug"], str) and agent["price_per_1m_prompt_usd"] > 0 for agent in agents)


BAD_REQUESTS = [
    (b"{not json", 400, "not valid JSON"),
    (b"\xff\xfe{}", 400, "not valid JSON"),
    (b"[" * 2000 + b"]" * 2000, 400, "nested too deeply"),
    (b'["a query"]', 400, "not an object"),
    (b'"a query"', 400, "not an object"),
    (b"{}", 422, 'no "queries"'),
    (b'{"query": ["a"]}', 422, 'no "queries"'),
    (b'{"queries": "a query"}', 422, "a string, not a list"),
    (b'{"queries": {"a": 1}}', 422, "not a list"),
    (b'{"queries": []}', 422, "empty"),
    (b'{"queries": ["fine", 3]}', 422, "query 1 is not text"),
    (b'{"queries": [null]}', 422, "query 0 is not text"),
    (b'{"queries": [""]}', 422, "query 0 is empty"),
    (b'{"queries": ["  \\n\\t "]}', 422, "query 0 is empty"),
    (b'{"queries": ["\\ud800"]}', 422, "not valid UTF-8"),
    (b'{"queries": ["fine", "\\u200b"]}', 422, "query 1 tokenizes to nothing"),
    (b'{"queries": ["\\ufeff"]}', 422, "query 0 tokenizes to nothing"),
    (b'{"queries": ["\\u0001"]}', 422, "query 0 tokenizes to nothing"),
    (json.dumps({"queries": ["q"] * (MAX_QUERIES + 1)}).encode(), 413, f"limit of {MAX_QUERIES}"),
    (json.dumps({"queries": ["x" * MAX_BYTES]}).encode(), 413, f"limit of {MAX_BYTES}"),
    (b'{"queries": ["a"], "operating_point": "cheap"}', 422, "'cheap' is not one of this router's"),
    (b'{"queries": ["a"], "operating_point": 3}', 422, '"operating_point" is int, not a name'),
]


@pytest.mark.parametrize(("body", "status", "words"), BAD_REQUESTS, ids=[words for _, _, words in BAD_REQUESTS])
def test_bad_requests_get_a_4xx_with_one_line(service, expected, body, status, words):
    got_status, answer = request(service.url + "/v1/route", body)
    assert got_status == status
    assert list(answer) == ["error"] and words in answer["error"]
    assert "\n" not in answer["error"] and "Traceback" not in answer["error"]
    status, answer = route(service, QUERIES[:1])
    assert status == 200 and same_result(answer["results"][0], expected[QUERIES[0]])  # still answering


def test_a_chunked_body_over_the_limit_is_refused_as_it_arrives(service):
    head = b"POST /v1/route HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    piece = b'{"queries": ["' + b"x" * 1000
    chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    answer = raw_exchange(service.url, head, [chunk] * 64)  # 64 kB sent against a 4 kB limit
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert f"limit of {MAX_BYTES} bytes".encode() in answer
    assert request(service.url + "/healthz")[0] == 200


def test_a_stalled_upload_gets_a_408_and_the_service_keeps_answering(service):
    head = b"POST /v1/route HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
    started = time.monotonic()
    with ThreadPoolExecutor(1) as pool:
        stalled = pool.submit(raw_exchange, service.url, head, [], 0.0, 60)
        time.sleep(1)
        assert request(service.url + "/healthz", timeout=10)[0] == 200  # while the upload stalls
        answer = stalled.result(timeout=60)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"not received within" in answer and time.monotonic() - started < 40


def test_unknown_paths_and_methods_answer_in_the_same_format(service):
    status, answer = request(service.url + "/v2/route")
    assert status == 404 and list(answer) == ["error"] and "/docs" in answer["error"]
    status, answer = request(service.url + "/v1/route")  # GET
    assert status == 405 and list(answer) == ["error"]


def test_bad_requests_never_fail_their_batch_mates(service, expected):
    """Bad and good requests at once: the good ones (batched with each other) are all answered."""
    bad = [b'{"queries": ["\\u200b"]}', b'{"queries": [""]}', b"{oops"]

    def one(index: int) -> tuple[int, dict, str | None]:
        if index % 3 == 0:
            return (*request(service.url + "/v1/route", bad[index % len(bad)]), None)
        query = QUERIES[index % len(QUERIES)]
        return (*route(service, [query]), query)

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(one, range(48)))
    for status, body, query in answers:
        if query is None:
            assert 400 <= status < 500 and "error" in body
        else:
            assert status == 200 and same_result(body["results"][0], expected[query])


# ---------------------------------------------------------------------------------------------
# Concurrency


def test_concurrent_requests_equal_sequential_pick_agent(service, expected):
    """200 requests of 1-3 queries from 16 threads: each answer is pick_agent's, in request order."""
    rng = np.random.default_rng(3)
    batches = [list(rng.choice(QUERIES, size=int(rng.integers(1, 4)))) for _ in range(200)]
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda queries: route(service, queries), batches))
    assert all(status == 200 for status, _ in answers)
    for queries, (_, body) in zip(batches, answers, strict=True):
        assert len(body["results"]) == len(queries)
        assert all(same_result(got, expected[q]) for got, q in zip(body["results"], queries, strict=True))


def test_metrics_count_routed_queries_per_agent(service):
    picks = Counter(r["picked_agent"] for r in route(service, QUERIES[:MAX_QUERIES])[1]["results"])
    deadline = time.monotonic() + 30
    counts: dict[str, float] = {}
    while time.monotonic() < deadline:
        with urllib.request.urlopen(service.metrics_url, timeout=10) as response:
            text = response.read().decode()
        counts = Counter()
        for line in text.splitlines():
            if line.startswith("ray_benchgen_router_routed_queries_total{"):
                agent = line.split('agent="', 1)[1].split('"', 1)[0]
                counts[agent] += float(line.rsplit(" ", 1)[1])
        if counts and all(counts[agent] >= n for agent, n in picks.items()):
            break
        time.sleep(0.5)
    assert set(counts) <= set(AGENTS)
    assert all(counts[agent] >= n for agent, n in picks.items()), (counts, picks)
    assert "ray_serve_num_http_requests_total" in text  # Ray Serve's own metrics, same endpoint
    assert "ray_benchgen_router_rejected_requests_total" in text


def test_a_killed_replica_is_replaced_while_the_other_answers(service, expected):
    """Kill one of the two replicas under load: requests keep being answered, Ray Serve starts a
    new replica, and afterwards every request succeeds again."""
    replicas = router_replicas()
    assert len(replicas) == 2
    victim = ray.get_actor(replicas[0], namespace="serve")
    outcomes: list[tuple[float, int]] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + 20  # bounded in time and count
    killed_at: list[float] = []
    failure_bodies: list[str] = []

    def load(worker: int) -> None:
        for index in range(400):
            if time.monotonic() > stop_at:
                return
            query = QUERIES[(worker * 7 + index) % len(QUERIES)]
            try:
                status, body = route(service, [query], timeout=30)
                ok = status == 200 and same_result(body["results"][0], expected[query])
            except OSError as err:  # a dropped connection
                status, ok, body = 0, False, {"connection": str(err)}
            if not ok:
                failure_bodies.append(json.dumps(body)[:200])
            with lock:
                outcomes.append((time.monotonic(), 200 if ok else status))
            if (
                killed_at
                and time.monotonic() > killed_at[0] + 3
                and sum(1 for t, s in outcomes if t > killed_at[0] + 3 and s == 200) >= 20
            ):
                return

    threads = [threading.Thread(target=load, args=(w,)) for w in range(6)]
    for thread in threads:
        thread.start()
    time.sleep(1.5)
    ray.kill(victim, no_restart=True)
    killed_at.append(time.monotonic())
    for thread in threads:
        thread.join()
    sent = len(outcomes)
    answered = sum(1 for _, status in outcomes if status == 200)
    after = [status for t, status in outcomes if t > killed_at[0]]
    failures = Counter(status for _, status in outcomes if status != 200)
    print(f"replica kill: sent {sent}, answered {answered}, failed {sent - answered} (by status: {dict(failures)})")
    print(f"replica kill: failure bodies: {failure_bodies[:6]}")
    assert sum(1 for status in after if status == 200) >= 20  # the other replica kept answering
    assert sent - answered <= 12  # only requests in flight on the killed replica can fail
    # Those held by the killed process itself (it read them) lose their connection, or get a 5xx from
    # whichever hop saw the replica die (HAProxy's 502/503, or 500 when Ray reports the dead actor);
    # none may fail before the kill or once the replacement window has passed.
    assert set(failures) <= {0, 500, 502, 503}
    assert all(killed_at[0] - 0.5 <= t <= killed_at[0] + 15 for t, status in outcomes if status != 200)

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        alive = router_replicas()
        if len(alive) == 2 and replicas[0] not in alive:
            break
        time.sleep(0.5)
    assert len(alive) == 2 and replicas[0] not in alive  # replaced, not restarted in place
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda q: route(service, [q])[0], QUERIES[:16]))
    assert statuses == [200] * 16


def test_a_flagged_query_gets_the_fallback_from_the_service_too(service):
    """The committed router carries an out-of-distribution guard: a Turkish question is flagged and
    answered by the fallback agent, exactly as pick_agent answers it."""
    query = "Türkiye'nin başkenti neresidir ve nüfusu ne kadardır?"
    expected = pick_agent(query)
    assert expected["out_of_distribution"] and expected["picked_agent"] == "frontier_b"
    status, body = route(service, [query])
    assert status == 200
    (result,) = body["results"]
    assert result["out_of_distribution"] and result["picked_agent"] == expected["picked_agent"]
    assert result["head_pick"] == expected["head_pick"] and abs(result["ood_score"] - expected["ood_score"]) < 1e-3


def test_the_service_and_the_hub_pipeline_give_one_decision(service):
    """Flagged and kept queries, formatted and plain, at the default point and at one whose fallback
    differs: the service, pick_agent and pipeline() with nothing but transformers agree."""
    from transformers import pipeline

    from benchgen_router.loading import packaged_backbone

    queries = [
        "What is the derivative of x^3 + 2x?",
        "Question: What does GDP measure?\n\nGive the final answer in the form `Answer: <answer>` on the last "
        "line. Answer as briefly as the question allows.",
        "What does GDP measure?",
        "Türkiye'nin başkenti neresidir ve nüfusu ne kadardır?",
        "hey, how's it going?",
    ]
    local = {"backbone_name_or_path": packaged_backbone("sentence-transformers/all-MiniLM-L6-v2")}  # offline
    router = pipeline("text-classification", model=str(PROJECT_ROOT), trust_remote_code=True, model_kwargs=local)
    for point in ("balanced", "economy"):
        expected = pick_agent(queries, operating_point=point)
        assert {r["out_of_distribution"] for r in expected} == {True, False}
        status, body = route(service, queries, operating_point=point)
        assert status == 200
        served = [r["picked_agent"] for r in body["results"]]
        assert served == [r["picked_agent"] for r in expected]
        assert [r["label"] for r in router(queries, operating_point=point)] == served
        assert served[1] == served[2]  # a formatted prompt and its plain question


# ---------------------------------------------------------------------------------------------
# Bulk routing with Ray Data


def local_records(tmp_path: Path, source: Path) -> list[dict]:
    out = tmp_path / "local.jsonl"
    assert cli("route", "--input", source, "--output", out, "--quiet") in (0, 1)
    return [json.loads(line) for line in out.read_text().splitlines()]


SCORES = ("logits", "probabilities", "ood_score")  # equal to float32 rounding, not bit for bit


def same_records(got: list[dict], want: list[dict]) -> bool:
    return len(got) == len(want) and all(
        {k: v for k, v in a.items() if k not in SCORES} == {k: v for k, v in b.items() if k not in SCORES}
        and same_result(
            {k: a[k] for k in b if k not in ("line", "id")}, {k: b[k] for k in b if k not in ("line", "id")}
        )
        for a, b in zip(got, want, strict=True)
    )


def test_ray_data_records_equal_the_local_engine(service, tmp_path, caplog):
    pytest.importorskip("pandas", reason="Ray Data needs pandas (pip install 'ray[data]')")
    lines = [json.dumps({"id": i if i % 2 else f"task-{i}", "prompt": q}) for i, q in enumerate(QUERIES[:30])]
    lines[4] = "{broken"
    lines[9] = json.dumps({"id": 9, "prompt": "   "})
    lines[12] = ""
    source = tmp_path / "queries.jsonl"
    source.write_text("\n".join(lines) + "\n")
    want = local_records(tmp_path, source)
    # Last, so the other lines keep their numbers: a query the tokenizer reduces to nothing
    # (the local engine cannot route such a file at all) is skipped with its line.
    source.write_text("\n".join([*lines, json.dumps({"id": 99, "prompt": "\u200b"})]) + "\n")

    out = tmp_path / "ray.jsonl"
    result = route_file_with_ray(source, out, actors=1, batch_size=8)
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["line"] for r in got] == sorted(r["line"] for r in got)  # input order
    assert same_records(got, want)
    assert result.routed == len(want) == 27
    assert [line for line, _ in result.skipped] == [5, 10, 13, 31]
    assert "tokenizes to nothing" in result.skipped[-1][1]
    assert "line 5: not valid JSON" in caplog.text
    assert not list(tmp_path.glob(".ray.jsonl.*"))  # no temporary file left


def test_route_engine_ray_on_the_command_line_equals_the_local_engine(service, tmp_path):
    pytest.importorskip("pandas", reason="Ray Data needs pandas (pip install 'ray[data]')")
    source = tmp_path / "q.txt"
    source.write_text("\n".join(QUERIES[:6]) + "\n\n")  # a blank last line: skipped by both engines
    want = local_records(tmp_path, source)
    out = tmp_path / "ray.jsonl"
    assert cli("route", "--engine", "ray", "--input", source, "--output", out, "--actors", "1", "--quiet") == 1
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert same_records(got, want) and [r["line"] for r in got] == [1, 2, 3, 4, 5, 6]


def test_route_engine_ray_at_a_tradeoff_equals_the_local_engine(service, tmp_path, backbone_dir, capsys):
    """A probability head's rule reaches every Ray Data actor; a rule the router cannot take is refused
    in one line before Ray routes anything."""
    pytest.importorskip("pandas", reason="Ray Data needs pandas (pip install 'ray[data]')")
    (tmp_path / "probability").mkdir()
    router, prompts = train_probability_router(tmp_path / "probability", backbone_dir, count=60)
    source = tmp_path / "q.txt"
    source.write_text("\n".join(prompts[:12]) + "\n")
    rule = "budget=0.3@frontier_a"
    args = ["--model", router, "--input", source, "--quiet"]
    assert cli("route", *args, "--tradeoff", rule, "--output", tmp_path / "local.jsonl") == 0
    ray_args = ["--engine", "ray", "--actors", "1", *args]
    assert cli("route", *ray_args, "--tradeoff", rule, "--output", tmp_path / "ray.jsonl") == 0
    want = [json.loads(line) for line in (tmp_path / "local.jsonl").read_text().splitlines()]
    got = [json.loads(line) for line in (tmp_path / "ray.jsonl").read_text().splitlines()]
    assert same_records(got, want) and {record["tradeoff"] for record in got} == {rule}
    capsys.readouterr()
    assert cli("route", *ray_args, "--tradeoff", "budget=2", "--output", tmp_path / "bad.jsonl") == 2
    assert "budget=2" in capsys.readouterr().err and not (tmp_path / "bad.jsonl").exists()


def test_the_ray_engine_routes_past_a_batch_with_nothing_routable(service, tmp_path):
    """70 zero-width-space lines then 5 questions: the first batches hold nothing the router can
    read. Both engines skip those lines and route the 5 (exit 1: lines were skipped)."""
    pytest.importorskip("pandas", reason="Ray Data needs pandas (pip install 'ray[data]')")
    source = tmp_path / "q.txt"
    source.write_text("\u200b\n" * 70 + "\n".join(QUERIES[:5]) + "\n")
    want = local_records(tmp_path, source)
    out = tmp_path / "ray.jsonl"
    args = ["route", "--engine", "ray", "--input", source, "--output", out, "--actors", "1", "--batch-size", "16"]
    assert cli(*args, "--quiet") == 1
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert same_records(got, want) and [r["line"] for r in got] == [71, 72, 73, 74, 75]


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_an_address_where_no_ray_answers_fails_in_bounded_time(scheme):
    address = f"{scheme}127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    result = run_tool("serve", "--address", address)
    assert result.returncode == 2, result.stderr
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and f"no Ray cluster answers at {address}" in err[0], err
    assert time.monotonic() - started < 60


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--replicas", "64"],
        ["serve", "--threads", "33", "--replicas", "2"],
        ["route", "--engine", "ray", "--actors", "64", "--input", "IN", "--output", "OUT"],
    ],
)
def test_more_replicas_or_actors_than_cpus_are_refused_before_ray_starts(argv, tmp_path):
    source = tmp_path / "q.txt"
    source.write_text("What is 2 + 2?\n")
    argv = [str(source) if a == "IN" else str(tmp_path / "out.jsonl") if a == "OUT" else a for a in argv]
    started = time.monotonic()
    result = run_tool(*argv)  # its own process: no Ray of this one's in the way
    assert result.returncode == 2, result.stderr
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and "CPUs but this machine has" in err[0], err
    assert time.monotonic() - started < 60 and not (tmp_path / "out.jsonl").exists()


def test_the_ray_engine_refuses_to_write_over_its_input(service, tmp_path):
    source = tmp_path / "q.jsonl"
    source.write_text("".join(json.dumps({"query": q}) + "\n" for q in QUERIES[:7]))
    before = source.read_bytes()
    link = tmp_path / "alias.jsonl"
    link.symlink_to(source)
    for output in (source, link):
        assert cli("route", "--engine", "ray", "--input", source, "--output", output, "--quiet") == 2
    assert source.read_bytes() == before


def test_sigterm_during_ray_routing_exits_143_and_leaves_nothing_half_written(tmp_path):
    """SIGTERM while Ray Data routes a file: exit 143 with one line, no Ray stack dump, the previous
    output kept and no temporary file beside it; and before it, no deprecation or error lines from
    Ray about the way the run is set up."""
    pytest.importorskip("pandas", reason="Ray Data needs pandas (pip install 'ray[data]')")
    source, out = tmp_path / "many.txt", tmp_path / "picks.jsonl"
    source.write_text("\n".join(make_queries(3000, seed=5)) + "\n")
    out.write_text("previous run\n")
    argv = ["route", "--engine", "ray", "--input", str(source), "--output", str(out), "--batch-size", "8"]
    process = subprocess.Popen(
        [sys.executable, "-m", "benchgen_router", *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
    )
    stderr: list[bytes] = []
    reader = threading.Thread(target=lambda: stderr.extend(iter(lambda: process.stderr.read1(4096), b"")))
    reader.start()
    deadline = time.monotonic() + 180
    while b"Starting execution" not in b"".join(stderr) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(3)  # the actor pool starts: Ray logs any complaint about its settings now
    assert process.poll() is None, b"".join(stderr).decode(errors="replace")[-2000:]
    started = b"".join(stderr).decode(errors="replace")
    assert "deprecated" not in started and "core_worker" not in started, started
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=90) == 143
    reader.join(timeout=10)
    text = b"".join(stderr).decode(errors="replace")
    assert text.rstrip().endswith("terminated") and "Traceback" not in text and "SIGABRT" not in text, text[-2000:]
    assert out.read_text() == "previous run\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["many.txt", "picks.jsonl"]


def test_ray_data_reads_parquet(service, tmp_path, expected):
    pytest.importorskip("pandas", reason="Ray Data needs pandas (pip install 'ray[data]')")
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [*QUERIES[:6], None, ""]
    pq.write_table(pa.table({"task_id": [f"t{i}" for i in range(len(texts))], "query": texts}), tmp_path / "q.parquet")
    out = tmp_path / "out.jsonl"
    result = route_file_with_ray(tmp_path / "q.parquet", out, actors=1)
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["line"], r["id"]) for r in got] == [(i + 1, f"t{i}") for i in range(6)]
    assert all(
        same_result({k: r[k] for k in r if k not in ("line", "id")}, expected[q])
        for r, q in zip(got, QUERIES, strict=False)
    )
    assert result.skipped == [(7, "'query' is not text (got NoneType)"), (8, "'query' is empty")]


def test_ray_data_routes_at_an_operating_point(service, operating_router, converted, tmp_path):
    """operating_point= gives pick_agent(..., operating_point=)'s results; a name the router does
    not have is one line before any Ray work (no output file)."""
    pytest.importorskip("pandas", reason="Ray Data needs pandas (pip install 'ray[data]')")
    folder = operating_router[0]
    source = tmp_path / "q.txt"
    source.write_text("\n".join(QUERIES[:10]) + "\n")
    out = tmp_path / "ray.jsonl"
    result = route_file_with_ray(source, out, model=str(folder), actors=1, batch_size=4, operating_point="quality")
    got = [json.loads(line) for line in out.read_text().splitlines()]
    want = pick_agent(QUERIES[:10], model=folder, operating_point="quality")
    assert result.routed == 10 and [r["line"] for r in got] == list(range(1, 11))
    assert all(r["operating_point"] == "quality" for r in got)
    assert all(same_result({k: r[k] for k in r if k != "line"}, w) for r, w in zip(got, want, strict=True))
    for model, point, words in (
        (str(folder), "cheap", "'cheap' is not one of this router's: balanced, fast, quality"),
        (str(converted[0][0]), "quality", "single head and no operating points"),
    ):
        missing = tmp_path / f"never-{point}.jsonl"
        with pytest.raises(InputError, match=words) as refusal:
            route_file_with_ray(source, missing, model=model, operating_point=point)
        assert "\n" not in str(refusal.value) and not missing.exists()


# ---------------------------------------------------------------------------------------------
# Operating points (after the default router's tests: their router replaces it on the same port)

POINT_QUERIES = QUERIES[:8]
SERVICE_POINT = "fast"  # the service's default: not the router's own ("balanced")


@pytest.fixture(scope="module")
def point_expected(operating_router, backbone_dir) -> dict[str, np.ndarray]:
    """The literal reference's logits of each query, one query at a time, per operating point."""
    _, thetas = operating_router
    expected = {}
    for name, theta in thetas.items():
        reference = ReferenceRouter(str(backbone_dir), theta, AGENTS)
        expected[name] = np.concatenate([reference.logits(reference.embed([q])) for q in POINT_QUERIES])
    return expected


@pytest.fixture(scope="module")
def points_service(service, operating_router):
    """The three-point router (quality, balanced, fast) in place of the module's application, on
    its Ray and port, with --operating-point fast."""
    running = serve(
        str(operating_router[0]),
        port=int(service.url.rsplit(":", 1)[1]),
        max_batch_size=16,
        batch_wait_ms=2,
        max_queries=MAX_QUERIES,
        max_request_bytes=MAX_BYTES,
        blocking=False,
        operating_point=SERVICE_POINT,
    )
    try:
        yield running
    finally:
        running.close()


def check_point_results(results: list[dict], queries: list[str], point: str, expected: dict[str, np.ndarray]) -> None:
    for result, query in zip(results, queries, strict=True):
        assert result.pop("operating_point") == point
        check_result(result, expected[point][POINT_QUERIES.index(query)])


def test_one_batch_at_mixed_points_gets_each_querys_own_point(operating_router, point_expected):
    """route_items, what a replica runs on a merged batch: one backbone run for queries at different
    points, each result its own point's, in batch order."""
    router, tokenizer = load_router(operating_router[0])
    points = [*point_expected, None] * 3
    items = [(POINT_QUERIES[i % len(POINT_QUERIES)], point) for i, point in enumerate(points)]
    results = route_items(router, tokenizer, items)
    for result, (query, point) in zip(results, items, strict=True):
        check_point_results([result], [query], point or "balanced", point_expected)  # None: the router's own


def test_each_operating_point_answers_with_its_own_head(points_service, point_expected):
    """A request at a point gets the reference's results over that point's weights; one without
    the field (or null) gets the service's default point."""
    picks = {}
    for point in point_expected:
        status, body = route(points_service, POINT_QUERIES, operating_point=point)
        assert status == 200, body
        picks[point] = [result["picked_agent"] for result in body["results"]]
        check_point_results(body["results"], POINT_QUERIES, point, point_expected)
    assert len({tuple(p) for p in picks.values()}) > 1  # the heads disagree somewhere: the test can tell them apart
    for fields in ({}, {"operating_point": None}):
        status, body = route(points_service, POINT_QUERIES, **fields)
        assert status == 200, body
        check_point_results(body["results"], POINT_QUERIES, SERVICE_POINT, point_expected)


def test_concurrent_requests_at_different_points_each_get_their_own(points_service, point_expected):
    """Requests at mixed points from 12 threads, merged into shared batches: each answer is its own
    point's, in request order."""
    rng = np.random.default_rng(5)
    choices = [None, *point_expected]
    asks = [
        (list(rng.choice(POINT_QUERIES, size=int(rng.integers(1, 4)))), choices[int(rng.integers(len(choices)))])
        for _ in range(96)
    ]

    def one(ask: tuple[list[str], str | None]) -> tuple[int, dict]:
        queries, point = ask
        return route(points_service, queries, **({} if point is None else {"operating_point": point}))

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(one, asks))
    for (queries, point), (status, body) in zip(asks, answers, strict=True):
        assert status == 200, body
        check_point_results(body["results"], queries, point or SERVICE_POINT, point_expected)


@pytest.mark.parametrize(
    ("point", "words"),
    [
        ("cheap", "operating_point 'cheap' is not one of this router's: balanced, fast, quality."),
        ("Quality", "'Quality' is not one of this router's: balanced, fast, quality"),
        (3, '"operating_point" is int, not a name; send one of balanced, fast, quality.'),
        (["quality"], '"operating_point" is list, not a name'),
    ],
)
def test_an_unknown_operating_point_is_a_422_and_the_service_keeps_serving(
    points_service, point_expected, point, words
):
    status, answer = route(points_service, POINT_QUERIES[:1], operating_point=point)
    assert status == 422 and list(answer) == ["error"] and words in answer["error"] and "\n" not in answer["error"]
    status, body = route(points_service, POINT_QUERIES[:1], operating_point="quality")
    assert status == 200
    check_point_results(body["results"], POINT_QUERIES[:1], "quality", point_expected)


def test_pool_lists_the_operating_points_and_the_services_default(points_service, operating_router):
    status, pool = request(points_service.url + "/v1/pool")
    assert status == 200 and [agent["id"] for agent in pool["agents"]] == AGENTS
    declared = json.loads((operating_router[0] / "config.json").read_text())["operating_points"]
    assert pool["operating_points"] == [
        {
            "name": name,
            "cost_weight": declared[name]["cost_weight"],
            "latency_weight": declared[name]["latency_weight"],
            "default": name == SERVICE_POINT,
        }
        for name in ("balanced", "fast", "quality")
    ]
    status, schema = request(points_service.url + "/openapi.json")
    assert status == 200 and "OperatingPoint" in json.dumps(schema["components"]["schemas"])


# ---------------------------------------------------------------------------------------------
# Startup refusals and shutdown (last: they stop the module's service)


def test_a_pool_file_that_does_not_fit_the_router_is_refused(service, tmp_path):
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps([{"agent_id": "someone_else", "slug": "x"}]))
    with pytest.raises(InputError) as refusal:
        serve(None, pool_file=wrong, blocking=False)  # joins this process's Ray: replaces the app
    message = str(refusal.value)
    assert "someone_else" in message and "frontier_a" in message and "\n" not in message
    assert APP_NAME not in ray.serve.status().applications  # refused: nothing left deployed


def test_a_wrong_operating_point_stops_the_service_with_one_line(service, operating_router, converted, capsys):
    """serve --operating-point NAME the router does not have: exit 2 and one line naming its points,
    from its config.json, before anything is deployed; serve() refuses a one-head router's point too."""
    deployed = set(ray.serve.status().applications)
    port = service.url.rsplit(":", 1)[1]
    assert cli("serve", "--model", operating_router[0], "--operating-point", "cheap", "--port", port) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and "'cheap' is not one of this router's: balanced, fast, quality" in errors[0]
    with pytest.raises(InputError, match="single head and no operating points"):
        serve(converted[0][0], operating_point="quality", blocking=False)
    assert set(ray.serve.status().applications) == deployed


def test_shutdown_leaves_no_ray_process(service):
    assert ray_processes()  # the module's Ray is running
    service.close()
    assert not ray.is_initialized()
    deadline = time.monotonic() + 30
    while ray_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert ray_processes() == []
