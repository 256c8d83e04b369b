"""Reading and checking a request before anything is scored or called: its body, read as it arrives
within a size and a time, the shape of a /v1/route body, and whether the client is still there.
A refusal is a RequestError carrying its HTTP status; serving/app.py answers it in one place."""

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

from starlette.requests import ClientDisconnect, Request

from benchgen_router.errors import InputError, first_line
from benchgen_router.files import text_problem
from benchgen_router.serving.gateway import GatewayError, RoutingText, routing_text

logger = logging.getLogger("benchgen_router.serving")
T = TypeVar("T")

DEFAULT_MAX_QUERIES = 256
DEFAULT_MAX_REQUEST_BYTES = 1 << 20


class RequestError(InputError):
    """A request the service refuses, with the HTTP status it is answered with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def read_body(request: Request, max_request_bytes: int, timeout_s: float) -> bytes:
    # Counted as it arrives, so a chunked upload never sits in memory whole; bounded in time, so a
    # stalled client frees its slot.
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_request_bytes:
        raise RequestError(
            413, f"request body is {declared} bytes, over this service's limit of {max_request_bytes}; split it."
        )
    chunks: list[bytes] = []
    size = 0

    async def collect() -> None:
        nonlocal size
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_request_bytes:
                raise RequestError(
                    413, f"request body is over this service's limit of {max_request_bytes} bytes; split it."
                )
            chunks.append(chunk)

    try:
        await asyncio.wait_for(collect(), timeout_s)
    except TimeoutError:
        raise RequestError(408, f"request body not received within {timeout_s:g} s; send it whole.") from None
    except (ClientDisconnect, asyncio.CancelledError) as gone:
        # The client went away (Ray Serve's proxy then cancels its request): one line, not a traceback.
        logger.warning("a client disconnected after %d bytes of its request body", size)
        if isinstance(gone, asyncio.CancelledError):
            raise
        raise RequestError(400, "the client disconnected before sending the whole body.") from None
    return b"".join(chunks)


async def until_disconnected(request: Request) -> None:
    """Returns once the client is gone. Called after its body is read, when the next message the server
    has for the request is its disconnect."""
    while (await request.receive())["type"] != "http.disconnect":
        await asyncio.sleep(0.1)  # not expected after the body; never a busy loop


async def while_connected(request: Request, work: Awaitable[T]) -> T | None:
    """`work`'s result, or None when the client went away first: then `work` (an upstream call, which the
    pool bills as long as it runs) is cancelled at once. Ray Serve cancels a request whose client leaves in
    some of its modes only; this holds in every mode."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(until_disconnected(request))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        return None
    return task.result()


def passthrough_text(payload: dict[str, Any], route_on: str) -> RoutingText | None:
    """What the router would score in a pass-through request, for its journal line; None when nothing."""
    try:
        return routing_text(payload.get("messages"), route_on)
    except GatewayError:
        return None


def parse_route_body(body: bytes, max_queries: int) -> tuple[list[str], Any, Any]:
    # The body's shape only: its "operating_point" and "tradeoff" are returned as sent, checked against
    # the router once it is loaded.
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as err:  # JSONDecodeError, bad UTF-8, absurd nesting
        reason = "nested too deeply" if isinstance(err, RecursionError) else first_line(err)
        raise RequestError(400, f'body is not valid JSON ({reason}); send {{"queries": ["..."]}}.') from None
    if not isinstance(payload, dict):
        raise RequestError(400, f'body is a JSON {type(payload).__name__}, not an object; send {{"queries": [...]}}.')
    if "queries" not in payload:
        raise RequestError(422, 'body has no "queries" field; send {"queries": ["..."]}.')
    queries = payload["queries"]
    if isinstance(queries, str):
        raise RequestError(422, '"queries" is a string, not a list; send {"queries": ["..."]}.')
    if not isinstance(queries, list):
        raise RequestError(422, f'"queries" is {type(queries).__name__}, not a list of strings.')
    if not queries:
        raise RequestError(422, '"queries" is empty; send at least one query.')
    if len(queries) > max_queries:
        raise RequestError(
            413, f"{len(queries)} queries in one request, over this service's limit of {max_queries}; split it."
        )
    for position, query in enumerate(queries):
        problem = text_problem(query, f"query {position}")
        if problem:
            raise RequestError(422, f"{problem}; a router cannot score it.")
    return queries, payload.get("operating_point"), payload.get("tradeoff")
