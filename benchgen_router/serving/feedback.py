"""Feedback on journaled answers (POST /v1/feedback), and the traffic journal's state where an operator
looks: /healthz and the Prometheus metrics (docs/gateway.md, "The traffic journal and feedback").

A feedback body is checked field by field (a GatewayError naming the field); the journal takes at most
FEEDBACK_PER_REQUEST lines per request id (serving/journal.py), and more is refused with a 409. The
journal counts what it could not keep (lines lost to a full disk, feedback over the cap, files removed
by retention); JournalMetrics brings the metrics up to those counts at each request that touches the
journal and at each /healthz, which a load balancer polls.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from benchgen_router.serving.gateway import Gateway, GatewayError, parse_chat_body
from benchgen_router.serving.journal import FEEDBACK_PER_REQUEST, TrafficJournal

# A feedback body: an id, a score and a comment.
FEEDBACK_MAX_BYTES = 64 << 10
# A comment says what was wrong or right with one answer: a few paragraphs at most. Bounded so that a
# request's feedback (FEEDBACK_PER_REQUEST lines) stays small beside the journal's budget.
FEEDBACK_MAX_COMMENT_CHARS = 2000


def journal_of(gateway: Gateway) -> TrafficJournal:
    """The gateway's journal; a 404 saying how to get one when the service keeps none."""
    if gateway.journal is None:
        raise GatewayError(
            404,
            "this service keeps no traffic journal, so it takes no feedback; restart it with --journal DIR "
            "(docs/gateway.md).",
            code="journal_not_configured",
        )
    return gateway.journal


def parse_feedback(body: bytes, known: Callable[[str], bool]) -> tuple[str, float, str | None]:
    """(request id, score, comment) of a feedback body; a GatewayError naming the field otherwise."""
    payload = parse_chat_body(body, 'a JSON object {"request_id": "...", "score": 1}')
    unknown = sorted(set(payload) - {"request_id", "score", "comment"})
    if unknown:
        raise GatewayError(
            400,
            f"unknown field(s) {', '.join(map(repr, unknown))}; send request_id, score and comment.",
            param=unknown[0],
        )
    request_id, score, comment = payload.get("request_id"), payload.get("score"), payload.get("comment")
    if not isinstance(request_id, str) or not request_id:
        raise GatewayError(
            400, '"request_id" must be the x-benchgen-request-id of a gateway answer.', param="request_id"
        )
    if isinstance(score, bool) or not isinstance(score, int | float) or not 0 <= score <= 1:
        raise GatewayError(
            400,
            f'"score" must be a number from 0 to 1 (a thumbs up is 1), got {json.dumps(score)[:40]}.',
            param="score",
        )
    if comment is not None:
        check_comment(comment)
    if not known(request_id):
        raise GatewayError(
            404,
            f"request id {request_id[:80]!r} was not issued by this service's journal; send the "
            "x-benchgen-request-id header of a gateway answer.",
            code="request_not_found",
            param="request_id",
        )
    return request_id, float(score) + 0.0, comment  # + 0.0: a score of -0 is stored as 0


def check_comment(comment: Any) -> None:
    if not isinstance(comment, str):
        raise GatewayError(400, f'"comment" must be text, got {type(comment).__name__}.', param="comment")
    if len(comment) > FEEDBACK_MAX_COMMENT_CHARS:
        raise GatewayError(
            400,
            f'"comment" is {len(comment)} characters, over the limit of {FEEDBACK_MAX_COMMENT_CHARS}; shorten it.',
            param="comment",
        )
    try:
        comment.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate escape (\ud800) reads into a str that no file can hold
        raise GatewayError(
            400, '"comment" is not valid UTF-8 text (it holds a lone surrogate escape); send text.', param="comment"
        ) from None


def take_feedback(journal: TrafficJournal, body: bytes) -> tuple[str, float]:
    """Check a feedback body and journal it: (request id, score); a GatewayError when it is refused."""
    request_id, score, comment = parse_feedback(body, journal.known_request_id)
    if not journal.record_feedback(request_id, score, comment):
        raise GatewayError(
            409,
            f"request {request_id} has had its {FEEDBACK_PER_REQUEST} feedback scores; no more are taken for it.",
            code="feedback_limit_reached",
            param="request_id",
        )
    return request_id, score


def journal_health(journal: TrafficJournal) -> dict[str, Any]:
    """The journal's part of /healthz: whether it is writing, and what it has lost or removed."""
    health: dict[str, Any] = {"writing": journal.failure is None}
    if journal.failure is not None:
        health["error"] = f"the traffic journal cannot write ({journal.failure}); answers are not affected"
    removed = journal.removed()
    health |= {
        "lines_lost": journal.write_failures,
        "feedback_refused": journal.feedback_refused,
        "files_removed": sum(files for files, _ in removed.values()),
    }
    return health


class JournalMetrics:
    """The journal's state and what it dropped, as Prometheus metrics (Ray Serve adds the replica's tags)."""

    def __init__(self) -> None:
        from ray.serve.metrics import Counter, Gauge

        self.writing = Gauge(
            "benchgen_router_journal_writing",
            description="1 while the traffic journal writes its lines, 0 while it cannot (a full disk; see the log).",
        )
        self.feedback_refused = Counter(
            "benchgen_router_journal_feedback_refused",
            description=f"Feedback refused: its request had {FEEDBACK_PER_REQUEST} already.",
        )
        self.files_removed = Counter(
            "benchgen_router_journal_files_removed",
            description="Journal files removed by retention, by kind (calls, feedback) and reason (age, size).",
            tag_keys=("kind", "reason"),
        )
        self.bytes_removed = Counter(
            "benchgen_router_journal_bytes_removed",
            description="Bytes of the journal files removed by retention, by kind and reason.",
            tag_keys=("kind", "reason"),
        )
        self.counted_refused = 0
        self.counted_removed: dict[tuple[str, str], tuple[int, int]] = {}

    def update(self, gateway: Gateway) -> None:
        """Bring the metrics up to the journal's counts (its lost lines: the gateway's own counter)."""
        journal = gateway.journal
        if journal is None:
            return
        gateway.count_journal_failures()
        self.writing.set(1 if journal.failure is None else 0)
        if journal.feedback_refused > self.counted_refused:
            self.feedback_refused.inc(journal.feedback_refused - self.counted_refused)
            self.counted_refused = journal.feedback_refused
        for (kind, reason), (files, size) in journal.removed().items():
            counted_files, counted_bytes = self.counted_removed.get((kind, reason), (0, 0))
            tags = {"kind": kind, "reason": reason}
            if files > counted_files:
                self.files_removed.inc(files - counted_files, tags=tags)
                self.bytes_removed.inc(size - counted_bytes, tags=tags)
            self.counted_removed[kind, reason] = (files, size)
