"""`collect --from-journal` on a journal holding what cannot be a task: a prompt the gateway cut at its limit
(asked whole it would be another prompt), a line whose text is not valid UTF-8 (it once stopped collect with
an internal error, exit 70), and a request id repeated with another text. Each is skipped and counted in the
summary line, and the rest is collected as usual, against real upstreams on loopback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_cli_collect import journal_of_one_call_and_pools, read_rows, write_pool

from benchgen_router.serving.journal import TEXT_MAX_CHARS, TrafficJournal
from helpers import cli

httpx = pytest.importorskip("httpx")


def test_cut_and_unreadable_prompts_are_skipped_and_counted_in_the_summary(tmp_path, capsys, caplog):
    from upstream_server import ReplayUpstream

    folder = tmp_path / "journal"
    journal = TrafficJournal(folder, keep_text=True)
    whole = {"Name a river.": "a", "Name a mountain.": "b"}
    ids = {}
    for text, agent in whole.items():
        ids[text] = journal.new_request_id()
        journal.record_call({"request_id": ids[text], "agent": agent, "status": 200}, text)
    journal.record_call({"request_id": journal.new_request_id(), "agent": "a"}, "long " * TEXT_MAX_CHARS)
    journal.close()
    (path,) = folder.glob("calls-*.jsonl")
    lines = path.read_text().splitlines()
    with path.open("a") as file:
        file.write('{"time": "2999-01-01T00:00:00Z", "kind": "call", "agent": "a", "request_id": "bgr-s", '
                   '"text_sha256": "' + "1" * 64 + '", "text": "lone \\ud800 surrogate"}\n')  # fmt: skip
        repeated = json.loads(lines[0]) | {"text": "another prompt", "text_sha256": "2" * 64}
        file.write(json.dumps(repeated) + "\n")

    with (
        ReplayUpstream(lambda body: {"m-a": "The Nile.", "m-b": "Everest."}[body["model"]]) as agents,
        ReplayUpstream(lambda body: "Rating: [[7]]") as judge,
    ):
        write_pool(tmp_path / "pool.json", [("a", agents.base_url, "m-a"), ("b", agents.base_url, "m-b")])
        write_pool(tmp_path / "judge.json", [("judge", judge.base_url, "m-judge")])
        code = cli(
            "collect", "--from-journal", folder, "--sample", "5", "--pool", tmp_path / "pool.json",
            "--judge-pool", tmp_path / "judge.json", "--repetitions", "1", "--output", tmp_path / "calls.jsonl",
            "--no-progress",
        )  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.out.splitlines()[0] == (
        "journal: 3 calls, 0 without text, 2 distinct prompts; skipped 1 cut by the gateway, 1 damaged lines, "
        "1 repeated request ids (1 with another text); sampled 2 (a 1, b 1; 0 with feedback) into "
        f"{tmp_path / 'calls.tasks.jsonl'}"
    )
    assert sorted(row["prompt"] for row in read_rows(tmp_path / "calls.tasks.jsonl")) == sorted(whole)
    assert any(ids["Name a river."] in record.getMessage() for record in caplog.records)  # the id named


def test_a_journal_of_cut_prompts_only_is_refused_in_one_line(tmp_path, capsys):
    journal = TrafficJournal(tmp_path / "journal", keep_text=True)
    journal.record_call({"request_id": journal.new_request_id(), "agent": "a"}, "x" * (TEXT_MAX_CHARS + 1))
    journal.close()
    write_pool(tmp_path / "pool.json", [("a", "http://127.0.0.1:9/v1", "m-a")])
    code = cli(
        "collect", "--from-journal", tmp_path / "journal", "--sample", "5", "--pool", tmp_path / "pool.json",
        "--judge-pool", tmp_path / "pool.json", "--output", tmp_path / "calls.jsonl",
    )  # fmt: skip
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(error) == 1
    assert "holds no whole prompt" in error[0] and f"cut at {TEXT_MAX_CHARS:,} characters" in error[0]
    assert not (tmp_path / "calls.tasks.jsonl").exists()


def test_a_prompt_journaled_before_the_mark_is_judged_cut_by_its_length(tmp_path):
    from benchgen_router.collect.traffic import traffic_prompts

    journal = TrafficJournal(tmp_path, keep_text=True)
    journal.record_call({"request_id": journal.new_request_id(), "agent": "a"}, "y" * TEXT_MAX_CHARS)
    journal.record_call({"request_id": journal.new_request_id(), "agent": "a"}, "a whole prompt")
    journal.close()
    (path,) = Path(tmp_path).glob("calls-*.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({k: v for k, v in row.items() if k != "text_truncated"}) + "\n" for row in rows))
    found = traffic_prompts(tmp_path)
    assert [prompt.text for prompt in found.prompts] == ["a whole prompt"] and found.truncated == 1


def folder_state(folder: Path) -> dict[str, int]:
    """Each entry of `folder` with its modification time, and the folder's own (a file made, renamed over or
    removed in it changes the folder's)."""
    return {".": folder.stat().st_mtime_ns} | {path.name: path.stat().st_mtime_ns for path in folder.iterdir()}


@pytest.mark.parametrize("sampled_before", [False, True], ids=["new-sample", "resumed-sample"])
def test_a_python_call_refused_by_another_run_touches_nothing(tmp_path, sampled_before):
    """collect_from_journal() from Python while another run holds the output's journal: refused (JournalInUse)
    before it samples, so the output folder keeps its files and their modification times. It used to sample the
    journal into the tasks file, then, refused by collect(), remove that file: the one the run holding the
    output had sampled and was using, when that run had not written it yet."""
    from benchgen_router.collect import JournalInUse
    from benchgen_router.collect.journal import JournalLock
    from benchgen_router.collect.run import CollectConfig
    from benchgen_router.collect.traffic import JournalSource, collect_from_journal

    out = journal_of_one_call_and_pools(tmp_path)
    tasks = out / "calls.tasks.jsonl"
    if sampled_before:
        tasks.write_text('{"task_id": "journal-1", "prompt": "Name a lake.", "grader": "judge"}\n')
    config = CollectConfig(
        tasks=tasks, pool=out / "pool.json", output=out / "calls.jsonl", judge_pool=out / "judge.json", resume=True
    )
    holder = JournalLock(config.journal_path).acquire()  # as the run that holds the output would
    try:
        for path in out.iterdir():
            os.utime(path, ns=(1_000_000_000, 1_000_000_000))
        os.utime(out, ns=(1_000_000_000, 1_000_000_000))
        before = folder_state(out)
        with pytest.raises(JournalInUse, match="is in use by another collect run"):
            collect_from_journal(config, JournalSource(tmp_path / "journal", sample=1))
        assert folder_state(out) == before
    finally:
        holder.release()


def test_a_whole_prompt_as_long_as_the_gateways_limit_is_a_task(tmp_path):
    """A line's mark decides, not its text's length: a prompt of exactly TEXT_MAX_CHARS that the gateway did not
    cut is a task (it was skipped as cut), one it cut is skipped."""
    from benchgen_router.collect.traffic import traffic_prompts

    journal = TrafficJournal(tmp_path, keep_text=True)
    journal.record_call({"request_id": journal.new_request_id(), "agent": "a"}, "y" * TEXT_MAX_CHARS)
    journal.record_call(
        {"request_id": journal.new_request_id(), "agent": "a"}, "z" * TEXT_MAX_CHARS, text_truncated=True
    )
    journal.close()
    found = traffic_prompts(tmp_path)
    assert [prompt.text for prompt in found.prompts] == ["y" * TEXT_MAX_CHARS] and found.truncated == 1
