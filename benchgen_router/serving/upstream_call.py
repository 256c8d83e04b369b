"""One call of the gateway to an agent's upstream (docs/gateway.md, "Forwarding"): the body it sends, the
answer it reads no further than its cap, the upstream's headers that a client gets, masked, and the words
that tell a failure without quoting it.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from benchgen_router.serving.redaction import KeyRedactor
from benchgen_router.upstreams import Upstream

# The upstream's headers a client may use; the rest (its server, cookies, lengths) stay behind. Its
# x-request-id is renamed: the service sends its own, and a client must get one.
PASSED_HEADERS = ("content-type", "retry-after", "openai-processing-ms")
PASSED_HEADER_PREFIXES = ("x-ratelimit-",)
RENAMED_HEADERS = {"x-request-id": "x-benchgen-upstream-request-id"}


def encode_body(payload: dict[str, Any], model: str) -> bytes:
    """The request as the client sent it, but for `model`, the upstream's own name (in place: key order kept),
    and without the router's own "tradeoff" field, which no upstream knows."""
    return json.dumps({key: value for key, value in {**payload, "model": model}.items() if key != "tradeoff"}).encode()


async def call_upstream(
    client: httpx.AsyncClient, upstream: Upstream, body: bytes, stream: bool, max_response_bytes: int
) -> tuple[httpx.Response, bytes | None, float]:
    """The upstream's answer, its body read whole (ResponseTooLarge past `max_response_bytes`), and the seconds
    to its first byte (its headers); a stream to relay comes back still open, its body None."""
    headers = {"content-type": "application/json", **upstream.headers()}
    request = client.build_request("POST", f"{upstream.base_url}/chat/completions", content=body, headers=headers)
    started = time.perf_counter()
    reply = await client.send(request, stream=True)
    first_byte_s = time.perf_counter() - started
    if stream and reply.is_success:
        return reply, None, first_byte_s
    try:
        return reply, await read_capped(reply, max_response_bytes), first_byte_s
    finally:
        await reply.aclose()


def relayed_headers(reply: httpx.Response, redactor: KeyRedactor) -> dict[str, str]:
    """The upstream's headers that a client gets, each with the pool's keys masked in its value: an upstream
    may quote the key it was sent anywhere, a rate limit's or a request id's value included."""
    relayed = {}
    for raw_name, raw_value in reply.headers.raw:  # the bytes as they came, which Latin-1 keeps
        name = raw_name.decode("latin-1").lower()
        if name in RENAMED_HEADERS:
            name = RENAMED_HEADERS[name]
        elif not (name in PASSED_HEADERS or name.startswith(PASSED_HEADER_PREFIXES)):
            continue
        relayed[name] = redactor.redact(raw_value).decode("latin-1")
    return relayed


def failure_reason(err: httpx.HTTPError, timeout_s: float) -> tuple[str, str]:
    """(metric tag, words for the answer): the error's class, never its text, which may quote the request."""
    if isinstance(err, httpx.TimeoutException):
        return "timeout", f"no answer within {timeout_s:g} s ({type(err).__name__})"
    if isinstance(err, httpx.ConnectError):
        return "connect", "connection failed (ConnectError)"
    return "transport", f"the connection failed ({type(err).__name__})"


class ResponseTooLarge(Exception):
    """An upstream's answer over the gateway's max_response_bytes: its words for the 502."""


async def read_capped(reply: httpx.Response, limit: int) -> bytes:
    """The answer's body, read no further than `limit` bytes (ResponseTooLarge past it)."""
    fix = "ask for less (max_tokens), or raise the gateway's max response bytes"
    declared = reply.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ResponseTooLarge(f"answered {declared} bytes, over the gateway's limit of {limit}; {fix}")
    chunks, size = [], 0
    async for chunk in reply.aiter_bytes():
        size += len(chunk)
        if size > limit:
            raise ResponseTooLarge(f"answered more than the gateway's limit of {limit} bytes; {fix}")
        chunks.append(chunk)
    return b"".join(chunks)
