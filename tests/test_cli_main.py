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


BENCHMARKS = {"service": "bench_service", "load-memory": "bench_load_memory", "streaming": "bench_streaming"}


@pytest.mark.parametrize("name", BENCHMARKS)
def test_each_benchmark_is_a_bench_subcommand_with_its_own_help(name, capsys):
    assert cli("bench", name, "--help") == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: benchgen-router bench {name} [-h]"), out[:200]
    assert "--verbose" in out and "Exit codes" in out.replace("\n", " ")
    assert cli("bench", "--help") == 0
    assert name in capsys.readouterr().out  # listed where `bench` itself is described


def test_benchmark_options_reach_the_benchmark_named_and_bench_alone_is_routing_speed():
    from benchgen_router.cli import bench_load_memory, bench_service, bench_streaming
    from benchgen_router.cli.main import build_parser

    parser, _ = build_parser()
    args = parser.parse_args(["bench", "-v", "service", "--requests", "7", "--modes", "throughput", "--skip-load"])
    assert (args.benchmark, args.benchmark_module) == ("service", bench_service)
    assert (args.requests, args.modes, args.skip_load, args.seconds) == (7, ("throughput",), True, 12.0)
    assert args.verbose  # given before the benchmark's name, and kept
    args = parser.parse_args(["bench", "load-memory", "--layers", "2", "--vocab", "32000", "--json", "--verbose"])
    assert (args.benchmark_module, args.layers, args.vocab, args.json, args.verbose) == (
        bench_load_memory,
        2,
        32000,
        True,
        True,
    )
    assert args.modes == ["head-only", "bundled"] and args.checkpoint_dtype == "bfloat16"
    args = parser.parse_args(["bench", "streaming", "--lines", "10", "20", "--threads", "2"])
    assert (args.benchmark_module, args.lines, args.threads, args.json, args.verbose) == (
        bench_streaming,
        [10, 20],
        2,
        False,
        False,
    )
    args = parser.parse_args(["bench", "--layers", "4", "--queries", "16"])
    assert (args.benchmark, args.layers, args.queries) == (None, 4, 16)


def test_the_commands_run_as_many_queries_per_model_run_as_the_library_does():
    """The commands name the default themselves, so that --help imports no torch: it must be the library's."""
    from benchgen_router.cli.main import build_parser
    from benchgen_router.serving.replica import DEFAULT_MAX_BATCH_SIZE

    parser, _ = build_parser()
    assert parser.parse_args(["serve"]).max_batch_size == DEFAULT_MAX_BATCH_SIZE
    assert parser.parse_args(["bench", "service"]).max_batch_size == DEFAULT_MAX_BATCH_SIZE


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "service", "--modes", "warp"], "give throughput, standard or both"),
        (["bench", "service", "--replicas", "0"], "argument --replicas: must be a positive integer, got 0"),
        (["bench", "load-memory", "--modes", "mapped"], "invalid choice: 'mapped'"),
        (["bench", "streaming", "--lines", "100", "-5"], "argument --lines: must be a positive integer, got -5"),
        (["bench", "service", "--layers", "4"], "unrecognized arguments: --layers 4"),
        (
            ["bench", "--queries", "16", "service"],
            "--queries: options of `bench` alone; give service's own after",
        ),
    ],
)
def test_bad_benchmark_usage_is_one_line_and_exit_2(argv, message, capsys):
    assert cli(*argv) == 2
    err = capsys.readouterr().err
    assert message in err.splitlines()[-1] and "Traceback" not in err, err


def test_the_library_never_imports_the_command_line():
    """benchgen_router/cli/ is the thin layer on top; `python -m benchgen_router` is the command's other name."""
    import ast

    package = PROJECT_ROOT / "benchgen_router"
    offenders = []
    for path in package.rglob("*.py"):
        if path.is_relative_to(package / "cli") or path == package / "__main__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{alias.name}" for alias in node.names]
            if any(name == "benchgen_router.cli" or name.startswith("benchgen_router.cli.") for name in names):
                offenders.append(f"{path.relative_to(PROJECT_ROOT)}:{node.lineno}")
    assert offenders == []


@pytest.mark.parametrize(
    ("module", "command"),
    [
        ("benchgen_router.bench.load_memory", "bench load-memory"),
        ("benchgen_router.bench.routing", "bench"),
        ("benchgen_router.frontier", "frontier"),
    ],
)
def test_the_old_python_m_ways_in_warn_then_run_the_command(module, command):
    result = run_tool(module, "--help", timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        f"warning: python -m {module} is deprecated and goes in 0.4.0; run `benchgen-router {command}` (same options)."
    ]
    assert result.stdout.startswith(f"usage: python -m benchgen_router {command} ")
