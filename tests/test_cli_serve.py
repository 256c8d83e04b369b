"""`benchgen-router serve` refusing, as a user runs it, a setting it can tell is wrong before Ray starts: a
--journal folder that could never be written, or a retention it could not keep, is one line and exit 2 in
about a second, not a service that starts and then drops every journal line and feedback."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from helpers import run_tool

pytest.importorskip("ray.serve")


def write_default_pool(folder: Path) -> Path:
    """A pool of the default router's agents, each with an upstream (nothing listens there)."""
    from benchgen_router.serving.service_settings import router_agents

    pool = folder / "agents.json"
    agents = [
        {"agent_id": agent, "base_url": "http://127.0.0.1:9/v1", "model": agent} for agent in router_agents(None, None)
    ]
    pool.write_text(json.dumps({"agents": agents}))
    return pool


def test_a_journal_folder_that_cannot_be_written_is_refused_before_ray_starts(tmp_path):
    """Everything else right (the default router, a pool of its agents with upstreams): the folder alone is
    refused, where the service once started and dropped every line."""
    pool = write_default_pool(tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    for journal, words in ((blocker / "journal", "cannot be written (Not a directory)"), (blocker, "is a file")):
        started = time.monotonic()
        result = run_tool("serve", "--pool", pool, "--journal", journal, timeout=60)
        assert result.returncode == 2, result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"error: --journal {journal} ") and words in line, line
        assert "Ray" not in result.stderr and time.monotonic() - started < 30


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--journal-max-bytes", "1GB"], "--journal-max-bytes 1GB is not a size; pass a number of bytes"),
        (["--journal-max-bytes", "100"], "--journal-max-bytes must be a whole number >= 1024, got 100."),
        (["--journal-max-bytes=-1G"], "--journal-max-bytes -1G is not a size"),
        (["--journal-max-days", "0"], "--journal-max-days must be a number of days > 0, got 0.0."),
        (["--journal-max-days", "nan"], "--journal-max-days must be a number of days > 0, got nan."),
        (["--journal-max-days", "a month"], "--journal-max-days a month is not a number of days; pass one"),
    ],
)
def test_a_retention_the_journal_cannot_keep_is_refused_before_ray_starts(tmp_path, flags, words):
    """One line, exit 2, before Ray is imported, and the journal's folder is not created."""
    pool, journal = write_default_pool(tmp_path), tmp_path / "journal"
    started = time.monotonic()
    result = run_tool("serve", "--pool", pool, "--journal", journal, *flags, timeout=60)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and words in line, line
    assert not journal.exists() and time.monotonic() - started < 30


def test_a_retention_without_a_journal_is_refused_before_ray_starts(tmp_path):
    pool = write_default_pool(tmp_path)
    result = run_tool("serve", "--pool", pool, "--journal-max-days", "7", timeout=120)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line == "error: --journal-max-days needs --journal, the folder to journal to.", line
