"""collect (the library): the pilot's two formats recomputed byte for byte from the pilot's own calls, the
journal and resuming (with an in-process asker standing in for the upstreams), the cost cap, and the retries
against real HTTP servers on loopback (a scripted stdlib server, a refused port, a stalled one). Everything
here is fast; the runs against `transformers serve` are in test_cli_collect.py."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import json
import os
import random
import re
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from benchgen_router.collect import Answer, CollectConfig, calls_row, collect, rewards_row, tally
from benchgen_router.collect.asking import STOPPED_AT_COST_CAP
from benchgen_router.collect.chat import RetryPolicy, retry_after_seconds
from benchgen_router.collect.formats import CALL_FIELDS, dump_row, task_from_row
from benchgen_router.collect.grading import Graders
from benchgen_router.collect.outputs import call_record
from benchgen_router.errors import InputError, Terminated, raise_terminated
from benchgen_router.upstreams import Upstream
from helpers import NO_PILOT, PILOT
from upstream_server import MisbehavingUpstream
from upstream_server import Scripted as Reply

pytest_plugins = ["upstream_server"]
needs_pilot = pytest.mark.skipif(not (PILOT / "rewards.v1-pilot.jsonl").exists(), reason=NO_PILOT)
needs_httpx = pytest.mark.skipif(importlib.util.find_spec("httpx") is None, reason="httpx (the collect extra) missing")
AGENTS = ["a", "b", "c"]
PRICES = {"price_per_1m_prompt_usd": 1000.0, "price_per_1m_output_usd": 1000.0}  # 10 + 10 tokens: 0.02 USD


def pilot_lines(name: str) -> list[str]:
    return (PILOT / name).read_text(encoding="utf-8").splitlines(keepends=True)


def write_tasks(path: Path, count: int = 4, **extra: object) -> Path:
    rows = [
        {"task_id": f"t{i}", "prompt": f"What is {i} + {i}?", "answer": str(2 * i), "grader": "numeric_match"}
        | {"split": "train", "domain": "math", "difficulty": "easy", "source": {"dataset": "toy"}}
        | extra
        for i in range(count)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_pool(path: Path, urls: dict[str, str] | None = None, **extra: object) -> Path:
    urls = urls or {agent: "http://127.0.0.1:9/v1" for agent in AGENTS}
    agents = [
        {"agent_id": agent, "base_url": url, "model": f"m-{agent}", **PRICES, **extra} for agent, url in urls.items()
    ]
    path.write_text(json.dumps({"agents": agents}), encoding="utf-8")
    return path


def config(tmp_path: Path, **overrides: object) -> CollectConfig:
    """Settings for a run in `tmp_path` (made if missing), with the toy tasks and pool unless written there."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    settings = {
        "tasks": tmp_path / "tasks.jsonl",
        "pool": tmp_path / "pool.json",
        "output": tmp_path / "calls.jsonl",
        "repetitions": 2,
        "backoff_s": 0.01,
    }
    if not settings["tasks"].exists():
        write_tasks(settings["tasks"])
    if not settings["pool"].exists():
        write_pool(settings["pool"])
    return CollectConfig(**{**settings, **overrides})


class FakeAsker:
    """Answers in-process: agent 'a' always right, 'b' right on even tasks, 'c' empty; 10 + 10 tokens each.
    `stop_after` raises `stop` on that call (a crash); `seen` records every call asked."""

    def __init__(self, stop_after: int | None = None, stop: type[BaseException] = RuntimeError) -> None:
        self.seen: list[tuple[str, str]] = []
        self.stop_after, self.stop = stop_after, stop

    async def __call__(self, upstream: Upstream, prompt: str) -> Answer:
        if self.stop_after is not None and len(self.seen) >= self.stop_after:
            raise self.stop("crash")
        self.seen.append((upstream.agent, prompt))
        i = int(prompt.split()[2])
        right = {"a": True, "b": i % 2 == 0, "c": False}[upstream.agent]
        content = "" if upstream.agent == "c" else f"Answer: {2 * i if right else 2 * i + 1}"
        usage = {"prompt_tokens": 10, "completion_tokens": 10}
        return Answer(content, usage, f"gen-{upstream.agent}-{i}", 5)


def files(cfg: CollectConfig) -> tuple[str, str]:
    return Path(cfg.output).read_text(encoding="utf-8"), cfg.rewards_path.read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# The formats, against the pilot's own rows


@needs_pilot
def test_calls_rows_recomputed_from_the_pilot_calls_are_the_pilot_rows_byte_for_byte():
    for line in pilot_lines("rewards.v1-pilot.jsonl"):
        row = json.loads(line)
        calls = list(row["calls"])
        random.Random(0).shuffle(calls)  # the order they finished in: the row sorts them
        rebuilt = calls_row(row["task_id"], row["agent_order"], calls, row["repetitions"], row["pool_version"])
        assert dump_row(rebuilt) == line, row["task_id"]


@needs_pilot
def test_published_rewards_rows_recomputed_from_the_pilot_calls_are_byte_for_byte():
    raw = {row["task_id"]: row for row in map(json.loads, pilot_lines("rewards.v1-pilot.jsonl"))}
    tasks = {row["task_id"]: row for row in map(json.loads, pilot_lines("tasks.v1.jsonl"))}
    published = pilot_lines("rewards.jsonl")
    for line in published:
        task_id = json.loads(line)["task_id"]
        task = task_from_row(tasks[task_id], "pilot task")
        assert dump_row(rewards_row(raw[task_id], task)) == line, task_id
    assert len(published) == 46


@needs_pilot
def test_the_pilot_call_fields_are_the_ones_collect_records():
    row = json.loads(pilot_lines("rewards.v1-pilot.jsonl")[0])
    assert tuple(row["calls"][0]) == CALL_FIELDS
    upstream = Upstream("a", "m", "http://127.0.0.1:9/v1", price_per_1m_prompt_usd=1.0, price_per_1m_output_usd=2.0)
    task = task_from_row({"task_id": "t", "prompt": "p", "answer": "16", "grader": "numeric_match"}, "task")
    graders = Graders("value", workers=1)
    answered = call_record(
        upstream, 1, Answer("Answer: 16", {"prompt_tokens": 3, "completion_tokens": 2}, "g", 7), task, graders
    )
    assert tuple(answered) == CALL_FIELDS
    assert answered | {"cost_usd": None} == {
        "agent": "a", "completion_tokens": 2, "correct": True, "cost_usd": None, "empty": False, "error": None,
        "extracted": "16", "generation_id": "g", "latency_ms": 7, "prompt_tokens": 3, "raw_response": "Answer: 16",
        "repetition": 1, "role": None,
    }  # fmt: skip
    assert answered["cost_usd"] == pytest.approx((3 * 1.0 + 2 * 2.0) / 1e6)
    failed = call_record(upstream, 0, Answer(None, None, None, 40, "HTTP 503: busy (after 4 attempts)"), task, graders)
    assert failed | {"latency_ms": None} == {
        "agent": "a", "completion_tokens": 0, "correct": False, "cost_usd": 0.0, "empty": False,
        "error": "HTTP 503: busy (after 4 attempts)", "extracted": None, "generation_id": None, "latency_ms": None,
        "prompt_tokens": 0, "raw_response": None, "repetition": 0, "role": None,
    }  # fmt: skip
    empty = call_record(upstream, 0, Answer("", {"prompt_tokens": 3, "completion_tokens": 9}, "g", 7), task, graders)
    assert empty["empty"] is True and empty["correct"] is False and empty["extracted"] is None


def test_errors_and_empty_answers_count_as_wrong_and_all_zero_is_a_tie_of_everyone():
    def call(agent: str, correct: bool, empty: bool = False, error: str | None = None) -> dict:
        return {"agent": agent, "correct": correct, "empty": empty, "error": error}

    figures = tally(["x", "y"], [call("x", True), call("x", False, error="HTTP 500"), call("y", True), call("y", True)])
    assert figures.mean_reward == [0.5, 1.0] and figures.best_agents == ["y"] and not figures.is_tie
    assert figures.n_error == [1, 0] and figures.n_empty == [0, 0] and figures.n_correct == [1, 2]
    nobody = tally(["x", "y"], [call("y", False, empty=True), call("x", False)])
    assert nobody.best_agents == ["x", "y"] and nobody.is_tie and nobody.n_empty == [0, 1]


# ---------------------------------------------------------------------------------------------
# Runs, journal and resume (an in-process asker)


def test_a_run_writes_both_files_and_keeps_its_journal(tmp_path):
    cfg = config(tmp_path)
    asker = FakeAsker()
    result = collect(cfg, ask=asker)
    assert (result.made, result.reused, result.failed, result.tasks_written) == (24, 0, 0, 4)
    assert result.cost_usd == pytest.approx(24 * 0.02) and result.stopped is None
    assert cfg.rewards_path == tmp_path / "calls.rewards.jsonl" and cfg.journal_path.exists()
    calls_text, rewards_text = files(cfg)
    rows = [json.loads(line) for line in calls_text.splitlines()]
    assert [row["task_id"] for row in rows] == ["t0", "t1", "t2", "t3"]
    assert [(c["agent"], c["repetition"]) for c in rows[1]["calls"]] == [(a, r) for a in AGENTS for r in (0, 1)]
    rewards = [json.loads(line) for line in rewards_text.splitlines()]
    assert rewards[1]["mean_reward"] == [1.0, 0.0, 0.0] and rewards[1]["best_agents"] == ["a"]
    assert rewards[0]["best_agents"] == ["a", "b"] and rewards[0]["is_tie"]
    assert rewards[0]["n_empty"] == [0, 0, 2] and rewards[0]["n_correct"] == [2, 2, 0]
    assert {rewards[0][key] for key in ("dataset", "domain", "split", "repetitions")} == {"toy", "math", "train", 2}
    assert rewards[0]["pool_version"].startswith("sha256:")

    again = collect(config(tmp_path, resume=True), ask=FakeAsker())  # nothing left to ask: the same files
    assert (again.made, again.reused) == (0, 24) and files(cfg) == (calls_text, rewards_text)


@pytest.mark.parametrize("stop", [RuntimeError, KeyboardInterrupt])
def test_a_crash_then_resume_asks_only_what_is_missing_and_writes_the_same_files(tmp_path, stop):
    reference = config(tmp_path / "reference")
    collect(reference, ask=FakeAsker())
    cfg = config(tmp_path)
    with pytest.raises(stop):
        collect(cfg, ask=FakeAsker(stop_after=9, stop=stop))
    journaled = len(cfg.journal_path.read_text().splitlines()) - 1
    assert journaled == 9
    if stop is KeyboardInterrupt:  # a stop writes what is done: t0 (6 cells) complete, t1 not
        assert [json.loads(line)["task_id"] for line in files(cfg)[0].splitlines()] == ["t0"]
    resumed = FakeAsker()
    result = collect(config(tmp_path, resume=True), ask=resumed)
    assert (result.made, result.reused) == (24 - 9, 9) and len(resumed.seen) == 15
    assert files(cfg) == files(reference)


def test_sigterm_under_the_command_lines_handler_stops_in_order(tmp_path):
    """The command line makes SIGTERM raise Terminated; during the asking it cancels the calls instead, so
    the run unwinds as for Ctrl-C: the files hold the finished tasks and Terminated comes out, unwrapped."""

    class Killer(FakeAsker):
        async def __call__(self, upstream: Upstream, prompt: str) -> Answer:
            if len(self.seen) == 7:
                os.kill(os.getpid(), signal.SIGTERM)
                await asyncio.sleep(30)  # in flight when the signal lands: cancelled, never journaled
            return await super().__call__(upstream, prompt)

    cfg = config(tmp_path, concurrency=1)
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        with pytest.raises(Terminated):
            collect(cfg, ask=Killer())
        assert signal.getsignal(signal.SIGTERM) is raise_terminated  # the handler is the caller's again
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert len(cfg.journal_path.read_text().splitlines()) == 1 + 7
    assert [json.loads(line)["task_id"] for line in files(cfg)[0].splitlines()] == ["t0"]


def test_a_torn_last_journal_line_is_dropped_and_that_cell_asked_again(tmp_path, caplog):
    cfg = config(tmp_path)
    collect(cfg, ask=FakeAsker())
    before = files(cfg)
    data = cfg.journal_path.read_bytes()
    cfg.journal_path.write_bytes(data[:-20])  # the machine died inside the last write
    resumed = FakeAsker()
    result = collect(config(tmp_path, resume=True), ask=resumed)
    assert result.made == 1 and len(resumed.seen) == 1 and "dropped an unfinished last line" in caplog.text
    assert files(cfg) == before
    assert cfg.journal_path.read_bytes().endswith(b"\n") and len(cfg.journal_path.read_bytes()) == len(data)


def test_more_repetitions_or_tasks_on_resume_ask_only_the_new_cells(tmp_path):
    collect(config(tmp_path, limit=2, repetitions=1), ask=FakeAsker())
    asker = FakeAsker()
    result = collect(config(tmp_path, resume=True), ask=asker)
    assert (result.made, result.reused) == (24 - 6, 6)
    rows = [json.loads(line) for line in files(config(tmp_path))[0].splitlines()]
    assert [row["repetitions"] for row in rows] == [2, 2, 2, 2]


def test_a_corrected_answer_is_regraded_on_resume_but_a_changed_prompt_is_refused(tmp_path):
    cfg = config(tmp_path)
    collect(cfg, ask=FakeAsker())
    write_tasks(cfg.tasks, answer="1")  # every answer key now says 1: nobody is right
    result = collect(config(tmp_path, resume=True), ask=FakeAsker())
    assert result.made == 0
    assert all(row["n_correct"] == [0, 0, 0] for row in map(json.loads, files(cfg)[1].splitlines()))
    write_tasks(cfg.tasks, prompt="What is 1 + 1?")
    with pytest.raises(InputError, match="another prompt than the one journal"):
        collect(config(tmp_path, resume=True), ask=FakeAsker())


def test_resuming_with_the_pilots_string_rule_regrades_math_without_asking_again(tmp_path):
    write_tasks(tmp_path / "tasks.jsonl", grader="math_expression")
    by_value = collect(config(tmp_path), ask=FakeAsker())
    values = [json.loads(row)["n_correct"] for row in files(config(tmp_path))[1].splitlines()]
    by_string = collect(config(tmp_path, resume=True, math_equivalence="string"), ask=FakeAsker())
    strings = [json.loads(row)["n_correct"] for row in files(config(tmp_path))[1].splitlines()]
    assert by_value.made > 0 and by_string.made == 0
    assert any(sum(row) for row in values) and not any(sum(row) for row in strings)  # "Answer: 4" is not "4"


def test_a_run_holding_its_journal_runs_collect_under_it_and_another_thread_is_refused(tmp_path):
    from benchgen_router.collect import JournalInUse
    from benchgen_router.collect.run import holding_journal

    cfg = config(tmp_path)
    refused: list[BaseException] = []

    def other_run() -> None:
        try:
            collect(cfg, ask=FakeAsker())
        except JournalInUse as err:
            refused.append(err)

    with holding_journal(cfg):
        other = threading.Thread(target=other_run)
        other.start()
        other.join()
        assert len(refused) == 1 and not cfg.journal_path.exists()  # refused before anything was written
        assert collect(cfg, ask=FakeAsker()).made == 24  # this thread's run goes on under the lock it holds
    assert not cfg.journal_path.with_name(cfg.journal_path.name + ".lock").exists()


def test_an_existing_journal_or_output_is_refused_without_resume(tmp_path):
    collect(config(tmp_path), ask=FakeAsker())
    with pytest.raises(InputError) as error:
        collect(config(tmp_path), ask=FakeAsker())
    assert "exists" in str(error.value) and "resume" in str(error.value)
    assert "--resume" in error.value.for_command_line() and "--output" in error.value.for_command_line()
    config(tmp_path).journal_path.unlink()
    with pytest.raises(InputError, match=r"no journal .* to resume from"):
        collect(config(tmp_path, resume=True), ask=FakeAsker())


def test_resuming_with_another_pool_is_refused(tmp_path):
    collect(config(tmp_path), ask=FakeAsker())
    write_pool(tmp_path / "pool.json", {"a": "http://127.0.0.1:9/v1", "b": "http://127.0.0.1:9/v1"})
    with pytest.raises(InputError, match="was recorded with pool_version"):
        collect(config(tmp_path, resume=True), ask=FakeAsker())


def test_the_cost_cap_stops_launching_before_the_spend_would_pass_it(tmp_path):
    cfg = config(tmp_path, max_cost_usd=0.25, concurrency=3)  # 0.02 USD a call: at most 12 calls
    result = collect(cfg, ask=FakeAsker())
    assert result.stopped == STOPPED_AT_COST_CAP and result.total_cost_usd <= 0.25
    # 12 calls when none was in flight as the 13th was weighed, 11 when one was (its reservation counts)
    assert result.made in (11, 12) and result.tasks_written == result.made // 6  # t0 (and t1) complete
    assert len(files(cfg)[0].splitlines()) == result.made // 6 == len(files(cfg)[1].splitlines())
    # The cap covers the journal: resuming under the same cap asks only what still fits (nothing after 12
    # calls; after 11, one more: 0.22 + 0.02 <= 0.25), a higher one finishes.
    again = collect(config(tmp_path, max_cost_usd=0.25, resume=True), ask=FakeAsker())
    assert again.made == 12 - result.made and again.total_cost_usd <= 0.25
    final = collect(config(tmp_path, max_cost_usd=1.0, resume=True), ask=FakeAsker())
    assert final.stopped is None and final.tasks_written == 4
    assert collect(config(tmp_path / "zero", max_cost_usd=0), ask=FakeAsker()).made == 0


# ---------------------------------------------------------------------------------------------
# Bad input: one line, before any call


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"task_id": "x", "answer": "1", "grader": "numeric_match"}, "(x) has no prompt"),
        ({"task_id": "x", "prompt": "p", "grader": "numeric_match"}, "(x) has no answer"),
        ({"task_id": "x", "prompt": "p", "answer": "1"}, "(x) has no grader"),
        ({"task_id": "x", "prompt": "p", "answer": "1", "grader": "regex"}, "unknown grader 'regex'"),
        ({"prompt": "p", "answer": "1", "grader": "numeric_match"}, "row 1 has no task_id"),
    ],
)
def test_a_bad_task_is_one_line(tmp_path, row, message):
    (tmp_path / "tasks.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(InputError, match=re.escape(message)) as error:
        collect(config(tmp_path), ask=FakeAsker())
    assert "\n" not in str(error.value) and not config(tmp_path).journal_path.exists()


def test_pool_problems_are_reported_together(tmp_path):
    document = {"agents": [{"agent_id": "a", "api_key_env": "COLLECT_TEST_UNSET_KEY"}, {"agent_id": "b"}]}
    (tmp_path / "pool.json").write_text(json.dumps(document))
    with pytest.raises(InputError) as error:
        collect(config(tmp_path), ask=FakeAsker())
    lines = str(error.value).splitlines()
    assert any("'a' has no base_url" in line for line in lines) and any("'b' has no base_url" in line for line in lines)
    assert any("COLLECT_TEST_UNSET_KEY" in line for line in lines)


@pytest.mark.parametrize(
    ("setting", "flag"),
    [
        ({"repetitions": 0}, "--repetitions"),
        ({"concurrency": 0}, "--concurrency"),
        ({"timeout_s": 0}, "--timeout-s"),
        ({"max_cost_usd": float("nan")}, "--max-cost-usd"),
        ({"retries": -1}, "--retries"),
    ],
)
def test_bad_settings_name_their_flag(tmp_path, setting, flag):
    with pytest.raises(InputError) as error:
        collect(config(tmp_path, **setting), ask=FakeAsker())
    assert error.value.for_command_line().startswith(flag)


# ---------------------------------------------------------------------------------------------
# Retries, over real HTTP on loopback


OK_BODY = {
    "id": "gen-ok",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Answer: 2"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 10},
}


class Scripted:
    """A real HTTP server on 127.0.0.1 that answers from a script of (status, headers, body), the last
    one repeated (a body may be a function of the request's headers and JSON body), each answer after
    `delay_s`; it records every request's path, body and Authorization header."""

    def __init__(self, script: list[tuple[int, dict, object]], delay_s: float = 0.0) -> None:
        self.script, self.requests = script, []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                owner.requests.append((self.path, body, self.headers.get("authorization")))
                status, headers, answer = owner.script[min(len(owner.requests), len(owner.script)) - 1]
                time.sleep(delay_s)
                if callable(answer):
                    answer = answer(self.headers, body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                for key, value in {"content-type": "application/json", **headers}.items():
                    self.send_header(key, value)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> Scripted:
        # shutdown() waits for the serving loop's next poll: poll often, so a test's teardown is quick
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def one_task(tmp_path) -> Path:
    return write_tasks(tmp_path / "tasks.jsonl", count=2)


def scripted_run(tmp_path: Path, script: list, **overrides: object) -> tuple[Scripted, dict]:
    with Scripted(script) as server:
        write_pool(tmp_path / "pool.json", {"a": server.base_url}, **overrides.pop("pool_extra", {}))
        collect(config(tmp_path, limit=1, repetitions=1, **overrides))
    (row,) = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    return server, row["calls"][0]


@needs_httpx
def test_5xx_and_429_are_retried_honouring_retry_after(tmp_path, one_task):
    script = [(503, {"retry-after": "0"}, {"error": {"message": "busy"}}), (429, {}, {"detail": "slow down"})]
    server, call = scripted_run(tmp_path, [*script, (200, {}, OK_BODY)])
    assert len(server.requests) == 3 and call["error"] is None and call["correct"] is False  # 2 != 0
    assert call["generation_id"] == "gen-ok" and call["cost_usd"] == pytest.approx(0.02)
    path, body, _ = server.requests[0]
    assert path == "/v1/chat/completions"
    assert body == {"model": "m-a", "messages": [{"role": "user", "content": "What is 0 + 0?"}]}


@needs_httpx
def test_an_error_in_a_200_body_is_retried_when_its_code_is(tmp_path, one_task):
    server, call = scripted_run(
        tmp_path, [(200, {}, {"error": {"code": 502, "message": "provider down"}}), (200, {}, OK_BODY)]
    )
    assert len(server.requests) == 2 and call["error"] is None


@needs_httpx
def test_a_4xx_is_not_retried_and_is_recorded_with_max_tokens_sent(tmp_path, one_task):
    server, call = scripted_run(tmp_path, [(400, {}, {"error": {"message": "context too long"}})], max_tokens=7)
    assert len(server.requests) == 1 and server.requests[0][1]["max_tokens"] == 7
    assert call["error"] == "HTTP 400: context too long" and call["raw_response"] is None and call["cost_usd"] == 0.0


@needs_httpx
def test_retries_run_out_into_a_recorded_error(tmp_path, one_task):
    server, call = scripted_run(tmp_path, [(500, {}, {"error": {"message": "oops"}})], retries=2)
    assert len(server.requests) == 3 and call["error"] == "HTTP 500: oops (after 3 attempts)"


@needs_httpx
def test_the_key_is_sent_but_never_written(tmp_path, one_task, monkeypatch):
    key = "sk-collect-test-1234567890"
    monkeypatch.setenv("COLLECT_TEST_KEY", key)
    echo = (401, {}, lambda headers, _: {"error": {"message": f"bad key {headers['authorization']}"}})
    server, call = scripted_run(tmp_path, [echo], pool_extra={"api_key_env": "COLLECT_TEST_KEY"})
    assert server.requests[0][2] == f"Bearer {key}"
    assert call["error"] == "HTTP 401: bad key Bearer ***"
    for name in os.listdir(tmp_path):
        assert key not in (tmp_path / name).read_text(), name


@needs_httpx
def test_a_down_upstream_is_recorded_after_its_retries_and_the_run_completes(tmp_path, one_task, down_upstream_url):
    write_pool(tmp_path / "pool.json", {"a": down_upstream_url, "b": down_upstream_url})
    result = collect(config(tmp_path, retries=2))
    assert result.failed == result.made == 8 and result.tasks_written == 2
    rows = [json.loads(line) for line in config(tmp_path).rewards_path.read_text().splitlines()]
    assert [row["n_error"] for row in rows] == [[2, 2], [2, 2]] and rows[0]["mean_reward"] == [0.0, 0.0]
    call = json.loads(Path(config(tmp_path).output).read_text().splitlines()[0])["calls"][0]
    assert call["error"].startswith("ConnectError") and call["error"].endswith("(after 3 attempts)")


@needs_httpx
def test_a_stalled_upstream_times_out(tmp_path, one_task, stalled_upstream_url):
    write_pool(tmp_path / "pool.json", {"a": stalled_upstream_url})
    result = collect(config(tmp_path, limit=1, repetitions=1, retries=1, timeout_s=0.3))
    call = json.loads(Path(config(tmp_path).output).read_text())["calls"][0]
    assert result.failed == 1 and call["error"] == "timed out (ReadTimeout) (after 2 attempts)"


@needs_httpx
def test_a_hostile_answer_is_graded_beside_the_loop(tmp_path, one_task, monkeypatch):
    """ "The answer" + 100,000 spaces + "is 42" took 8.6 s on the event loop with a quadratic pattern; now
    it is graded in a worker thread."""
    from benchgen_router.collect import asking

    graded_on: list[bool] = []
    original = asking.call_record

    def recording(*args: object) -> dict:
        graded_on.append(threading.current_thread() is threading.main_thread())
        return original(*args)

    monkeypatch.setattr(asking, "call_record", recording)
    hostile = {
        **OK_BODY,
        "choices": [{**OK_BODY["choices"][0], "message": {"content": "The answer" + " " * 100_000 + "is 42"}}],
    }
    _, call = scripted_run(tmp_path, [(200, {}, hostile)])
    assert call["extracted"] == "42" and graded_on == [False]  # its time: test_graders' linear-time tests


@needs_httpx
def test_a_math_answer_math_verify_cannot_finish_holds_up_no_other_call(tmp_path, capsys, caplog):
    """`\\boxed{9^{9^{9^{9}}}}` took 5 s of math-verify on the event loop, and every call in flight waited
    for it: here b's answer, ready after 0.3 s, was read 5 s late. The answer is graded in a worker process
    within GRADE_TIME_LIMIT_S, graded wrong when past it, counted in the summary, and not graded again when
    the files are written."""
    from benchgen_router.collect.grading import GRADE_TIME_LIMIT_S
    from helpers import cli

    def answer(headers: object, body: dict) -> dict:
        if body["model"] == "m-b":
            time.sleep(0.3)
        content = "\\boxed{9^{9^{9^{9}}}}" if body["model"] == "m-a" else "So \\boxed{1}"
        return {**OK_BODY, "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}

    task = {"task_id": "m", "prompt": "What is 1 + 0?", "answer": "1", "grader": "math_expression"}
    (tmp_path / "tasks.jsonl").write_text(json.dumps(task) + "\n")
    with Scripted([(200, {}, answer)]) as server:
        write_pool(tmp_path / "pool.json", {"a": server.base_url, "b": server.base_url})
        args = ["--tasks", tmp_path / "tasks.jsonl", "--pool", tmp_path / "pool.json"]
        args += ["--output", tmp_path / "calls.jsonl", "--repetitions", "1", "--concurrency", "2", "--no-progress"]
        started = time.perf_counter()
        assert cli("collect", *args) == 0
        seconds = time.perf_counter() - started
    (row,) = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    hostile, fine = row["calls"]
    assert (hostile["extracted"], hostile["correct"]) == ("9^{9^{9^{9}}}", False)
    assert (fine["extracted"], fine["correct"]) == ("1", True)
    assert fine["latency_ms"] < 2000, fine  # read when it came, while a's answer was being graded
    assert seconds < GRADE_TIME_LIMIT_S + 8  # graded once: writing the files did not grade it again
    warning = f"warning: 1 answers graded wrong: their grade ran past its {GRADE_TIME_LIMIT_S:g} s limit"
    assert warning in caplog.text


def oversize_upstream(framing: str) -> MisbehavingUpstream:
    """An upstream whose answers to model m-a are past collect's cap: a body declared (and sent) whole with
    its content-length, or one that never ends (chunked, no length). Model m-b gets a normal answer."""
    from benchgen_router.collect.chat import MAX_RESPONSE_BYTES

    start = b'{"id": "huge", "choices": [{"message": {"role": "assistant", "content": "'

    def script(body: dict) -> Reply:
        if body["model"] != "m-a":
            return Reply(body=OK_BODY)
        if framing == "declared":
            return Reply(body=start + b"x" * MAX_RESPONSE_BYTES + b'"}}]}')
        return Reply(body=start, endless=b"x" * 65536, every_s=0)

    return MisbehavingUpstream(script)


@needs_httpx
@pytest.mark.parametrize("framing", ["declared", "endless"])
def test_an_answer_past_the_size_cap_is_one_failed_call_and_nothing_else_is_lost(tmp_path, one_task, framing):
    """A 2 GB answer took `collect --concurrency 1` to 7.4 GB of memory: the body was read whole. It is read
    no further than MAX_RESPONSE_BYTES (the gateway's cap), the call fails with that reason without a retry
    (it would be as large, and billed, again), the connection is closed, and the other agent's calls and the
    files are as they would be."""
    from benchgen_router.collect.chat import MAX_RESPONSE_BYTES

    with oversize_upstream(framing) as server:
        write_pool(tmp_path / "pool.json", {"a": server.base_url, "b": server.base_url})
        result = collect(config(tmp_path, limit=1, repetitions=1, concurrency=1, timeout_s=30))
        closed = server.wait_closed(0, timeout_s=10) if framing == "endless" else 0.0
    assert closed is not None  # collect hung up on the endless answer
    assert (result.made, result.failed, result.tasks_written) == (2, 1, 1)
    assert sum(body["model"] == "m-a" for body in server.requests) == 1  # not retried
    (row,) = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    huge, fine = row["calls"]
    assert huge["error"] == (
        f"answered more than {MAX_RESPONSE_BYTES:,} bytes, collect's limit for one answer (the gateway's too); "
        "ask for fewer tokens (--max-tokens)"
    )
    assert (huge["raw_response"], huge["cost_usd"], huge["correct"]) == (None, 0.0, False)
    assert (fine["error"], fine["extracted"], fine["generation_id"]) == (None, "2", "gen-ok")


def test_collect_caps_an_answer_as_the_gateway_caps_one():
    pytest.importorskip("ray")
    from benchgen_router.collect.chat import MAX_RESPONSE_BYTES
    from benchgen_router.serving.gateway import DEFAULT_MAX_RESPONSE_BYTES

    assert MAX_RESPONSE_BYTES == DEFAULT_MAX_RESPONSE_BYTES


def billed_answer(billed: list[float]) -> object:
    """An upstream body that bills usage.cost, as OpenRouter reports it: task 0 (its prompt "What is 0 +
    0?") and tasks 6 on 0.030 USD, tasks 1-5 0.002. Each bill is recorded in `billed`. By task 6 the
    mean cost so far is a fifth of what the next calls cost."""

    def answer(headers: object, body: dict) -> dict:
        task = int(body["messages"][0]["content"].split()[2])
        cost = 0.030 if task == 0 or task >= 6 else 0.002
        billed.append(cost)
        return {**OK_BODY, "usage": {"prompt_tokens": 10, "completion_tokens": 10, "cost": cost}}

    return answer


@needs_httpx
@pytest.mark.parametrize("concurrency", [1, 4, 16])
def test_the_cost_cap_holds_under_concurrency_against_billed_costs(tmp_path, concurrency):
    """Every call in flight is reserved its agent's largest cost so far, so calls that cost more than
    the mean so far cannot pass the cap together (reserving the mean ended this run at 0.22 USD at
    concurrency 1 and more above it). What the upstream billed is what the run reports, within the cap."""
    billed: list[float] = []
    with Scripted([(200, {}, billed_answer(billed))], delay_s=0.05) as server:
        write_tasks(tmp_path / "tasks.jsonl", count=12)
        write_pool(tmp_path / "pool.json", {"a": server.base_url, "b": server.base_url})
        cfg = config(tmp_path, max_cost_usd=0.2, concurrency=concurrency)  # 48 cells, 0.48 USD in all
        result = collect(cfg)
    assert result.stopped == STOPPED_AT_COST_CAP and result.made == len(billed) == len(server.requests)
    assert result.total_cost_usd == pytest.approx(sum(billed)) and sum(billed) <= 0.2 + 1e-12
    assert sum(billed) > 0.2 - 0.030 * (concurrency + 1)  # it stopped for the cap, not long before it


def test_retry_after_is_read_as_seconds_or_a_date_and_capped():
    assert retry_after_seconds("3") == 3.0 and retry_after_seconds(None) is None and retry_after_seconds("soon") is None
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0) == pytest.approx(10.0)
    assert RetryPolicy().delay_s(0, 3600.0) == 60.0
    assert 0.5 <= RetryPolicy(backoff_s=1.0).delay_s(0, None) <= 1.0 and 2.0 <= RetryPolicy().delay_s(2, None) <= 4.0


# ---------------------------------------------------------------------------------------------
# From the gateway's traffic journal: distinct prompts, a sample per answering agent, the judge's
# rewards and users' feedback beside them


JOURNAL_ANSWERS = {"m-a": "alpha", "m-b": "beta", "m-c": ""}  # what each agent answers; c answers nothing
JOURNAL_RATINGS = {"alpha": 8, "beta": 3}  # the replay judge's rating of each answer


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def journal_call(journal, text: str | None, agent: str) -> str:
    request_id = journal.new_request_id()
    entry = {"request_id": request_id, "model": "benchgen-router", "agent": agent, "head_pick": agent, "status": 200}
    journal.record_call(entry, text)
    return request_id


def write_traffic(folder: Path) -> dict[str, dict[str, list[float]]]:
    """A journal of two gateway processes: 9 distinct prompts (p0 sent twice, last answered by b), one call
    without its text, and feedback sent to the process that did not answer. Returns the feedback each
    prompt's rewards must carry, per agent."""
    from benchgen_router.serving.journal import TrafficJournal

    first, second = TrafficJournal(folder, keep_text=True), TrafficJournal(folder, keep_text=True)
    hashed_only = TrafficJournal(folder)  # a replica started without --journal-text
    ids = {}
    for number in range(6):
        ids[f"p{number}"] = journal_call(first, f"Tell me about topic {number}.", "a")
    for number in range(2):
        ids[f"q{number}"] = journal_call(first, f"Question q{number}?", "b")
    ids["r0"] = journal_call(second, "Riddle r0?", "c")
    ids["p0 again"] = journal_call(second, "Tell me about topic 0.", "b")
    journal_call(hashed_only, "A prompt stored as a hash only.", "a")
    second.record_feedback(ids["p1"], 0.0, None)  # another process than the one that answered
    first.record_feedback(ids["q0"], 1.0, None)
    second.record_feedback(ids["q0"], 0.5, None)  # the user changed their mind: the later score counts
    first.record_feedback(ids["p0"], 1.0, None)
    second.record_feedback(ids["p0 again"], 0.2, None)
    for journal in (first, second, hashed_only):
        journal.close()
    return {
        "Tell me about topic 1.": {"a": [0.0]},
        "Question q0?": {"b": [0.5]},
        "Tell me about topic 0.": {"a": [1.0], "b": [0.2]},
    }


def rate_journal_answer(body: dict) -> str:
    text = body["messages"][-1]["content"]
    start, end = "[The Start of Assistant's Answer]\n", "\n[The End of Assistant's Answer]"
    answer = text[text.index(start) + len(start) : text.index(end)]
    return f"Fine. Rating: [[{JOURNAL_RATINGS[answer]}]]"


@pytest.fixture
def journal_servers():
    from upstream_server import ReplayUpstream

    with (
        ReplayUpstream(lambda body: JOURNAL_ANSWERS[body["model"]]) as agents,
        ReplayUpstream(rate_journal_answer) as judge,
    ):
        yield agents, judge


def journal_config(folder: Path, agents, judge, **overrides: object) -> CollectConfig:
    write_pool(folder / "pool.json", {agent: agents.base_url for agent in AGENTS})
    write_pool(folder / "judge.json", {"judge": judge.base_url})
    values = {
        "tasks": folder / "calls.tasks.jsonl",
        "pool": folder / "pool.json",
        "output": folder / "calls.jsonl",
        "repetitions": 1,
        "backoff_s": 0.01,
        "judge_pool": folder / "judge.json",
    }
    return CollectConfig(**(values | overrides))


@needs_httpx
def test_journal_prompts_are_judged_with_users_feedback_beside_the_judges_rewards(tmp_path, journal_servers, caplog):
    import hashlib
    import hmac

    from benchgen_router.collect.traffic import JournalSource, collect_from_journal

    feedback = write_traffic(tmp_path / "journal")
    config = journal_config(tmp_path, *journal_servers)
    sample, result = collect_from_journal(config, JournalSource(tmp_path / "journal", sample=20))
    assert (sample.calls, sample.without_text, sample.prompts, sample.sampled) == (11, 1, 9, 9)
    assert sample.by_agent == {"a": 5, "b": 3, "c": 1} and sample.with_feedback == 3
    assert any("fewer than --sample 20" in record.getMessage() for record in caplog.records)

    key = (tmp_path / "journal" / ".key").read_bytes()
    tasks = read_rows(config.tasks)
    texts = [row["prompt"] for row in tasks]
    assert len(set(texts)) == 9 and "A prompt stored as a hash only." not in texts
    for row in tasks:
        digest = hmac.new(key, b"text:" + row["prompt"].encode(), hashlib.sha256).hexdigest()
        assert row["task_id"] == "journal-" + digest[:16] and row["grader"] == "judge" and "answer" not in row
        assert row["feedback"] == feedback.get(row["prompt"], {})
    assert result.tasks_written == result.tasks_rated == 9 and result.ungraded == 0

    by_id = {row["task_id"]: row["prompt"] for row in tasks}
    for row in read_rows(config.rewards_path):
        measured = [0.8, 0.3, 0.0]  # the judge's 8 for a's answer, 3 for b's; c's empty answer is wrong
        assert row["mean_reward"] == pytest.approx(measured) and row["dataset"] == "traffic journal"
        scores = feedback.get(by_id[row["task_id"]], {})
        expected = [sum(scores[agent]) / len(scores[agent]) if agent in scores else measured[j]
                    for j, agent in enumerate(AGENTS)]  # fmt: skip
        assert row["feedback_reward"] == pytest.approx(expected)
        assert row["n_feedback"] == [len(scores.get(agent, [])) for agent in AGENTS]


def test_a_sample_takes_equal_shares_per_answering_agent_drawn_with_the_seed():
    from benchgen_router.collect.traffic import TrafficPrompt, stratified_sample

    prompts = [TrafficPrompt(f"{agent}{n}", f"text {agent}{n}", agent) for agent, size in (("a", 6), ("b", 3), ("c", 1))
               for n in range(size)]  # fmt: skip
    for size, shares in ((3, (1, 1, 1)), (5, (2, 2, 1)), (8, (4, 3, 1)), (10, (6, 3, 1)), (50, (6, 3, 1))):
        chosen = stratified_sample(prompts, size, seed=0)
        assert len({prompt.text for prompt in chosen}) == len(chosen)
        assert tuple(sum(prompt.answered_by == agent for prompt in chosen) for agent in "abc") == shares
    assert stratified_sample(prompts, 4, seed=1) == stratified_sample(prompts, 4, seed=1)
    draws = {tuple(prompt.text for prompt in stratified_sample(prompts, 4, seed=seed)) for seed in range(10)}
    assert len(draws) > 1  # the seed draws within each agent's prompts


@needs_httpx
def test_journal_input_problems_are_one_line_and_leave_nothing(tmp_path, journal_servers):
    from benchgen_router.collect.traffic import JournalSource, collect_from_journal
    from benchgen_router.serving.journal import TrafficJournal

    config = journal_config(tmp_path, *journal_servers)
    with pytest.raises(InputError, match="holds no journal files"):
        collect_from_journal(config, JournalSource(tmp_path, sample=3))
    with pytest.raises(InputError, match="does not exist"):
        collect_from_journal(config, JournalSource(tmp_path / "missing", sample=3))
    hashed = TrafficJournal(tmp_path / "hashed")
    journal_call(hashed, "a private prompt", "a")
    hashed.close()
    with pytest.raises(InputError, match="journal-text"):
        collect_from_journal(config, JournalSource(tmp_path / "hashed", sample=3))
    write_traffic(tmp_path / "journal")
    with pytest.raises(InputError, match="no reference answer: pass judge or judge_pool"):
        collect_from_journal(journal_config(tmp_path, *journal_servers, judge_pool=None), JournalSource(
            tmp_path / "journal", sample=3))  # fmt: skip
    with pytest.raises(InputError, match="sample must be an integer >= 1"):
        collect_from_journal(config, JournalSource(tmp_path / "journal", sample=0))
    assert not config.tasks.exists()

    # collect refuses to start (an earlier run's journal, no resume): the sample it was given is removed
    config.journal_path.write_text("")
    with pytest.raises(InputError, match="pass resume"):
        collect_from_journal(config, JournalSource(tmp_path / "journal", sample=3))
    assert not config.tasks.exists() and not config.output.exists()
    config.journal_path.unlink()

    # a tasks file in the way is never overwritten
    config.tasks.write_text("mine\n")
    with pytest.raises(InputError, match="exists"):
        collect_from_journal(config, JournalSource(tmp_path / "journal", sample=3))
    assert config.tasks.read_text() == "mine\n"


@needs_httpx
def test_a_resumed_run_keeps_its_sample_while_the_journal_grows(tmp_path, journal_servers):
    from benchgen_router.collect.traffic import JournalSource, collect_from_journal
    from benchgen_router.serving.journal import TrafficJournal

    write_traffic(tmp_path / "journal")
    config = journal_config(tmp_path, *journal_servers)
    sample, _ = collect_from_journal(config, JournalSource(tmp_path / "journal", sample=4, seed=3))
    first = config.tasks.read_text()
    later = TrafficJournal(tmp_path / "journal", keep_text=True)
    for number in range(5):
        journal_call(later, f"A newer prompt {number}", "c")
    later.close()
    resumed, result = collect_from_journal(
        dataclasses.replace(config, resume=True), JournalSource(tmp_path / "journal", sample=9, seed=7)
    )
    assert resumed.reused and resumed.sampled == sample.sampled == 4
    assert config.tasks.read_text() == first and result.made == 0 and result.tasks_written == 4


@needs_httpx
def test_a_cut_line_and_a_folder_a_live_gateway_writes_to_are_read_with_one_warning(tmp_path, journal_servers, caplog):
    import subprocess
    import sys

    from benchgen_router.collect.traffic import JournalSource, collect_from_journal

    folder = tmp_path / "journal"
    write_traffic(folder)
    cut = sorted(folder.glob("calls-*.jsonl"))[0]
    with cut.open("ab") as file:
        file.write(b'{"time": "2026-12-03T15:00:00Z", "kind": "call", "text": "half a pro')
    writer = subprocess.Popen(  # a live gateway on the same folder, writing all along
        [sys.executable, "-c", (
            "import sys, time\nfrom benchgen_router.serving.journal import TrafficJournal\n"
            "journal = TrafficJournal(sys.argv[1], keep_text=True)\nprint('ready', flush=True)\n"
            "for n in range(100000):\n"
            "    journal.record_call({'request_id': journal.new_request_id(), 'agent': 'a'}, f'live {n % 50}')\n"
            "    time.sleep(0.001)\n"
        ), str(folder)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert writer.stdout.readline().strip() == "ready"
        time.sleep(0.2)
        config = journal_config(tmp_path, *journal_servers)
        sample, result = collect_from_journal(config, JournalSource(folder, sample=12, seed=1))
    finally:
        writer.kill()
        writer.wait()
    assert sample.sampled == 12 and result.tasks_written == 12
    assert all(not row["prompt"].startswith("half") for row in read_rows(config.tasks))
    cut_warnings = [record.getMessage() for record in caplog.records if str(cut) in record.getMessage()]
    assert len(cut_warnings) == 1 and "unfinished" in cut_warnings[0]
