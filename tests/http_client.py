"""Plain HTTP clients for the service tests: urllib for well-formed requests, a raw socket for the
malformed and stalled ones urllib cannot send."""

from __future__ import annotations

import contextlib
import json
import socket
import time
import urllib.error
import urllib.request


def request(url: str, body: bytes | None = None, method: str | None = None, timeout: float = 60) -> tuple[int, dict]:
    """(status, JSON body) of one HTTP request; error statuses are answers too. A body that is
    not JSON comes back as {"not_json": text}, which no test accepts as an answer."""
    headers = {"content-type": "application/json"} if body is not None else {}
    req = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, {"not_json": raw.decode("utf-8", "replace")}


def raw_exchange(url: str, head: bytes, chunks: list[bytes], pause_s: float = 0.0, timeout: float = 60) -> bytes:
    """Send a request by hand (headers, then each chunk, `pause_s` apart) and return what the service
    answers, read until it closes the connection or `timeout` passes."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as connection:
        connection.sendall(head)
        answer = b""
        for chunk in chunks:
            try:
                connection.sendall(chunk)
            except OSError:  # the service answered and closed before the upload ended
                break
            time.sleep(pause_s)
        with contextlib.suppress(OSError):
            while piece := connection.recv(65536):
                answer += piece
                if b"\r\n\r\n" in answer and b'"error"' in answer:
                    break
        return answer
