"""cli/main.py: one command with subcommands, --help everywhere, bad usage reported at once (before
torch is imported), unexpected errors on their own exit code, and the original release's interfaces."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from helpers import AGENTS, PROJECT_ROOT, cli, run_tool

SUBCOMMANDS = ["route", "train", "evaluate", "convert", "bench", "serve", "frontier", "collect"]


def test_every_subcommand_has_help_with_the_exit_codes():
    result = run_tool("--help")
    assert result.returncode == 0 and all(name in result.stdout for name in SUBCOMMANDS)
    for name in SUBCOMMANDS:
        result = run_tool(name, "--help")
        assert result.returncode == 0 and f"benchgen_router {name}" in result.stdout, name
        assert "--verbose" in result.stdout and "Exit codes" in result.stdout.replace("\n", " "), name


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["route", "--input", "/no/such/file.txt"], "input file not found"),
        (["route", "--batch-size", "-3", "q"], "must be a positive integer"),
        (["convert", "--manifest", "/no/m.json", "--weights", "/no/w.npy", "--output-dir", "/tmp/x"], "not found"),
        (["train", "--rewards", "/no/r.jsonl", "--tasks", "/no/t.jsonl", "--output-dir", "/tmp/x"], "not found"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_usage_is_reported_in_well_under_a_second(argv, message):
    """Arguments and paths are checked before torch and transformers are imported (seconds)."""
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "benchgen_router", *argv], capture_output=True, text=True, timeout=60
    )
    seconds = time.perf_counter() - started
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    probe = subprocess.run(
        [sys.executable, "-c", "import sys, benchgen_router.cli.main; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
    )
    assert probe.stdout.strip() == "False"  # the command line imports no torch before it needs it
    assert seconds < 5, seconds  # generous for a loaded 2-core machine; typically well under a second


def test_an_unexpected_error_has_its_own_exit_code_not_1(monkeypatch, capsys):
    from benchgen_router.cli import route

    def crash(args):
        raise RuntimeError("something broke\nsecond line")

    monkeypatch.setattr(route, "route_command_line", crash)
    assert cli("route", "What is 2+2?") == 70
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: unexpected RuntimeError: something broke (rerun with --verbose for the traceback)"]
    assert cli("route", "--verbose", "What is 2+2?") == 70
    assert "Traceback" in capsys.readouterr().err


@pytest.mark.slow
def test_the_original_release_interface_works_verbatim():
    result = run_tool("router_head.py", "What is the derivative of x^3 + 2x?")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() in AGENTS and result.stderr == ""  # the agent id and nothing else
    code = (
        "from router_head import pick_agent; print(pick_agent('What is the derivative of x^3 + 2x?')['picked_agent'])"
    )
    imported = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=300
    )
    assert imported.returncode == 0 and imported.stdout.strip() == result.stdout.strip()
    assert run_tool("route", "What is the derivative of x^3 + 2x?").stdout == result.stdout
