"""`benchgen-router serve` refusing, as a user runs it, a setting it can tell is wrong before Ray starts: a
--journal folder that could never be written is one line and exit 2 in about a second, not a service that
starts and then drops every journal line and feedback."""

from __future__ import annotations

import json
import time

import pytest

from helpers import run_tool

pytest.importorskip("ray.serve")


def test_a_journal_folder_that_cannot_be_written_is_refused_before_ray_starts(tmp_path):
    """Everything else right (the default router, a pool of its agents with upstreams): the folder alone is
    refused, where the service once started and dropped every line."""
    from benchgen_router.serving.service_settings import router_agents

    pool = tmp_path / "agents.json"
    agents = [
        {"agent_id": agent, "base_url": "http://127.0.0.1:9/v1", "model": agent} for agent in router_agents(None, None)
    ]
    pool.write_text(json.dumps({"agents": agents}))
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    for journal, words in ((blocker / "journal", "cannot be written (Not a directory)"), (blocker, "is a file")):
        started = time.monotonic()
        result = run_tool("serve", "--pool", pool, "--journal", journal, timeout=60)
        assert result.returncode == 2, result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"error: --journal {journal} ") and words in line, line
        assert "Ray" not in result.stderr and time.monotonic() - started < 30
