"""`benchgen-router route` as users run it: the CLI on
single queries and on files in every input format, bad lines, exit codes, and interruption."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from benchgen_router.model_code import default_router_dir
from benchgen_router.routing import pick_agent
from helpers import AGENTS, PROJECT_ROOT, RESULT_KEYS, check_result, cli, make_queries, run_in_process, run_tool

QUERIES = make_queries(24, seed=21)


def read_output(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def route_file(tmp_path: Path, folder: Path, name: str, content: bytes, *extra: str) -> tuple[int, list[dict]]:
    """Run the CLI in-process on a file written from content; (exit code, output records)."""
    source, out = tmp_path / name, tmp_path / f"{name}.out.jsonl"
    source.write_bytes(content)
    code = cli("route", "--model", folder, "--input", source, "--output", out, "--batch-size", "3", *extra)
    return code, read_output(out)


# ---------------------------------------------------------------------------------------------
# Command line, single queries (subprocesses: stdout is exactly what a shell sees)


@pytest.mark.slow
def test_single_query_prints_just_the_agent_id(converted):
    folder, _ = converted[0]
    result = run_in_process("route", "--model", folder, QUERIES[0])
    assert result.returncode == 0, result.stderr
    assert result.stdout == pick_agent(QUERIES[0], model=folder)["picked_agent"] + "\n"


@pytest.mark.slow
def test_json_prints_one_result_per_query(converted):
    folder, _ = converted[8]
    result = run_in_process("route", "--model", folder, "--json", QUERIES[1], QUERIES[2])
    assert result.returncode == 0, result.stderr
    printed = [json.loads(line) for line in result.stdout.splitlines()]
    expected = pick_agent(QUERIES[1:3], model=folder)
    assert [p["picked_agent"] for p in printed] == [e["picked_agent"] for e in expected]
    for got, want in zip(printed, expected, strict=True):
        check_result(got, np.array(list(want["logits"].values())))


def test_help_documents_flags_and_exit_codes():
    result = run_tool("route", "--help")
    assert result.returncode == 0
    for flag in (
        "--model",
        "--input",
        "--output",
        "--text-field",
        "--column",
        "--format",
        "--batch-size",
        "--max-batch-tokens",
        "--device",
        "--dtype",
        "--json",
        "Exit codes",
        "130 interrupted",
    ):
        assert flag in result.stdout


@pytest.mark.slow
def test_stdin_input_with_a_blank_line_routes_the_rest_and_exits_1(converted):
    folder, _ = converted[0]
    text = f"{QUERIES[0]}\n\n{QUERIES[1]}\n"
    result = subprocess.run(
        [sys.executable, "-m", "benchgen_router", "route", "--model", str(folder), "--input", "-", "--json"],
        input=text,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1
    assert "line 2: line is empty; skipped" in result.stderr
    assert [json.loads(line)["line"] for line in result.stdout.splitlines()] == [1, 3]


@pytest.mark.slow
def test_default_router_needs_no_model_flag():
    result = run_in_process("route", "What is the derivative of x^3 + 2x?")
    assert result.returncode == 0, result.stderr
    labels = json.loads((default_router_dir() / "config.json").read_text())["id2label"].values()
    assert result.stdout.strip() in labels


# ---------------------------------------------------------------------------------------------
# Command line, files (in-process: one router load for all of them)


def file_contents(fmt: str, queries: list[str]) -> tuple[str, bytes]:
    if fmt == "jsonl":
        rows = [json.dumps({"task_id": f"t{i}", "prompt": q, "domain": "math"}) for i, q in enumerate(queries)]
        return "queries.jsonl", "\n".join(rows).encode() + b"\n"
    if fmt == "csv":
        rows = ["task_id,prompt,domain", *(f't{i},"{q}",math' for i, q in enumerate(queries))]
        return "queries.csv", "\r\n".join(rows).encode() + b"\r\n"
    return "queries.txt", "\n".join(queries).encode()  # no final newline: the last line still counts


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "text"])
def test_file_in_order_out_in_every_format(converted, tmp_path, fmt, capsys, caplog):
    folder, _ = converted[0]
    caplog.set_level(logging.INFO, logger="benchgen_router")
    name, content = file_contents(fmt, QUERIES)
    code, records = route_file(tmp_path, folder, name, content)
    assert code == 0
    expected = pick_agent(QUERIES, model=folder)
    first_line = 2 if fmt == "csv" else 1  # the CSV header is line 1
    assert [r["line"] for r in records] == list(range(first_line, first_line + len(QUERIES)))
    assert [r.get("id") for r in records] == (
        [f"t{i}" for i in range(len(QUERIES))] if fmt != "text" else [None] * len(QUERIES)
    )
    assert [r["picked_agent"] for r in records] == [e["picked_agent"] for e in expected]
    for record, want in zip(records, expected, strict=True):
        check_result({k: record[k] for k in RESULT_KEYS}, np.array(list(want["logits"].values())))
    # progress bar in queries/s on stderr, then the summary of picks per agent (every agent listed)
    assert "q/s" in capsys.readouterr().err
    assert f"routed {len(QUERIES)} queries" in caplog.text
    counts = Counter(r["picked_agent"] for r in records)
    for agent in AGENTS:
        assert any(
            line.split() == [agent, str(counts[agent]), f"{100 * counts[agent] / len(QUERIES):.1f}%"]
            for line in caplog.messages
        )


@pytest.mark.parametrize("flags", [["--max-batch-tokens", "100"], ["--dtype", "bfloat16", "--allow-emulated-bf16"]])
def test_batching_and_dtype_flags_route_every_query(converted, tmp_path, flags):
    """A tiny packed-batch budget (one row a batch) gives the same picks; bfloat16 keeps them here."""
    folder, _ = converted[0]
    code, records = route_file(tmp_path, folder, "queries.txt", "\n".join(QUERIES).encode(), *flags)
    assert code == 0 and [r["line"] for r in records] == list(range(1, len(QUERIES) + 1))
    expected = [e["picked_agent"] for e in pick_agent(QUERIES, model=folder)]
    same = sum(r["picked_agent"] == e for r, e in zip(records, expected, strict=True))
    assert same == len(QUERIES) if flags[0] == "--max-batch-tokens" else same >= 0.9 * len(QUERIES)


def test_format_flag_and_field_override(converted, tmp_path):
    folder, _ = converted[0]
    rows = [json.dumps({"prompt": "decoy", "body": q, "key": i}) for i, q in enumerate(QUERIES[:3])]
    code, records = route_file(
        tmp_path,
        folder,
        "data.log",
        "\n".join(rows).encode(),
        "--format",
        "jsonl",
        "--text-field",
        "body",
        "--id-field",
        "key",
    )
    assert code == 0
    assert [r["id"] for r in records] == [0, 1, 2]
    assert [r["picked_agent"] for r in records] == [r["picked_agent"] for r in pick_agent(QUERIES[:3], model=folder)]
    tsv = "question\tid\n" + "".join(f"{q}\tq{i}\n" for i, q in enumerate(QUERIES[:2]))
    code, records = route_file(tmp_path, folder, "data.tsv", tsv.encode())
    assert code == 0 and [(r["line"], r["id"]) for r in records] == [(2, "q0"), (3, "q1")]


def test_long_csv_query_is_truncated_and_routed_not_skipped(converted, tmp_path, capsys, caplog):
    """Beyond csv's default 128 KiB field limit; the router keeps its first 1024 tokens."""
    folder, _ = converted[0]
    long_query = " ".join(make_queries(3000, seed=9))
    assert len(long_query) > 131072
    code, records = route_file(tmp_path, folder, "long.csv", f'prompt\n"{long_query}"\nshort one\n'.encode(), "--quiet")
    assert code == 0 and [r["line"] for r in records] == [2, 3]
    assert records[0]["picked_agent"] == pick_agent(long_query, model=folder)["picked_agent"]
    assert "q/s" not in capsys.readouterr().err and not caplog.messages  # --quiet: no progress, no summary


BAD_FILES = {
    "jsonl": (
        b'{"prompt": "Q1"}\n'
        b"\n"  # 2 empty line
        b'{"prompt": "Q3"}\n'
        b"{not json\n"  # 4 bad JSON
        b'["a", "list"]\n'  # 5 not an object
        b'{"question": "no prompt field"}\n'  # 6 no 'prompt'
        b'{"prompt": 42}\n'  # 7 not text
        b'{"prompt": "   "}\n'  # 8 empty query
        b'{"prompt": "caf\xe9 au lait"}\n'  # 9 not UTF-8
        b'{"prompt": "lone \\ud800 escape"}\n'  # 10 not encodable text
        b'{"prompt": "Q11"}\n',
        {
            2: "empty line",
            4: "not valid JSON",
            5: "not a JSON object",
            6: "no 'prompt' field",
            7: "'prompt' is not text (got int)",
            8: "'prompt' is empty",
            9: "not valid UTF-8",
            10: "not valid UTF-8",
        },
        [1, 3, 11],
    ),
    "csv": (
        b"id,prompt,extra\n"
        b'a,"Q2",x\n'
        b"b,,x\n"  # 3 empty query
        b"c\n"  # 4 row too short
        b"\n"  # 5 empty line
        b'd,"a question\nover two lines",x\n'  # 6-7 one record, numbered by its first line
        b"e,\xff\xfe,x\n"  # 8 not UTF-8
        b'f,"Q9",x\n',
        {3: "'prompt' is empty", 4: "no 'prompt' column", 5: "empty line", 8: "not valid UTF-8"},
        [2, 6, 9],
    ),
    "txt": (
        b"Q1\n\nQ3\n   \t\n\xc3\x28 broken\nQ6\n",
        {2: "line is empty", 4: "line is empty", 5: "not valid UTF-8"},
        [1, 3, 6],
    ),
}


@pytest.mark.parametrize("fmt", list(BAD_FILES))
def test_bad_lines_are_reported_by_number_and_skipped(converted, tmp_path, fmt, caplog):
    folder, _ = converted[0]
    caplog.set_level(logging.INFO, logger="benchgen_router")
    content, problems, good = BAD_FILES[fmt]
    code, records = route_file(tmp_path, folder, f"bad.{fmt}", content)
    assert code == 1
    assert [r["line"] for r in records] == good
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == len(problems)
    for number, reason in problems.items():
        assert any(f"line {number}: " in w and reason in w for w in warnings), (number, warnings)
    assert f"skipped {len(problems)} bad lines" in caplog.text
    texts = {1: "Q1", 2: "Q2", 3: "Q3", 6: "a question\nover two lines" if fmt == "csv" else "Q6", 9: "Q9", 11: "Q11"}
    expected = pick_agent([texts[n] for n in good], model=folder)
    assert [r["picked_agent"] for r in records] == [e["picked_agent"] for e in expected]


def test_all_lines_bad_leaves_the_previous_output_alone_and_exits_1(converted, tmp_path):
    folder, _ = converted[0]
    source, out = tmp_path / "blank.txt", tmp_path / "picks.jsonl"
    source.write_bytes(b"\n  \n\t\n")
    out.write_text("previous run\n")
    assert cli("route", "--model", folder, "--input", source, "--output", out) == 1
    assert out.read_text() == "previous run\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blank.txt", "picks.jsonl"]
    out.unlink()  # and with no previous output, none is created
    assert cli("route", "--model", folder, "--input", source, "--output", out) == 1 and not out.exists()


@pytest.mark.parametrize(
    ("name", "content", "extra", "message"),
    [
        ("missing.txt", None, [], "input file not found"),
        ("empty.txt", b"", [], "holds no lines"),
        ("data.json", b'[{"prompt": "hi"}]', [], "convert it to JSON lines"),
        ("data.jsonl", b'{"body": "hi"}\n', [], "none of the usual query fields"),
        ("data.jsonl", b'{"prompt": "hi"}\n', ["--text-field", "body"], "has no field 'body'"),
        ("data.csv", b"a,b\n1,2\n", [], "none of the usual query fields"),
        ("data.csv", b"prompt\nhi\n", ["--id-field", "uid"], "no field 'uid' for --id-field"),
        ("data.txt", b"hi\n", ["--dtype", "int8"], "invalid choice"),
        ("data.txt", b"hi\n", ["--batch-size", "0"], "must be a positive integer"),
        ("data.txt", b"hi\n", ["extra query"], "not both"),
    ],
)
def test_unusable_input_is_exit_2_with_one_line_and_writes_nothing(
    converted, tmp_path, capsys, name, content, extra, message
):
    folder, _ = converted[0]
    source, out = tmp_path / name, tmp_path / "out.jsonl"
    if content is not None:
        source.write_bytes(content)
    assert cli("route", "--model", folder, "--input", source, "--output", out, *extra) == 2
    err = capsys.readouterr().err
    assert message in err
    assert not out.exists()


def test_empty_command_line_query_is_a_usage_error(converted, capsys):
    folder, _ = converted[0]
    assert cli("route", "--model", folder, "What is 2+2?", " ") == 2
    assert "error: query 2 is empty" in capsys.readouterr().err
    assert cli("route", "--model", folder) == 2


def test_unloadable_model_is_exit_2(tmp_path, capsys):
    (tmp_path / "q.txt").write_text("hello\n")
    assert cli("route", "--model", tmp_path / "nowhere", "--input", tmp_path / "q.txt") == 2
    assert f"router folder not found: {tmp_path / 'nowhere'}" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert cli("route", "--model", tmp_path / "empty", "--input", tmp_path / "q.txt") == 2
    assert "holds no config.json, so it is not a router folder" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# Interruption: a real SIGINT to a real run


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "code", "word"), [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]
)
def test_a_signal_mid_run_leaves_the_previous_output_untouched(converted, tmp_path, signum, code, word):
    folder, _ = converted[0]
    source, out = tmp_path / "many.txt", tmp_path / "picks.jsonl"
    source.write_text("\n".join(make_queries(3000, seed=5)) + "\n")
    out.write_text("previous run\n")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchgen_router",
            "route",
            "--model",
            str(folder),
            "--input",
            str(source),
            "--output",
            str(out),
            "--batch-size",
            "4",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ},
        # A shell's background job (nohup, `&`) ignores SIGINT and its children inherit that; the
        # route command's own Ctrl-C handling is what is tested here.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    stderr: list[bytes] = []
    reader = threading.Thread(target=lambda: stderr.extend(iter(lambda: process.stderr.read1(4096), b"")))
    reader.start()
    deadline = time.monotonic() + 120
    while b"routing:" not in b"".join(stderr) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # well inside the routing of 3000 queries, which takes seconds
    assert process.poll() is None, "the run finished before it could be interrupted"
    process.send_signal(signum)
    assert process.wait(timeout=60) == code
    reader.join(timeout=10)
    text = b"".join(stderr).decode(errors="replace")
    assert word in text and "routed" not in text and "Traceback" not in text
    assert out.read_text() == "previous run\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["many.txt", "picks.jsonl"]  # no temporary file left


def test_interrupt_while_writing_leaves_no_partial_file(converted, tmp_path, monkeypatch, capsys):
    """Ctrl-C after some records are written: the half-written temporary file never replaces the output."""
    from benchgen_router import files

    folder, _ = converted[0]
    source, out = tmp_path / "q.txt", tmp_path / "picks.jsonl"
    source.write_text("\n".join(QUERIES) + "\n")
    real_dumps, written = files.to_json, []

    def dumps_then_interrupt(record: dict) -> str:
        if len(written) == 5:
            raise KeyboardInterrupt
        written.append(record)
        return real_dumps(record)

    monkeypatch.setattr(files, "to_json", dumps_then_interrupt)
    assert cli("route", "--model", folder, "--input", source, "--output", out) == 130
    assert len(written) == 5 and "interrupted" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.txt"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--output", "{tmp}"], "is a folder"),
        (["--output", "{tmp}/no/such/folder/out.jsonl"], "does not exist"),
        (["--device", "bogus"], "unknown device 'bogus'"),
    ],
)
def test_bad_output_or_device_fails_before_any_routing(converted, tmp_path, flags, message, capsys):
    folder, _ = converted[0]
    queries = tmp_path / "q.txt"
    queries.write_text("one query\n")
    assert cli("route", "--model", folder, "--input", queries, *[f.format(tmp=tmp_path) for f in flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]
    assert not (tmp_path / "no").exists()  # no folder was created for the typo


# ---------------------------------------------------------------------------------------------
# Hostile paths and lines: nothing lost, nothing half-written, no wrong answer with exit 0


@pytest.mark.parametrize("through_link", [False, True])
def test_the_input_as_output_is_refused_and_the_input_kept(converted, tmp_path, capsys, through_link):
    folder, _ = converted[0]
    source = tmp_path / "q.txt"
    source.write_text("\n".join(QUERIES[:3]) + "\n")
    target = source
    if through_link:
        target = tmp_path / "alias.jsonl"
        target.symlink_to(source)
    assert cli("route", "--model", folder, "--input", source, "--output", target) == 2
    assert "is the input file" in capsys.readouterr().err
    assert source.read_text() == "\n".join(QUERIES[:3]) + "\n"


def test_an_output_link_is_written_through_and_kept(converted, tmp_path):
    folder, _ = converted[0]
    source, real, link = tmp_path / "q.txt", tmp_path / "real.jsonl", tmp_path / "link.jsonl"
    source.write_text("\n".join(QUERIES[:3]) + "\n")
    real.write_text("stale\n")
    link.symlink_to(real)
    assert cli("route", "--model", folder, "--input", source, "--output", link) == 0
    assert link.is_symlink() and [json.loads(line)["line"] for line in real.read_text().splitlines()] == [1, 2, 3]


@pytest.mark.slow
def test_dev_stdout_is_a_stream_not_replaced(converted, tmp_path):
    folder, _ = converted[0]
    source = tmp_path / "q.txt"
    source.write_text("\n".join(QUERIES[:3]) + "\n")
    result = run_tool("route", "--model", folder, "--input", source, "--output", "/dev/stdout", "--quiet")
    assert result.returncode == 0, result.stderr
    assert [json.loads(line)["line"] for line in result.stdout.splitlines()] == [1, 2, 3]
    assert os.path.islink("/dev/stdout")


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["route", "evaluate"])
def test_an_unwritable_output_fails_before_any_work(converted, tmp_path, tool):
    folder, _ = converted[0]
    source = tmp_path / "q.txt"
    source.write_text("one query\n")
    if tool == "route":
        argv = ["route", "--model", folder, "--input", source, "--output", "/sys/kernel/picks.jsonl"]
    else:
        argv = ["evaluate", "--model", folder, "--rewards", source, "--tasks", source, "--output-json", "/sys/x.json"]
    result = run_in_process(*argv)
    assert result.returncode == 2 and "cannot write to /sys" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\u0085"])
def test_a_line_separator_inside_a_query_keeps_it_one_query(converted, tmp_path, separator):
    folder, _ = converted[0]
    rows = [{"id": "a", "prompt": f"first{separator}half"}, {"id": "b", "prompt": "second"}]
    content = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode()
    code, records = route_file(tmp_path, folder, "sep.jsonl", content)
    assert code == 0 and [(r["line"], r["id"]) for r in records] == [(1, "a"), (2, "b")]
    expected = pick_agent([f"first{separator}half", "second"], model=folder)
    assert [r["picked_agent"] for r in records] == [e["picked_agent"] for e in expected]


@pytest.mark.parametrize("bad", ["\u200b", "\ufeff\u2060", "\x01\x02", "\u0301"])
def test_a_line_that_tokenizes_to_nothing_is_skipped_and_the_rest_routed(tmp_path, caplog, capsys, bad):
    """The committed router's BERT tokenizer keeps nothing of these but [CLS] [SEP]."""
    caplog.set_level(logging.INFO, logger="benchgen_router")
    source, out = tmp_path / "q.txt", tmp_path / "out.jsonl"
    source.write_text(f"What is 2 + 2?\n{bad}\nName a prime.\n", encoding="utf-8")
    assert cli("route", "--input", source, "--output", out) == 1
    assert [json.loads(line)["line"] for line in out.read_text().splitlines()] == [1, 3]
    assert any("line 2: query tokenizes to nothing" in message for message in caplog.messages)
    assert cli("route", bad) == 2
    assert "tokenizes to nothing" in capsys.readouterr().err
    assert cli("route", bad, "Name a prime.", bad) == 2
    assert "error: query 1, 3 tokenizes to nothing" in capsys.readouterr().err  # numbered as files are


@pytest.mark.slow
def test_results_stream_out_before_the_whole_file_is_routed(converted, tmp_path):
    """`route --input big.txt | head -1`: the first pick comes while the rest is still being routed."""
    folder, _ = converted[0]
    source = tmp_path / "many.txt"
    source.write_text("\n".join(make_queries(20000, seed=5)) + "\n")
    process = subprocess.Popen(
        [sys.executable, "-m", "benchgen_router", "route", "--model", str(folder), "--input", str(source), "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
    )
    try:
        first = process.stdout.readline()
        assert first.strip().decode() in AGENTS
        assert process.poll() is None, "the whole file was routed before the first line came out"
        process.stdout.close()  # the reader goes away, as `head -1` does
        assert process.wait(timeout=120) in (0, 141)
        assert b"Traceback" not in process.stderr.read()
    finally:
        process.kill()


@pytest.mark.slow
def test_operating_point_flag_routes_with_that_head_and_a_wrong_one_is_exit_2(operating_router, tmp_path):
    folder, _ = operating_router
    result = run_in_process("route", "--model", folder, "--operating-point", "fast", "--json", QUERIES[3])
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert printed == pick_agent(QUERIES[3], model=folder, operating_point="fast")
    assert printed["operating_point"] == "fast"
    queries = tmp_path / "queries.txt"
    queries.write_text("\n".join(QUERIES[:5]) + "\n")
    out = tmp_path / "picks.jsonl"
    wrong = run_in_process("route", "--model", folder, "--operating-point", "cheap", "-i", queries, "-o", out)
    assert wrong.returncode == 2 and not out.exists()
    assert (
        wrong.stderr.strip().splitlines()[-1].endswith("'cheap' is not one of this router's: balanced, fast, quality.")
    )
