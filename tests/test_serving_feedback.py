"""Feedback on journaled answers, checked and journaled by a real journal on disk: a score of -0 stored as 0,
a comment over the cap or holding a lone surrogate refused in one line, feedback over the cap per request
refused with a 409; and the journal's part of /healthz, from its own counts. The metrics are read from a
real service's Prometheus endpoint in test_serving_journal_service.py."""

from __future__ import annotations

import json

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
