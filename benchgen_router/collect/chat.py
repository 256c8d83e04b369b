"""One chat completion from an agent's upstream, retried the way rate-limited APIs ask to be.

Retried: 429, 5xx (also when an upstream reports them in a 200 body's `error`, as OpenRouter does
for some provider failures), timeouts and connection errors, with exponential backoff, or after
the server's Retry-After when it gives one. Not retried: any other 4xx (a bad model name, a prompt
over the context window): asking again would fail again and may be billed again. An answer is read
no further than MAX_RESPONSE_BYTES (a larger one fails, unretried: it would be as large, and billed,
again). A call that fails for good comes back with a short `error`; the key never appears in it (only
Upstream.headers() holds the key, and an upstream that echoes it back has it replaced).
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import os
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from benchgen_router.errors import first_line
from benchgen_router.upstreams import Upstream, mask_keys, retryable_status

if TYPE_CHECKING:  # httpx is the collect extra's; imported when a call is made
    import httpx

logger = logging.getLogger("benchgen_router.collect")

MAX_ERROR_CHARS = 300  # an upstream's error page can be long; the record keeps its first words
MAX_RETRY_AFTER_S = 60.0  # a longer Retry-After is waited for this long, then the call is retried anyway
# An answer's body is read no further than this, as the gateway holds a non-streamed answer no further
# (serving/gateway.py's DEFAULT_MAX_RESPONSE_BYTES, which collect cannot import without Ray; a test pins
# the two equal). A 2 GB answer, read whole, took a run to 7.4 GB of memory.
MAX_RESPONSE_BYTES = 32 << 20
TOO_LARGE = (
    "answered more than {limit:,} bytes, collect's limit for one answer (the gateway's too); "
    "ask for fewer tokens (--max-tokens)"
)


@dataclass(frozen=True)
class RetryPolicy:
    """`retries` more attempts after the first; the n-th waits about backoff_s * 2**n (jittered)."""

    retries: int = 3
    backoff_s: float = 1.0

    def delay_s(self, retry: int, retry_after_s: float | None) -> float:
        if retry_after_s is not None:
            return min(retry_after_s, MAX_RETRY_AFTER_S)
        base = self.backoff_s * 2**retry
        return base / 2 + random.random() * base / 2  # jitter: calls limited together do not retry together


@dataclass(frozen=True)
class Answer:
    """What an upstream answered: the message text ("" for an empty answer) and its usage, or an error."""

    content: str | None
    usage: Mapping[str, Any] | None
    generation_id: str | None
    latency_ms: int
    error: str | None = None


class _Failure(Exception):
    def __init__(self, message: str, retryable: bool, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after_s = retry_after_s


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """A Retry-After header in seconds: a number of seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _error_message(body: Any, fallback: str) -> str:
    """The message of an OpenAI-style error body ({"error": {"message"}}, FastAPI's {"detail"})."""
    if isinstance(body, Mapping):
        error = body.get("error")
        if isinstance(error, Mapping) and error.get("message"):
            return str(error["message"])
        if error or body.get("detail"):
            return str(error or body["detail"])
    return fallback


async def read_capped(response: httpx.Response, limit: int = MAX_RESPONSE_BYTES) -> bytes:
    """The body of a streamed response, read no further than `limit` bytes (a _Failure past it: a declared
    length over it is refused before any of the body is read)."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _Failure(TOO_LARGE.format(limit=limit), retryable=False)
    chunks, size = [], 0
    async for chunk in response.aiter_bytes():  # decoded: a compressed body counts at its real size
        size += len(chunk)
        if size > limit:
            raise _Failure(TOO_LARGE.format(limit=limit), retryable=False)
        chunks.append(chunk)
    return b"".join(chunks)


def _json(data: bytes) -> Any:
    """A body as JSON; None when it is not JSON."""
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def _parse(data: bytes) -> tuple[str, Mapping[str, Any] | None, str | None]:
    """(content, usage, id) of a 200 answer's body, or a _Failure."""
    try:
        body = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise _Failure("HTTP 200 with a body that is not JSON", retryable=False) from None
    if isinstance(body, Mapping) and body.get("error"):
        error = body["error"]
        code = error.get("code") if isinstance(error, Mapping) else None
        retry = isinstance(code, int) and retryable_status(code)
        raise _Failure(f"upstream error {code or ''}: {_error_message(body, 'no message')}".strip(), retry)
    try:
        message = body["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        raise _Failure("HTTP 200 without choices[0].message", retryable=False) from None
    content = message.get("content") if isinstance(message, Mapping) else None
    usage = body.get("usage")
    generation_id = body.get("id")
    return (
        content if isinstance(content, str) else "",
        usage if isinstance(usage, Mapping) else None,
        generation_id if isinstance(generation_id, str) else None,
    )


def _status_failure(response: httpx.Response, data: bytes) -> _Failure:
    text = data.decode(response.encoding or "utf-8", errors="replace")
    message = first_line(Exception(_error_message(_json(data), text or response.reason_phrase)))
    retryable = retryable_status(response.status_code)
    after = retry_after_seconds(response.headers.get("retry-after")) if retryable else None
    return _Failure(f"HTTP {response.status_code}: {message}", retryable, after)


async def ask(
    client: httpx.AsyncClient,
    upstream: Upstream,
    prompt: str | Sequence[Mapping[str, str]],
    *,
    max_tokens: int | None = None,
    temperature: float | None = None,
    policy: RetryPolicy = RetryPolicy(),
    environ: Mapping[str, str] = os.environ,
) -> Answer:
    """Send `prompt` as one user message (or a list of messages, as the judge is asked) to the agent's
    upstream; retry what the module docstring says. The latency is the last attempt's, from sending the
    request to the full answer."""
    import httpx

    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    body: dict[str, Any] = {"model": upstream.model, "messages": messages}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if temperature is not None:
        body["temperature"] = temperature
    headers = upstream.headers(environ)
    url = f"{upstream.base_url}/chat/completions"
    attempt = 0
    while True:
        started = time.perf_counter()
        try:
            try:
                # Streamed, so that the body is read in pieces and no further than MAX_RESPONSE_BYTES.
                async with client.stream("POST", url, json=body, headers=headers) as response:
                    data = await read_capped(response)
            except httpx.TimeoutException as err:
                raise _Failure(f"timed out ({type(err).__name__})", retryable=True) from None
            except httpx.TransportError as err:
                raise _Failure(f"{type(err).__name__}: {first_line(err)}", retryable=True) from None
            latency_ms = round((time.perf_counter() - started) * 1000)
            if response.status_code != 200:
                raise _status_failure(response, data)
            content, usage, generation_id = _parse(data)
            return Answer(content, usage, generation_id, latency_ms)
        except _Failure as failure:
            latency_ms = round((time.perf_counter() - started) * 1000)
            message = mask_keys(str(failure), [upstream.api_key(environ)])
            if not failure.retryable or attempt == policy.retries:
                tries = f" (after {attempt + 1} attempts)" if attempt else ""
                return Answer(None, None, None, latency_ms, message[:MAX_ERROR_CHARS] + tries)
            delay = policy.delay_s(attempt, failure.retry_after_s)
            logger.debug("%s: %s; retrying in %.1f s", upstream.agent, message[:MAX_ERROR_CHARS], delay)
            await asyncio.sleep(delay)
            attempt += 1
