"""`benchgen-router collect` as users run it: against real `transformers serve` upstreams on loopback (both
files in the pilot's formats, a SIGKILL mid-run and --resume, SIGTERM and Ctrl-C, a down upstream, a 4xx, the
cost cap, and `train --calls` reading what collect wrote), and bad input as one line with exit 2.

Latencies and generation ids are measured, so runs are compared with those two fields normalised."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchgen_router.graders import grade
from helpers import PROJECT_ROOT, cli, make_queries, run_in_process

pytest_plugins = ["upstream_server"]
httpx = pytest.importorskip("httpx")
PRICES = {"price_per_1m_prompt_usd": 1000.0, "price_per_1m_output_usd": 2000.0}
MEASURED = ("latency_ms", "generation_id")


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_pool(path: Path, entries: list[tuple[str, str, str]]) -> Path:
    """entries: (agent id, base_url, model)."""
    agents = [{"agent_id": agent, "base_url": url, "model": model, **PRICES} for agent, url, model in entries]
    path.write_text(json.dumps({"agents": agents}), encoding="utf-8")
    return path


def journal_of_one_call_and_pools(tmp_path: Path) -> Path:
    """`tmp_path / "journal"`, a traffic journal of one call with its text, and the output folder
    `tmp_path / "out"` holding a pool and a judge pool (of unreachable upstreams), which it returns."""
    from benchgen_router.serving.journal import TrafficJournal

    journal = TrafficJournal(tmp_path / "journal", keep_text=True)
    journal.record_call({"request_id": journal.new_request_id(), "agent": "a", "status": 200}, "Name a river.")
    journal.close()
    out = tmp_path / "out"
    out.mkdir()
    write_pool(out / "pool.json", [("a", "http://127.0.0.1:9/v1", "m-a")])
    write_pool(out / "judge.json", [("judge", "http://127.0.0.1:9/v1", "m-judge")])
    return out


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def normalised(path: Path) -> list[dict]:
    rows = read_rows(path)
    for row in rows:
        for call in row.get("calls", []):
            call.update(dict.fromkeys(MEASURED))
    return rows


def collect_args(folder: Path) -> list[object]:
    return ["--tasks", folder / "tasks.jsonl", "--pool", folder / "pool.json", "--output", folder / "calls.jsonl"]


# ---------------------------------------------------------------------------------------------
# Bad input: one line, exit 2 (fast: no upstream is ever called)


@pytest.fixture
def inputs(tmp_path) -> Path:
    write_jsonl(tmp_path / "tasks.jsonl", [{"task_id": "t", "prompt": "p", "answer": "1", "grader": "numeric_match"}])
    write_pool(tmp_path / "pool.json", [("a", "http://127.0.0.1:9/v1", "m")])
    return tmp_path


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda d: (d / "tasks.jsonl").unlink(), "error: tasks file not found"),
        (lambda d: (d / "pool.json").unlink(), "error: pool file not found"),
        (
            lambda d: write_jsonl(d / "tasks.jsonl", [{"task_id": "t", "prompt": "p", "answer": "1", "grader": "x"}]),
            "unknown grader 'x'",
        ),
        (lambda d: write_jsonl(d / "tasks.jsonl", [{"task_id": "t", "answer": "1"}]), "(t) has no prompt"),
        (lambda d: write_pool(d / "pool.json", [("a", "ftp://host", "m")]), "is not an http(s) URL"),
        (lambda d: (d / "calls.jsonl.journal").write_text("{}\n"), "--resume to continue it, or another --output"),
        (lambda d: (d / "calls.jsonl").write_text(""), "pass another --output"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(inputs, change, expected, capsys):
    change(inputs)
    assert cli("collect", *collect_args(inputs), "--no-progress") == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--repetitions", "0"], "must be a positive integer"),
        (["--max-cost-usd", "-1"], "must be a number >= 0"),
        (["--timeout-s", "0"], "must be a number > 0"),
        (["--concurrency", "many"], "must be a positive integer"),
    ],
)
def test_bad_flags_are_usage_errors(inputs, flags, expected, capsys):
    assert cli("collect", *collect_args(inputs), *flags) == 2
    assert expected in capsys.readouterr().err


@pytest.mark.parametrize(
    ("second_line", "expected"),
    [
        (b'{"task_id": "u", "prompt": "caf\xe9?", "answer": "1", "grader": "numeric_match"}', "line 2 is not UTF-8"),
        (b'{"task_id": "u", "prompt": "\\udc80?", "answer": "1", "grader": "numeric_match"}', "row 2 (u) holds"),
    ],
)
def test_a_tasks_file_that_is_not_utf8_is_refused_before_anything_is_written(inputs, second_line, expected, capsys):
    """A Latin-1 byte, or a lone surrogate written as a JSON escape, has no UTF-8 form to send or hash."""
    first = json.dumps({"task_id": "t", "prompt": "p", "answer": "1", "grader": "numeric_match"}).encode()
    (inputs / "tasks.jsonl").write_bytes(first + b"\n" + second_line + b"\n")
    assert cli("collect", *collect_args(inputs), "--no-progress") == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1, err
    assert sorted(path.name for path in inputs.iterdir()) == ["pool.json", "tasks.jsonl"]  # no journal, no output


@pytest.mark.parametrize(
    ("encoding", "expected"),
    [
        ("utf-16", "is UTF-16 (it starts with a UTF-16 byte-order mark), not UTF-8; save it as UTF-8"),
        ("utf-16-be", "is UTF-16 (it starts with a UTF-16 byte-order mark), not UTF-8; save it as UTF-8"),
        ("utf-32", "is UTF-32 (it starts with a UTF-32 byte-order mark), not UTF-8; save it as UTF-8"),
    ],
)
def test_a_tasks_file_with_a_byte_order_mark_is_named_for_what_it_is(inputs, encoding, expected, capsys):
    """Windows editors save UTF-16 with a byte-order mark as "Unicode": the line says which encoding the file
    is in and how to save it, not that its first line is not valid JSON. (UTF-8 with a mark is read.)"""
    text = json.dumps({"task_id": "t", "prompt": "p", "answer": "1", "grader": "numeric_match"}) + "\n"
    data = text.encode(encoding)
    if encoding == "utf-16-be":
        data = b"\xfe\xff" + data  # Python's utf-16-be writes no mark; an editor saving big-endian does
    (inputs / "tasks.jsonl").write_bytes(data)
    assert cli("collect", *collect_args(inputs), "--no-progress") == 2
    err = capsys.readouterr().err
    assert expected in err and "not valid JSON" not in err and len(err.strip().splitlines()) == 1, err
    assert str(inputs / "tasks.jsonl") in err
    assert sorted(path.name for path in inputs.iterdir()) == ["pool.json", "tasks.jsonl"]


def test_an_unset_key_variable_is_named(inputs, capsys):
    document = json.loads((inputs / "pool.json").read_text())
    document["agents"][0]["api_key_env"] = "COLLECT_CLI_TEST_UNSET"
    (inputs / "pool.json").write_text(json.dumps(document))
    assert cli("collect", *collect_args(inputs)) == 2
    assert "COLLECT_CLI_TEST_UNSET (its api_key_env) is not set" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# Against real upstreams


@pytest.fixture(scope="module")
def servers(make_upstreams):
    return make_upstreams(3)


def answers_of(server, prompts: list[str]) -> list[str]:
    """What the server answers each prompt (greedy: the same every time)."""
    with httpx.Client(timeout=60, trust_env=False) as http:
        return [
            http.post(f"{server.base_url}/chat/completions", json=server.chat_body(prompt)).json()["choices"][0][
                "message"
            ]["content"]
            for prompt in prompts
        ]


@pytest.fixture(scope="module")
def task_rows(servers) -> list[dict]:
    """Tasks whose answer keys are what agent a0 answers: a0 is always right, the others rarely."""
    prompts = make_queries(12, seed=5)
    rows = []
    for i, (prompt, content) in enumerate(zip(prompts, answers_of(servers[0], prompts), strict=True)):
        extracted = grade("numeric_match", content, "0").extracted if i % 2 == 0 else None
        # a numeric key only where a0's answer reads as one value: an answer naming several is a hedge, graded wrong
        numeric = bool(extracted) and grade("numeric_match", content, extracted).correct
        rows.append(
            {
                "task_id": f"t{i:02d}",
                "prompt": prompt,
                "answer": extracted if numeric else content,
                "grader": "numeric_match" if numeric else "exact_match_ci",
                "split": "test" if i >= 9 else "train",
                "domain": "toy",
                "difficulty": "easy",
                "source": {"dataset": "tiny/chat"},
            }
        )
    return rows


def setup_folder(folder: Path, task_rows: list[dict], entries: list[tuple[str, str, str]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    write_jsonl(folder / "tasks.jsonl", task_rows)
    write_pool(folder / "pool.json", entries)
    return folder


def pool_entries(servers) -> list[tuple[str, str, str]]:
    return [(f"a{i}", server.base_url, server.model) for i, server in enumerate(servers)]


@pytest.fixture(scope="module")
def full_run(servers, task_rows, tmp_path_factory):
    """An uninterrupted run: 12 tasks x 3 agents x 2 repetitions."""
    folder = setup_folder(tmp_path_factory.mktemp("full"), task_rows, pool_entries(servers))
    result = run_in_process("collect", *collect_args(folder), "--repetitions", "2", "--no-progress")
    assert result.returncode == 0, result.stderr
    return folder, result


@pytest.mark.slow
def test_a_run_writes_both_files_in_the_pilot_formats(full_run, task_rows):
    folder, result = full_run
    assert "collect: 72 calls made, 0 reused, 0 failed" in result.stdout
    assert "wrote 12 of 12 tasks" in result.stdout and "calls/s" in result.stdout
    calls, rewards = read_rows(folder / "calls.jsonl"), read_rows(folder / "calls.rewards.jsonl")
    assert [row["task_id"] for row in calls] == [row["task_id"] for row in rewards] == [t["task_id"] for t in task_rows]
    pilot_row_keys = ["agent_order", "best_agents", "calls", "is_tie", "mean_reward", "pool_version", "repetitions"]
    pilot_call_keys = ["agent", "completion_tokens", "correct", "cost_usd", "empty", "error", "extracted"]
    pilot_call_keys += ["generation_id", "latency_ms", "prompt_tokens", "raw_response", "repetition", "role"]
    published_keys = ["agent_order", "best_agents", "dataset", "difficulty", "domain", "is_tie", "mean_reward"]
    published_keys += ["n_correct", "n_empty", "n_error", "pool_version", "repetitions", "split", "task_group"]
    for row, published, task in zip(calls, rewards, task_rows, strict=True):
        assert list(row) == [*pilot_row_keys, "task_id"] and list(published) == [*published_keys, "task_id"]
        assert row["agent_order"] == ["a0", "a1", "a2"] and row["repetitions"] == 2
        assert [(c["agent"], c["repetition"]) for c in row["calls"]] == [
            (a, r) for a in row["agent_order"] for r in (0, 1)
        ]
        for call in row["calls"]:
            assert list(call) == pilot_call_keys and call["error"] is None and call["role"] is None
            assert isinstance(call["latency_ms"], int) and isinstance(call["generation_id"], str)
            assert call["cost_usd"] == pytest.approx(
                (call["prompt_tokens"] * 1000.0 + call["completion_tokens"] * 2000.0) / 1e6
            )
            graded = grade(task["grader"], call["raw_response"], task["answer"])
            assert (call["extracted"], call["correct"]) == (graded.extracted, graded.correct)
        assert row["mean_reward"][0] == 1.0 and "a0" in row["best_agents"]  # the answer keys are a0's answers
        assert row["is_tie"] == (len(row["best_agents"]) > 1)
        assert published["mean_reward"] == row["mean_reward"] and published["best_agents"] == row["best_agents"]
        assert published["n_correct"] == [
            sum(c["correct"] for c in row["calls"] if c["agent"] == a) for a in row["agent_order"]
        ]
        assert (published["split"], published["dataset"], published["domain"]) == (task["split"], "tiny/chat", "toy")
        assert published["n_error"] == [0, 0, 0] and published["task_group"] is None
    assert len({row["pool_version"] for row in calls + rewards}) == 1


def wait_for_journal_lines(path: Path, count: int, process: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_bytes().count(b"\n") >= count:
            return
        assert process.poll() is None, process.communicate()
        time.sleep(0.005)
    raise AssertionError(f"{path} never had {count} lines")


def start_collect(folder: Path, *extra: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "benchgen_router", "collect", *map(str, collect_args(folder)), *extra]
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
        start_new_session=True,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("how", "code"),
    [(signal.SIGKILL, -signal.SIGKILL), (signal.SIGTERM, 143), (signal.SIGINT, 130)],
    ids=["SIGKILL", "SIGTERM", "SIGINT"],
)
def test_a_stopped_run_resumed_gives_the_files_of_an_uninterrupted_one(
    full_run, servers, task_rows, tmp_path, how, code
):
    reference, _ = full_run
    folder = setup_folder(tmp_path, task_rows, pool_entries(servers))
    process = start_collect(folder, "--repetitions", "2", "--no-progress", "--concurrency", "1")
    wait_for_journal_lines(folder / "calls.jsonl.journal", 1 + 8, process)  # the header and 8 cells
    os.kill(process.pid, how)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == code, stderr
    journaled = (folder / "calls.jsonl.journal").read_bytes().count(b"\n") - 1
    assert 8 <= journaled < 72
    if how == signal.SIGKILL:
        assert not (folder / "calls.jsonl").exists()  # nothing but the journal survives a SIGKILL
    else:  # a stop writes the complete tasks (6 cells each) and says how to go on
        assert (
            len(read_rows(folder / "calls.jsonl")) == journaled // 6
            and "resume it (--resume) to ask only the rest" in stderr
        )

    refused = run_in_process("collect", *collect_args(folder), "--repetitions", "2", "--no-progress")
    assert refused.returncode == 2 and "pass --resume to continue it" in refused.stderr
    resumed = run_in_process("collect", *collect_args(folder), "--repetitions", "2", "--no-progress", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    made = int(resumed.stdout.split(" calls made")[0].split()[-1])
    reused = int(resumed.stdout.split(" reused")[0].split()[-1])
    assert reused >= journaled and made + reused == 72
    for name in ("calls.jsonl", "calls.rewards.jsonl"):
        assert normalised(folder / name) == normalised(reference / name), name


@pytest.mark.slow
def test_a_down_upstream_and_a_misnamed_model_are_recorded_errors(servers, task_rows, tmp_path, down_upstream_url):
    entries = [("up", servers[0].base_url, servers[0].model), ("down", down_upstream_url, "m")]
    entries.append(("misnamed", servers[1].base_url, "not-the-pinned-model"))
    folder = setup_folder(tmp_path, task_rows[:2], entries)
    result = run_in_process("collect", *collect_args(folder), "--repetitions", "1", "--retries", "1", "--no-progress")
    assert result.returncode == 0, result.stderr
    assert "4 failed" in result.stdout and "4 calls failed after their retries" in result.stderr
    for row in read_rows(folder / "calls.rewards.jsonl"):
        assert row["n_error"] == [0, 1, 1] and row["mean_reward"][1:] == [0.0, 0.0]
    calls = {call["agent"]: call for call in read_rows(folder / "calls.jsonl")[0]["calls"]}
    assert calls["up"]["error"] is None
    assert calls["down"]["error"].startswith("ConnectError") and calls["down"]["error"].endswith("(after 2 attempts)")
    assert calls["misnamed"]["error"].startswith("HTTP 400: ") and "attempts" not in calls["misnamed"]["error"]
    assert calls["down"]["raw_response"] is None and calls["down"]["cost_usd"] == 0.0


@pytest.mark.slow
def test_the_cost_cap_stops_early_with_exit_1(servers, task_rows, tmp_path):
    folder = setup_folder(tmp_path, task_rows, pool_entries(servers))
    args = [*collect_args(folder), "--repetitions", "1", "--max-cost-usd", "0.5", "--no-progress"]
    result = run_in_process("collect", *args)
    assert result.returncode == 1, result.stderr
    assert "warning: stopped at --max-cost-usd 0.5" in result.stderr and "--resume with a higher cap" in result.stderr
    journal = [json.loads(line)["call"] for line in (folder / "calls.jsonl.journal").read_text().splitlines()[1:]]
    spent = sum(call["cost_usd"] for call in journal)
    # The reserve is each agent's mean cost so far: a call dearer than its agent's mean can pass the cap by
    # the difference, never by more than one call's cost.
    assert 0 < len(journal) < 36 and spent <= 0.5 + max(call["cost_usd"] for call in journal)
    assert f"{spent:.4f} USD" in result.stdout
    assert len(read_rows(folder / "calls.jsonl")) == len(read_rows(folder / "calls.rewards.jsonl")) <= len(journal) // 3
    finished = run_in_process("collect", *args[:-3], "--max-cost-usd", "100", "--no-progress", "--resume")
    assert finished.returncode == 0 and len(read_rows(folder / "calls.jsonl")) == 12, finished.stderr


@pytest.mark.slow
def test_train_reads_what_collect_wrote(full_run, backbone_dir, tmp_path):
    folder, _ = full_run
    result = run_in_process(
        "train",
        "--rewards", folder / "calls.rewards.jsonl", "--tasks", folder / "tasks.jsonl",
        "--calls", folder / "calls.jsonl", "--pool", folder / "pool.json",
        "--backbone", backbone_dir, "--generations", "3", "--cv-folds", "2", "--cv-repeats", "1",
        "--no-ood-guard", "--no-progress", "--no-cache", "--output-dir", tmp_path / "run",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["agent_order"] == ["a0", "a1", "a2"] and manifest["n_total"] == 12 and manifest["n_test"] == 3


# ---------------------------------------------------------------------------------------------
# Against a scripted loopback upstream: two runs on one output, a full disk


def scripted_folder(folder: Path, base_url: str, tasks: int) -> Path:
    from test_collect import write_pool as write_toy_pool
    from test_collect import write_tasks

    folder.mkdir(parents=True, exist_ok=True)
    write_tasks(folder / "tasks.jsonl", count=tasks)
    write_toy_pool(folder / "pool.json", {"a": base_url, "b": base_url})
    return folder


def test_two_resumed_runs_on_one_output_do_not_both_ask(tmp_path):
    """Two `collect --resume` on one output, started 0.5 s apart: one asks every missing cell once, the
    other is refused with one line naming the holder, exit 75, having asked nothing."""
    from test_collect import OK_BODY, Scripted

    with Scripted([(200, {}, OK_BODY)], delay_s=0.2) as server:
        folder = scripted_folder(tmp_path, server.base_url, tasks=4)
        first = ["--repetitions", "2", "--no-progress", "--concurrency", "1"]
        assert run_in_process("collect", *collect_args(folder), *first, "--limit", "1").returncode == 0
        assert len(server.requests) == 4  # task t0: 2 agents x 2 repetitions
        runs = [start_collect(folder, *first, "--resume")]
        time.sleep(0.5)
        runs.append(start_collect(folder, *first, "--resume"))
        outcomes = [(run, *run.communicate(timeout=120)) for run in runs]
    codes = sorted(run.returncode for run, _, _ in outcomes)
    assert codes == [0, 75], outcomes
    (winner, _, _), (_, _, refused) = sorted(outcomes, key=lambda outcome: outcome[0].returncode)
    assert len(refused.strip().splitlines()) == 1 and f"in use by another collect run (pid {winner.pid} on " in refused
    assert len(server.requests) == 16  # every cell asked once: 4 before, 12 by the run that held the journal
    cells = [json.loads(line)["call"] for line in (folder / "calls.jsonl.journal").read_text().splitlines()[1:]]
    assert len(cells) == 16 and not (folder / "calls.jsonl.journal.lock").exists()


def limit_file_size(max_bytes: int):
    """A preexec_fn: writes past `max_bytes` fail with EFBIG (SIGXFSZ ignored, as a shell does not)."""

    def apply() -> None:
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))

    return apply


@pytest.fixture(params=["tmpfs", "file size limit"])
def small_disk(request, tmp_path):
    """(folder for the output, preexec_fn for the run, a way to give it room): a 64 KiB tmpfs, which the
    journal fills (ENOSPC; root only), or a 16 KiB limit on the size of any file the run writes (EFBIG)."""
    if request.param == "file size limit":
        yield tmp_path / "out", limit_file_size(16_384), lambda: None
        return
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root; the file size limit case runs instead")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount / "out", None, lambda: subprocess.run(["mount", "-o", "remount,size=4m", str(mount)], check=True)
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_after_calls_exits_74_and_resume_continues(tmp_path, small_disk):
    from test_collect import OK_BODY, Scripted

    out, preexec, make_room = small_disk
    padded = {
        **OK_BODY,
        "choices": [{**OK_BODY["choices"][0], "message": {"role": "assistant", "content": "x" * 1500 + "\nAnswer: 2"}}],
    }
    with Scripted([(200, {}, padded)]) as server:
        inputs = scripted_folder(tmp_path / "inputs", server.base_url, tasks=20)  # 80 cells, ~1.7 KB a line
        out.mkdir()
        args = ["--tasks", inputs / "tasks.jsonl", "--pool", inputs / "pool.json", "--output", out / "calls.jsonl"]
        args += ["--repetitions", "2", "--no-progress", "--concurrency", "2"]
        command = [sys.executable, "-m", "benchgen_router", "collect", *map(str, args)]
        env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
        full = subprocess.run(command, capture_output=True, text=True, env=env, preexec_fn=preexec, timeout=300)
        asked = len(server.requests)
        assert full.returncode == 74, full.stderr
        errors = [line for line in full.stderr.splitlines() if line.startswith("error:")]
        assert 0 < asked < 80 and len(errors) == 1 and errors == full.stderr.strip().splitlines()[-1:], full.stderr
        journaled = (out / "calls.jsonl.journal").read_bytes().count(b"\n") - 1  # whole lines: a torn one is dropped
        assert f"after {journaled} calls this run; the journal keeps every finished call" in errors[0]
        assert "free space, then rerun with --resume to continue" in errors[0]
        make_room()
        resumed = subprocess.run([*command, "--resume"], capture_output=True, text=True, env=env, timeout=300)
        assert resumed.returncode == 0, resumed.stderr
    assert len(server.requests) - asked == 80 - journaled  # only what the journal lacked was asked again
    assert len((out / "calls.jsonl").read_text().splitlines()) == 20


def test_a_disk_full_before_any_call_leaves_no_journal(inputs):
    """The journal's first line cannot be written: nothing was asked, so exit 2, and no half-made
    journal is left to demand --resume."""
    command = [sys.executable, "-m", "benchgen_router", "collect", *map(str, collect_args(inputs)), "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, preexec_fn=limit_file_size(64), timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("error: cannot write journal ")
    assert sorted(path.name for path in inputs.iterdir()) == ["pool.json", "tasks.jsonl"]


# ---------------------------------------------------------------------------------------------
# From the gateway's traffic journal


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ([], "error: pass --tasks FILE, or --from-journal DIR --sample N to take the prompts from a journal."),
        (["--sample", "3"], "error: --sample takes prompts from a journal: pass --from-journal DIR with it."),
        (["--from-journal", "J"], "error: --from-journal needs --sample N: how many distinct prompts to take."),
        (
            ["--from-journal", "J", "--sample", "3"],
            "error: prompts from --from-journal have no reference answer: pass --judge or --judge-pool to have a "
            "judge rate the answers.",
        ),
    ],
)
def test_journal_flags_that_cannot_work_are_one_line(inputs, flags, expected, capsys):
    flags = [inputs / "journal" if flag == "J" else flag for flag in flags]
    code = cli("collect", "--pool", inputs / "pool.json", "--output", inputs / "calls.jsonl", *flags)
    assert code == 2 and capsys.readouterr().err.strip().splitlines() == [expected]
    assert not (inputs / "calls.tasks.jsonl").exists()


def test_collect_from_a_journal_as_users_run_it(tmp_path, capsys, caplog):
    from benchgen_router.serving.journal import TrafficJournal
    from upstream_server import ReplayUpstream

    journal = TrafficJournal(tmp_path / "journal", keep_text=True)
    served = {"a": "Name a river.", "b": "Name a mountain."}
    ids = {}
    for agent, text in served.items():
        ids[agent] = journal.new_request_id()
        journal.record_call({"request_id": ids[agent], "agent": agent, "status": 200}, text)
    journal.record_feedback(ids["b"], 1.0, "spot on")
    journal.close()
    (path,) = (tmp_path / "journal").glob("calls-*.jsonl")
    with path.open("a") as file:
        file.write('{"kind": "call", "text": "cut sho')  # the gateway died in the middle of a line

    def rate(body: dict) -> str:
        return "Rating: [[9]]" if "Nile" in body["messages"][-1]["content"] else "Rating: [[2]]"

    with (
        ReplayUpstream(lambda body: {"m-a": "The Nile.", "m-b": "Hmm."}[body["model"]]) as agents,
        ReplayUpstream(rate) as judge,
    ):
        write_pool(tmp_path / "pool.json", [("a", agents.base_url, "m-a"), ("b", agents.base_url, "m-b")])
        write_pool(tmp_path / "judge.json", [("judge", judge.base_url, "m-judge")])
        code = cli(
            "collect", "--from-journal", tmp_path / "journal", "--sample", "5", "--seed", "1",
            "--pool", tmp_path / "pool.json", "--judge-pool", tmp_path / "judge.json", "--repetitions", "1",
            "--output", tmp_path / "calls.jsonl", "--no-progress",
        )  # fmt: skip
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[0] == (
        f"journal: 2 calls, 0 without text, 2 distinct prompts; sampled 2 (a 1, b 1; 1 with feedback) into "
        f"{tmp_path / 'calls.tasks.jsonl'}"
    )
    assert out[-1] == f"wrote 2 of 2 tasks to {tmp_path / 'calls.jsonl'} and {tmp_path / 'calls.rewards.jsonl'}"
    assert sum("unfinished" in record.getMessage() for record in caplog.records) == 1
    tasks = {row["task_id"]: row["prompt"] for row in read_rows(tmp_path / "calls.tasks.jsonl")}
    rows = {tasks[row["task_id"]]: row for row in read_rows(tmp_path / "calls.rewards.jsonl")}
    # every agent answers both prompts: a's "The Nile." is rated 9, b's "Hmm." 2; the user scored b's answer 1
    assert rows["Name a river."]["mean_reward"] == rows["Name a mountain."]["mean_reward"] == [0.9, 0.2]
    assert rows["Name a river."]["feedback_reward"] == [0.9, 0.2]
    assert rows["Name a mountain."]["feedback_reward"] == [0.9, 1.0]
    assert rows["Name a mountain."]["n_feedback"] == [0, 1]
    assert "spot on" not in (tmp_path / "calls.tasks.jsonl").read_text()  # a comment is never a task's


def test_a_from_journal_run_refused_by_another_run_touches_nothing(tmp_path, capsys):
    """While a run holds the output's journal, a second `collect --from-journal --resume` on that output
    exits 75 having created, replaced and removed nothing: it sampled the journal into calls.tasks.jsonl
    first, then, refused, removed that file, which the run holding the journal had sampled and was
    using. The folder's modification time shows any file made, renamed over or removed in it."""
    from benchgen_router.collect.journal import JournalLock

    out = journal_of_one_call_and_pools(tmp_path)
    holder = JournalLock(out / "calls.jsonl.journal").acquire()  # as the run that holds the output would
    try:
        before = sorted(path.name for path in out.iterdir())
        os.utime(out, ns=(1_000_000_000, 1_000_000_000))
        code = cli(
            "collect", "--from-journal", tmp_path / "journal", "--sample", "1", "--resume",
            "--pool", out / "pool.json", "--judge-pool", out / "judge.json", "--output", out / "calls.jsonl",
            "--no-progress",
        )  # fmt: skip
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 75 and len(err) == 1 and "is in use by another collect run" in err[0], err
        assert sorted(path.name for path in out.iterdir()) == before
        assert out.stat().st_mtime_ns == 1_000_000_000  # nothing was created, renamed or removed in it
    finally:
        holder.release()
