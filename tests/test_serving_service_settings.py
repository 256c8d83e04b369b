"""The service's settings checked before Ray starts (serving.service_settings): each mistake one line in
bounded time, and the journal's retention carried to the replicas in the gateway's settings."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

pytest.importorskip("ray.serve")

from benchgen_router.errors import InputError
from benchgen_router.serving.journal import Retention
from benchgen_router.serving.service_settings import check_cpus, check_port_free, check_reachable, read_gateway


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


def default_pool(folder: Path) -> Path:
    """A pool file of the default router's agents behind one upstream."""
    agents = ["frontier_a", "frontier_b", "frontier_c", "open_mid", "open_cheap_reasoning"]
    pool = folder / "agents.json"
    pool.write_text(json.dumps({"base_url": "http://127.0.0.1:9/v1", "agents": [{"agent_id": a} for a in agents]}))
    return pool


def test_the_journals_retention_reaches_the_gateways_settings_checked(tmp_path):
    """serve(journal_max_bytes=..., journal_max_days=...) as the replicas get it; the default without them; a
    value out of range, or either without a journal, one line naming the setting (and the flag, for serve)."""
    pool, journal = default_pool(tmp_path), tmp_path / "journal"
    settings = read_gateway(pool, None, None, journal=journal, journal_max_bytes=64 << 10, journal_max_days=0.5)
    assert settings.journal_retention == Retention(max_bytes=64 << 10, max_days=0.5)
    assert read_gateway(pool, None, None, journal=journal).journal_retention == Retention()  # 1 GiB, 30 days
    settings = read_gateway(pool, None, None, journal=journal, journal_max_days=7)
    assert settings.journal_retention == Retention(max_days=7)  # the other keeps its default
    for setting, value, words in (
        ("journal_max_bytes", 1000, "max_bytes must be a whole number >= 1024, got 1000."),
        ("journal_max_bytes", 1.5e9, "max_bytes must be a whole number >= 1024, got 1500000000.0."),
        ("journal_max_days", 0, "max_days must be a number of days > 0, got 0."),
        ("journal_max_days", float("inf"), "max_days must be a number of days > 0, got inf."),
    ):
        with pytest.raises(InputError, match=words):
            read_gateway(pool, None, None, journal=journal, **{setting: value})
    for setting, value in (("journal_max_bytes", 1 << 20), ("journal_max_days", 7)):
        with pytest.raises(InputError, match=f"^{setting} needs journal, the folder to journal to.$") as refused:
            read_gateway(pool, None, None, **{setting: value})
        assert refused.value.for_command_line().startswith(f"--{setting.replace('_', '-')} needs --journal")
    assert not journal.exists()  # refused before anything was made
