"""Feedback on journaled answers, checked and journaled by a real journal on disk: a score of -0 stored as 0,
a comment over the cap or holding a lone surrogate refused in one line, feedback over the cap per request
refused with a 409; and the journal's part of /healthz, from its own counts. The metrics are read from a
real service's Prometheus endpoint in test_serving_journal_service.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray.serve")

from test_serving_journal import call_entry

from benchgen_router.serving.feedback import (
    FEEDBACK_MAX_COMMENT_CHARS,
    journal_health,
    parse_feedback,
    take_feedback,
)
from benchgen_router.serving.gateway import GatewayError
from benchgen_router.serving.journal import FEEDBACK_PER_REQUEST, Retention, TrafficJournal
from benchgen_router.serving.journal_reading import read_journal


@pytest.fixture
def journal(tmp_path):
    journal = TrafficJournal(tmp_path, keep_text=True)
    yield journal
    journal.close()


def body(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def refusal(journal: TrafficJournal, raw: bytes) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        take_feedback(journal, raw)
    assert "\n" not in str(caught.value)
    return caught.value


def test_a_score_of_minus_zero_is_stored_as_zero(journal, tmp_path):
    request_id = journal.new_request_id()
    journal.record_call(call_entry(request_id), "prompt")
    assert take_feedback(journal, b'{"request_id": "' + request_id.encode() + b'", "score": -0.0}') == (request_id, 0.0)
    journal.close()
    (stored,) = read_journal(tmp_path).calls[0]["feedback"]
    assert json.dumps(stored["score"]) == "0.0"  # not "-0.0"


def test_comments_over_the_cap_or_not_valid_utf8_are_refused_naming_the_problem(journal):
    request_id = journal.new_request_id()
    too_long = refusal(journal, body(request_id=request_id, score=1, comment="x" * (FEEDBACK_MAX_COMMENT_CHARS + 1)))
    assert (too_long.status, too_long.param) == (400, "comment")
    assert f"over the limit of {FEEDBACK_MAX_COMMENT_CHARS}" in str(too_long)
    surrogate = b'{"request_id": "' + request_id.encode() + b'", "score": 1, "comment": "bad \\ud800"}'
    lone = refusal(journal, surrogate)
    assert (lone.status, lone.param) == (400, "comment") and "not valid UTF-8" in str(lone)
    assert take_feedback(journal, body(request_id=request_id, score=1, comment="x" * FEEDBACK_MAX_COMMENT_CHARS))
    assert take_feedback(journal, body(request_id=request_id, score=1, comment="a pair \U0001f600 is fine"))


def test_feedback_over_the_cap_per_request_is_a_409_and_counted(journal):
    request_id = journal.new_request_id()
    for _ in range(FEEDBACK_PER_REQUEST):
        take_feedback(journal, body(request_id=request_id, score=1))
    over = refusal(journal, body(request_id=request_id, score=1))
    assert (over.status, over.code, over.param) == (409, "feedback_limit_reached", "request_id")
    assert str(FEEDBACK_PER_REQUEST) in str(over) and journal.feedback_refused == 1


def test_a_forged_id_is_still_a_404_before_the_cap_is_looked_at(journal):
    assert parse_feedback(body(request_id=journal.new_request_id(), score=0.5), journal.known_request_id)[1] == 0.5
    forged = refusal(journal, body(request_id="bgr-000000000000000000000000-forged", score=1))
    assert (forged.status, forged.code) == (404, "request_not_found") and journal.feedback_refused == 0


def test_health_follows_the_journals_counts(tmp_path):
    journal = TrafficJournal(tmp_path / "journal", retention=Retention(max_bytes=4096))
    request_id = journal.new_request_id()
    for _ in range(30):
        journal.record_call(call_entry(journal.new_request_id()), "prompt")
    for _ in range(FEEDBACK_PER_REQUEST + 2):
        journal.record_feedback(request_id, 1.0, None)
    journal.close()
    journal.record_call(call_entry(request_id), "after close")  # a line lost: the journal is closed
    health = journal_health(journal)
    assert health["writing"] is False and "cannot write (the journal is closed)" in health["error"]
    assert health["lines_lost"] == 1 and health["feedback_refused"] == 2 and health["files_removed"] > 0


# ---------------------------------------------------------------------------------------------
# A running service whose journal's disk fills, then is freed: `benchgen-router serve` in a mount
# namespace of its own, its journal on a 64 KiB tmpfs that a spare file fills before it starts.


def metric(text: str, name: str) -> float | None:
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{")]
    return sum(values) if values else None


def wait_for(check, what: str, timeout_s: float = 60):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"{what} within {timeout_s} s")


@pytest.mark.slow
def test_a_service_whose_journal_disk_is_full_keeps_answering_and_says_so(tmp_path, backbone_dir):
    import httpx
    from test_serving_gateway_hostile import AGENTS, answered, build_router
    from test_serving_journal import in_own_mount_namespace

    from benchgen_router.serving.engine import free_port
    from helpers import PROJECT_ROOT
    from upstream_server import MisbehavingUpstream

    namespace = in_own_mount_namespace()
    router = build_router(tmp_path / "router", backbone_dir)
    disk, log = tmp_path / "disk", tmp_path / "serve.log"
    disk.mkdir()
    port, metrics_port = free_port(), free_port()
    url, metrics_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics"
    with MisbehavingUpstream(lambda body: answered()) as upstream:
        pool = tmp_path / "agents.json"
        pool.write_text(json.dumps({"agents": [
            {"agent_id": agent, "base_url": upstream.base_url, "model": agent} for agent in AGENTS
        ]}))  # fmt: skip
        script = (
            f"mount -t tmpfs -o size=64k tmpfs {disk} && mkdir {disk}/journal && "
            f"head -c 32 /dev/urandom > {disk}/journal/.key && chmod 600 {disk}/journal/.key && "
            f"(dd if=/dev/zero of={disk}/spare bs=1k 2>/dev/null; true) && "
            f"exec {sys.executable} -m benchgen_router serve --model {router} --pool {pool} --port {port} "
            f"--metrics-port {metrics_port} --journal {disk}/journal"
        )
        env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "RAY_metrics_report_interval_ms": "1000"}
        with log.open("wb") as output:
            served = subprocess.Popen(
                [*namespace, "sh", "-c", script], stdout=output, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,
            )  # fmt: skip
        inside = Path(f"/proc/{served.pid}/root") / disk.relative_to("/")  # the tmpfs, seen from outside
        http = httpx.Client(timeout=60, trust_env=False)
        try:
            wait_for(lambda: served.poll() is None and healthy(http, url), f"serve up ({log.read_text()[-2000:]})", 300)

            def chat() -> httpx.Response:
                body = {"model": "benchgen-router", "messages": [{"role": "user", "content": "what is 2 + 2"}]}
                return http.post(f"{url}/v1/chat/completions", json=body)

            assert chat().status_code == 200  # answered, its journal line lost
            journal = wait_for(lambda: lost_lines(http, url), "the journal reporting lost lines")
            assert journal["writing"] is False and "No space left on device" in journal["error"]
            text = wait_for(lambda: exported(http, metrics_url, 0), "the metrics showing the journal stopped")
            assert metric(text, "ray_benchgen_router_gateway_journal_write_failures_total") >= 1

            (inside / "spare").unlink()  # an operator frees the disk
            answered_after = chat()
            assert answered_after.status_code == 200
            assert wait_for(lambda: healthy(http, url)["journal"]["writing"], "the journal writing again")
            wait_for(lambda: exported(http, metrics_url, 1), "the metrics showing the journal writing again")
            request_id = answered_after.headers["x-benchgen-request-id"]
            calls = wait_for(lambda: read_journal(inside / "journal").calls, "the line written after the disk freed")
            assert [call["request_id"] for call in calls] == [request_id]
        finally:
            http.close()
            os.killpg(served.pid, signal.SIGINT)
            try:
                served.wait(timeout=120)
            except subprocess.TimeoutExpired:  # never leave a service running behind a failed test
                os.killpg(served.pid, signal.SIGKILL)
                served.wait()
                raise
    lines = log.read_text(errors="replace").splitlines()
    stopped = [line for line in lines if "cannot write (No space left on device)" in line]
    assert len(stopped) == 1 and "not being written" in stopped[0]  # (its level: test_serving_journal.py)
    assert len([line for line in lines if "writing again" in line]) == 1


def healthy(http, url: str) -> dict | None:
    import httpx

    try:
        answer = http.get(f"{url}/healthz")
    except httpx.HTTPError:  # not listening yet
        return None
    return answer.json() if answer.status_code == 200 else None


def lost_lines(http, url: str) -> dict | None:
    journal = (healthy(http, url) or {}).get("journal", {})
    return journal if journal.get("lines_lost") else None


def exported(http, metrics_url: str, writing: int) -> str | None:
    import httpx

    try:
        text = http.get(metrics_url).text
    except httpx.HTTPError:  # the exporter not up yet
        return None
    return text if metric(text, "ray_benchgen_router_journal_writing") == writing else None
