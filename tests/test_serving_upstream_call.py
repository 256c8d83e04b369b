"""serving/upstream_call.py: the upstream's headers a client gets, masked; an answer read no further than its
cap; a failure told by its class, never its text."""

from __future__ import annotations

import asyncio

import pytest

httpx = pytest.importorskip("httpx")

from benchgen_router.serving.redaction import KeyRedactor  # noqa: E402
from benchgen_router.serving.upstream_call import (  # noqa: E402
    ResponseTooLarge,
    failure_reason,
    read_capped,
    relayed_headers,
)

KEY = "sk-call/test+key=="


def test_the_headers_a_client_gets_are_chosen_renamed_and_masked():
    reply = httpx.Response(
        429,
        headers=[
            (b"Content-Type", b"application/json"),
            (b"Retry-After", KEY.encode()),
            (b"X-RateLimit-Remaining-Requests", b"0; key=sk-call%2Ftest%2Bkey%3D%3D"),
            (b"X-Request-Id", b"req_" + KEY.replace("/", "\\/").encode()),
            (b"Set-Cookie", KEY.encode()),  # not passed at all
            (b"Server", b"upstream"),
            (b"X-Note", "caf\xe9".encode("latin-1")),  # not passed; a Latin-1 byte does not trip the reading
        ],
    )
    assert relayed_headers(reply, KeyRedactor([KEY])) == {
        "content-type": "application/json",
        "retry-after": "***",
        "x-ratelimit-remaining-requests": "0; key=***",
        "x-benchgen-upstream-request-id": "req_***",
    }
    assert relayed_headers(reply, KeyRedactor([]))["retry-after"] == KEY  # without keys, as it came


def test_an_answer_is_read_no_further_than_its_cap():
    async def read(reply: httpx.Response, limit: int) -> bytes:
        return await read_capped(reply, limit)

    assert asyncio.run(read(httpx.Response(200, content=b"x" * 100), 100)) == b"x" * 100
    with pytest.raises(ResponseTooLarge, match="answered 101 bytes, over the gateway's limit of 100"):
        asyncio.run(read(httpx.Response(200, content=b"x" * 101), 100))  # declared: refused unread

    async def endless():
        while True:
            yield b"x" * 64

    with pytest.raises(ResponseTooLarge, match="more than the gateway's limit of 1000 bytes"):
        asyncio.run(read(httpx.Response(200, content=endless()), 1000))  # undeclared: stopped at the cap


def test_a_failure_is_told_by_its_class_never_its_text():
    secret = f"Bearer {KEY} in a message that quotes the request"
    for err, tag in (
        (httpx.ReadTimeout(secret), "timeout"),
        (httpx.ConnectError(secret), "connect"),
        (httpx.RemoteProtocolError(secret), "transport"),
    ):
        reason, words = failure_reason(err, 2.0)
        assert reason == tag and KEY not in words and type(err).__name__ in words
