"""The traffic journal: lines written off the caller's thread, rotation within bounds, request ids and
text hashes shared by every process on a folder, and a reader that survives a cut line."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchgen_router.errors import InputError
from benchgen_router.serving.journal import TrafficJournal, read_journal


def call_entry(request_id: str, agent: str = "a0", **extra) -> dict:
    entry = {
        "request_id": request_id,
        "model": "benchgen-router",
        "operating_point": None,
        "agent": agent,
        "head_pick": agent,
        "out_of_distribution": False,
        "guard_score": None,
        "retried_from": None,
        "status": 200,
        "prompt_tokens": 5,
        "completion_tokens": 7,
        "cost_usd": 0.0001,
        "first_byte_s": 0.01,
        "total_s": 0.02,
        "stream": False,
    }
    return entry | extra


def raw_lines(folder: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(folder.glob("calls-*.jsonl")) for line in path.read_text().splitlines()]


def test_a_call_and_its_feedback_read_back_joined_with_the_text_hashed_not_stored(tmp_path):
    journal = TrafficJournal(tmp_path)
    request_id = journal.new_request_id()
    journal.record_call(call_entry(request_id), "my private prompt")
    journal.record_feedback(request_id, 1.0, "great answer")
    journal.close()

    lines = raw_lines(tmp_path)
    assert [line["kind"] for line in lines] == ["call", "feedback"]
    assert "my private prompt" not in json.dumps(lines) and "great answer" not in json.dumps(lines)
    key = (tmp_path / ".key").read_bytes()
    expected_hash = hmac.new(key, b"text:my private prompt", hashlib.sha256).hexdigest()
    assert lines[0]["text_sha256"] == expected_hash and "text" not in lines[0]
    assert lines[0]["text_sha256"] != hashlib.sha256(b"my private prompt").hexdigest()

    (call,) = read_journal(tmp_path)
    assert call["request_id"] == request_id and call["agent"] == "a0" and call["status"] == 200
    assert [(feedback["score"], "comment" in feedback) for feedback in call["feedback"]] == [(1.0, False)]
    assert call["time"] < call["feedback"][0]["time"]


def test_keep_text_stores_the_text_and_the_comment(tmp_path):
    journal = TrafficJournal(tmp_path, keep_text=True)
    request_id = journal.new_request_id()
    journal.record_call(call_entry(request_id), "what is 2+2?")
    journal.record_feedback(request_id, 0.5, "meh")
    journal.close()
    (call,) = read_journal(tmp_path)
    assert call["text"] == "what is 2+2?" and call["text_sha256"]
    assert call["feedback"] == [{"time": call["feedback"][0]["time"], "score": 0.5, "comment": "meh"}]


def test_the_key_is_private_and_ids_and_hashes_hold_across_journals_on_one_folder(tmp_path):
    first, second, elsewhere = TrafficJournal(tmp_path), TrafficJournal(tmp_path), TrafficJournal(tmp_path / "other")
    try:
        key = tmp_path / ".key"
        assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(key.read_bytes()) == 32
        assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".key")] == [".key"]

        issued = first.new_request_id()
        assert issued != first.new_request_id()
        assert first.known_request_id(issued) and second.known_request_id(issued)
        assert not elsewhere.known_request_id(issued)  # another folder, another key
        assert not second.known_request_id(elsewhere.new_request_id())
        random_part, signature = issued.removeprefix("bgr-").split("-")
        forged = [
            f"bgr-{random_part}-{'0' * len(signature)}",
            f"bgr-{'f' * len(random_part)}-{signature}",
            issued[:-1] + ("0" if issued[-1] != "0" else "1"),
            "bgr-",
            "",
            "anything",
            f"xyz-{random_part}-{signature}",
        ]
        assert not any(second.known_request_id(request_id) for request_id in forged)

        assert first.text_hash("same prompt") == second.text_hash("same prompt")
        assert first.text_hash("same prompt") != elsewhere.text_hash("same prompt")
        assert first.text_hash("same prompt") != first.text_hash("other prompt")
    finally:
        for journal in (first, second, elsewhere):
            journal.close()


WRITER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from benchgen_router.serving.journal import TrafficJournal

    folder, name, count = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    journal = TrafficJournal(folder, keep_text=True, max_file_bytes=4096, max_files=1000)
    ids = []
    for number in range(count):
        request_id = journal.new_request_id()
        ids.append(request_id)
        journal.record_call({"request_id": request_id, "agent": name, "number": number}, f"{name} prompt {number}")
    print(json.dumps({"ids": ids, "hash": journal.text_hash("shared prompt")}), flush=True)
    feedback_for = json.loads(sys.stdin.readline())  # ids the other process issued
    for request_id in feedback_for:
        assert journal.known_request_id(request_id), request_id
        journal.record_feedback(request_id, 0.25, None)
    journal.close()
    """
)


def test_two_processes_write_one_folder_and_feedback_joins_across_them(tmp_path):
    folder = tmp_path / "journal"
    count = 300
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(folder), name, str(count)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in ("left", "right")
    ]
    issued = [json.loads(process.stdout.readline()) for process in processes]
    # each process sends feedback for the other's requests (the replica that answered is not the one asked)
    for process, other in zip(processes, reversed(issued), strict=True):
        process.stdin.write(json.dumps(other["ids"][:10]) + "\n")
        process.stdin.flush()
    for process in processes:
        assert process.wait(timeout=60) == 0
    assert issued[0]["hash"] == issued[1]["hash"]  # one key for both, whichever created it

    pids = {process.pid for process in processes}
    for path in folder.glob("calls-*.jsonl"):
        assert int(path.name.split("-")[-2]) in pids
        agents = {json.loads(line).get("agent") for line in path.read_text().splitlines()}
        assert len(agents - {None}) <= 1  # one process per file: never interleaved
    calls = list(read_journal(folder))
    assert len(calls) == 2 * count
    for name, ids in (("left", issued[0]["ids"]), ("right", issued[1]["ids"])):
        mine = [call for call in calls if call["agent"] == name]
        assert [call["number"] for call in mine] == list(range(count))
        assert [call["request_id"] for call in mine] == ids
        assert [call["text"] for call in mine] == [f"{name} prompt {number}" for number in range(count)]
        assert [len(call["feedback"]) for call in mine] == [1] * 10 + [0] * (count - 10)
        assert all(call["feedback"][0]["score"] == 0.25 for call in mine[:10])


def test_a_cut_last_line_is_skipped_with_one_warning_and_earlier_lines_kept(tmp_path, caplog):
    journal = TrafficJournal(tmp_path)
    ids = [journal.new_request_id() for _ in range(3)]
    for request_id in ids:
        journal.record_call(call_entry(request_id), "prompt")
    journal.close()
    (path,) = tmp_path.glob("calls-*.jsonl")
    with path.open("ab") as file:  # what a crash in the middle of a write leaves
        file.write(b'{"time": "2026-12-03T15:00:00.000000Z", "kind": "call", "request_id": "bgr-')
    with caplog.at_level(logging.WARNING, logger="benchgen_router.serving.journal"):
        calls = list(read_journal(tmp_path))
    assert [call["request_id"] for call in calls] == ids
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 1 and str(path) in warnings[0] and "line 4" in warnings[0]

    # a new journal on the folder starts a file of its own and never appends after the cut
    journal = TrafficJournal(tmp_path)
    later = journal.new_request_id()
    journal.record_call(call_entry(later), "prompt")
    journal.record_feedback(ids[0], 1.0, None)
    journal.close()
    calls = list(read_journal(tmp_path))
    assert [call["request_id"] for call in calls] == [*ids, later]
    assert [feedback["score"] for feedback in calls[0]["feedback"]] == [1.0]


def test_an_unwritable_folder_is_one_warning_and_a_count_never_an_exception(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with caplog.at_level(logging.WARNING, logger="benchgen_router.serving.journal"):
        journal = TrafficJournal(blocker / "journal")
        request_id = journal.new_request_id()
        assert journal.known_request_id(request_id)  # a key of its own: this process still recognises its ids
        for _ in range(5):
            journal.record_call(call_entry(request_id), "prompt")
        journal.record_feedback(request_id, 1.0, None)
        journal.close()
    assert journal.write_failures == 6
    messages = [record.getMessage() for record in caplog.records]
    assert sum("cannot write" in message for message in messages) == 1
    assert len(messages) == 2  # the key's warning and the writes' warning, not one per line
    journal.record_call(call_entry(request_id), "after close")  # still no exception
    assert journal.write_failures == 7


FULL_FILE = textwrap.dedent(
    """
    import json, resource, signal, sys
    from pathlib import Path
    from benchgen_router.serving.journal import TrafficJournal

    folder = Path(sys.argv[1])
    journal = TrafficJournal(folder)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, resource.RLIM_INFINITY))
    for number in range(40):
        journal.record_call({"request_id": journal.new_request_id(), "number": number, "pad": "x" * 60}, None)
    journal.close()
    print(journal.write_failures)
    """
)


def test_a_write_that_fails_halfway_is_cut_back_and_counted(tmp_path):
    folder = tmp_path / "journal"
    folder.mkdir()
    (folder / ".key").write_bytes(os.urandom(32))  # created before the size limit applies
    done = subprocess.run(
        [sys.executable, "-c", FULL_FILE, str(folder)], capture_output=True, text=True, timeout=60, check=True
    )
    failures = int(done.stdout.strip())
    assert failures >= 1 and "cannot write" in done.stderr
    numbers = []
    for path in sorted(folder.glob("calls-*.jsonl"), key=lambda path: int(path.stem.split("-")[-1])):
        data = path.read_bytes()
        assert len(data) <= 1000 and (not data or data.endswith(b"\n"))  # no half line left behind
        numbers += [json.loads(line)["number"] for line in data.splitlines()]
    assert len(numbers) == 40 - failures and numbers == sorted(numbers)


def test_rotation_keeps_the_folder_within_its_bound_and_keeps_the_newest_lines(tmp_path):
    journal = TrafficJournal(tmp_path, max_file_bytes=1000, max_files=3)
    ids = [journal.new_request_id() for _ in range(200)]
    for request_id in ids:
        journal.record_call(call_entry(request_id), "prompt")
    journal.close()
    files = list(tmp_path.glob("calls-*.jsonl"))
    assert len(files) <= 3 + 1  # the finished files kept, and the one written last
    assert all(path.stat().st_size <= 1000 for path in files)
    kept = [call["request_id"] for call in read_journal(tmp_path)]
    assert 0 < len(kept) < len(ids) and kept == ids[-len(kept) :]

    # a restart on the same folder removes the previous process's oldest files too
    journal = TrafficJournal(tmp_path, max_file_bytes=1000, max_files=3)
    journal.record_call(call_entry(journal.new_request_id()), "prompt")
    journal.close()
    assert len(list(tmp_path.glob("calls-*.jsonl"))) <= 3 + 1


def test_close_writes_every_queued_line(tmp_path):
    journal = TrafficJournal(tmp_path)
    ids = [journal.new_request_id() for _ in range(2000)]
    for request_id in ids:
        journal.record_call(call_entry(request_id), "prompt")
    journal.close()
    journal.close()  # twice is harmless
    assert [call["request_id"] for call in read_journal(tmp_path)] == ids
    assert journal.write_failures == 0


def test_reading_a_folder_without_a_journal_is_one_line(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        list(read_journal(tmp_path / "missing"))
    with pytest.raises(InputError, match="holds no journal files"):
        list(read_journal(tmp_path))
