"""The service's settings checked before Ray starts (serving.service_settings): each mistake one line in
bounded time."""

from __future__ import annotations

import socket
import time

import pytest

pytest.importorskip("ray.serve")

from benchgen_router.errors import InputError
from benchgen_router.serving.service_settings import check_cpus, check_port_free, check_reachable


def test_start_up_checks_are_one_line_in_bounded_time():
    with pytest.raises(InputError, match="need 10000 CPUs"):
        check_cpus("replicas", 10_000)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(InputError, match="pass a free port"):
            check_port_free("127.0.0.1", busy.getsockname()[1], "the service")
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(InputError, match="no Ray cluster answers"):
        check_reachable(f"127.0.0.1:{port}")
    assert time.monotonic() - started < 15
