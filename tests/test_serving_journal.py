"""The traffic journal's writer: lines written off the caller's thread, request ids and text hashes shared
by every process on a folder, retention within a budget of bytes (calls and feedback apart) and of days,
feedback bounded per request, texts cut at the gateway's limit marked, and a full disk (a real one: a small
tmpfs) that costs lines, counted and logged once, never the files that hold the history. The reader's
own tests are in test_serving_journal_reading.py."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from benchgen_router.errors import InputError
from benchgen_router.serving.journal import (
    FEEDBACK_PER_REQUEST,
    TEXT_MAX_CHARS,
    Retention,
    TrafficJournal,
    check_journal_folder,
    parse_max_bytes,
    parse_max_days,
    service_retention,
)
from benchgen_router.serving.journal_reading import read_journal

LOGGER = "benchgen_router.serving.journal"


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


def journal_files(folder: Path, kind: str = "*") -> list[Path]:
    return sorted(folder.glob(f"{kind}-*.jsonl"))


def raw_lines(folder: Path) -> list[dict]:
    return [json.loads(line) for path in journal_files(folder) for line in path.read_text().splitlines()]


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

    (call,) = read_journal(tmp_path).calls
    assert call["request_id"] == request_id and call["agent"] == "a0" and call["status"] == 200
    assert [(feedback["score"], "comment" in feedback) for feedback in call["feedback"]] == [(1.0, False)]
    assert call["time"] < call["feedback"][0]["time"]


def test_keep_text_stores_the_text_and_the_comment(tmp_path):
    journal = TrafficJournal(tmp_path, keep_text=True)
    request_id = journal.new_request_id()
    journal.record_call(call_entry(request_id), "what is 2+2?")
    journal.record_feedback(request_id, 0.5, "meh")
    journal.close()
    (call,) = read_journal(tmp_path).calls
    assert call["text"] == "what is 2+2?" and call["text_sha256"] and call["text_truncated"] is False
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
    from benchgen_router.serving.journal import Retention, TrafficJournal

    folder, name, count = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    journal = TrafficJournal(folder, keep_text=True, retention=Retention(max_bytes=256_000))  # files of 24 kB
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
    assert len(journal_files(folder, "calls")) > 2  # rotated: several files per process
    for path in journal_files(folder):
        assert int(path.name.split("-")[-2]) in pids
        agents = {json.loads(line).get("agent") for line in path.read_text().splitlines()}
        assert len(agents - {None}) <= 1  # one process per file: never interleaved
    calls = read_journal(folder).calls
    assert len(calls) == 2 * count
    for name, ids in (("left", issued[0]["ids"]), ("right", issued[1]["ids"])):
        mine = [call for call in calls if call["agent"] == name]
        assert [call["number"] for call in mine] == list(range(count))
        assert [call["request_id"] for call in mine] == ids
        assert [call["text"] for call in mine] == [f"{name} prompt {number}" for number in range(count)]
        assert [len(call["feedback"]) for call in mine] == [1] * 10 + [0] * (count - 10)
        assert all(call["feedback"][0]["score"] == 0.25 for call in mine[:10])


def test_an_unwritable_folder_is_one_error_and_a_count_never_an_exception(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        journal = TrafficJournal(blocker / "journal")
        request_id = journal.new_request_id()
        assert journal.known_request_id(request_id)  # a key of its own: this process still recognises its ids
        for _ in range(5):
            journal.record_call(call_entry(request_id), "prompt")
        journal.record_feedback(request_id, 1.0, None)
        journal.close()
    assert journal.write_failures == 6 and journal.failure == "Not a directory"
    messages = [(record.levelno, record.getMessage()) for record in caplog.records]
    assert [level for level, message in messages if "cannot write" in message] == [logging.ERROR]
    assert len(messages) == 2  # the key's warning and the writes' error, not one per line
    journal.record_call(call_entry(request_id), "after close")  # still no exception
    assert journal.write_failures == 7


FULL_FILE = textwrap.dedent(
    """
    import json, resource, signal, sys
    from pathlib import Path
    from benchgen_router.serving.journal import Retention, TrafficJournal

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


def test_close_writes_every_queued_line(tmp_path):
    journal = TrafficJournal(tmp_path)
    ids = [journal.new_request_id() for _ in range(2000)]
    for request_id in ids:
        journal.record_call(call_entry(request_id), "prompt")
    journal.close()
    journal.close()  # twice is harmless
    assert [call["request_id"] for call in read_journal(tmp_path).calls] == ids
    assert journal.write_failures == 0


def folder_bytes(folder: Path, kind: str) -> int:
    return sum(path.stat().st_size for path in journal_files(folder, kind))


def test_calls_beyond_their_budget_remove_the_oldest_files_counted_and_logged(tmp_path, caplog):
    retention = Retention(max_bytes=16_000)  # calls keep 12,000 bytes, in files of 1,500
    journal = TrafficJournal(tmp_path, retention=retention)
    ids = [journal.new_request_id() for _ in range(200)]
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for request_id in ids:
            journal.record_call(call_entry(request_id), "prompt")
        journal.close()
    assert folder_bytes(tmp_path, "calls") <= retention.budget("calls")
    assert all(path.stat().st_size <= retention.file_bytes("calls") for path in journal_files(tmp_path))
    kept = [call["request_id"] for call in read_journal(tmp_path).calls]
    assert 0 < len(kept) < len(ids) and kept == ids[-len(kept) :]  # the newest lines, every one of them
    (removed,) = journal.removed().items()
    files, size = removed[1]
    assert removed[0] == ("calls", "size") and files > 0 and size > 0
    warnings = [record for record in caplog.records if "removed calls-" in record.getMessage()]
    assert len(warnings) == files and all(record.levelno == logging.WARNING for record in warnings)

    # a restart on the same folder keeps within the budget too, the previous process's files included
    journal = TrafficJournal(tmp_path, retention=retention)
    for _ in range(40):
        journal.record_call(call_entry(journal.new_request_id()), "prompt")
    journal.close()
    assert folder_bytes(tmp_path, "calls") <= retention.budget("calls")


def test_a_feedback_flood_pushes_out_older_feedback_never_the_calls(tmp_path, caplog):
    """What a flood did before: feedback and calls shared the files and their bound, so feedback lines
    filled every file and rotation removed each that held a call. Now feedback keeps within its own
    quarter of the budget, and every call stays."""
    retention = Retention(max_bytes=64_000)  # calls 48,000 bytes, feedback 16,000
    journal = TrafficJournal(tmp_path, keep_text=True, retention=retention)
    ids = [journal.new_request_id() for _ in range(60)]
    for request_id in ids:
        journal.record_call(call_entry(request_id), f"prompt of {request_id}")
    comment = "x" * 2000
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        accepted = [journal.record_feedback(request_id, 0.5, comment) for request_id in ids for _ in range(12)]
        journal.close()
    assert accepted.count(True) == 60 * FEEDBACK_PER_REQUEST  # 1.2 MB of feedback offered to a 16 kB share
    calls = read_journal(tmp_path).calls
    assert [call["request_id"] for call in calls] == ids  # not one call lost
    assert folder_bytes(tmp_path, "feedback") <= retention.budget("feedback")
    assert {kind for kind, _ in journal.removed()} == {"feedback"}
    kept = [feedback for call in calls for feedback in call["feedback"]]
    assert kept and all(feedback["comment"] == comment for feedback in kept)
    assert calls[-1]["feedback"]  # the newest feedback is what remains
    removed = [record.getMessage() for record in caplog.records if "removed" in record.getMessage()]
    assert removed and all("removed feedback-" in message for message in removed)


def test_feedback_is_bounded_per_request_refusals_counted_and_logged_once_per_request(tmp_path, caplog):
    journal = TrafficJournal(tmp_path)
    flooded, other = journal.new_request_id(), journal.new_request_id()
    for request_id in (flooded, other):
        journal.record_call(call_entry(request_id), "prompt")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        answers = [journal.record_feedback(flooded, 1.0, None) for _ in range(FEEDBACK_PER_REQUEST + 5)]
        assert journal.record_feedback(other, 0.0, None)  # another request's feedback is not held back
    journal.close()
    assert answers == [True] * FEEDBACK_PER_REQUEST + [False] * 5
    assert journal.feedback_refused == 5
    scores = {call["request_id"]: len(call["feedback"]) for call in read_journal(tmp_path).calls}
    assert scores == {flooded: FEEDBACK_PER_REQUEST, other: 1}
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 1 and flooded in warnings[0] and str(FEEDBACK_PER_REQUEST) in warnings[0]


def age_files(folder: Path, days: float) -> None:
    then = time.time() - days * 86400
    for path in journal_files(folder):
        os.utime(path, (then, then))


def test_files_older_than_the_days_kept_are_removed_but_never_a_live_writers(tmp_path, caplog):
    old = TrafficJournal(tmp_path)
    old_ids = [old.new_request_id() for _ in range(3)]
    for request_id in old_ids:
        old.record_call(call_entry(request_id), "prompt")
        old.record_feedback(request_id, 1.0, None)
    old.close()
    live = TrafficJournal(tmp_path)  # a live writer whose file is as old: held, so never removed
    live_id = live.new_request_id()
    live.record_call(call_entry(live_id), "prompt")
    deadline = time.monotonic() + 10
    while len(journal_files(tmp_path, "calls")) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)  # until its thread has started its file
    age_files(tmp_path, 31)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        journal = TrafficJournal(tmp_path, retention=Retention(max_days=30))
        new_id = journal.new_request_id()
        journal.record_call(call_entry(new_id), "prompt")
        journal.record_feedback(new_id, 1.0, None)
        journal.close()
    live.close()
    assert [call["request_id"] for call in read_journal(tmp_path).calls] == [live_id, new_id]
    removed = journal.removed()
    assert set(removed) == {("calls", "age"), ("feedback", "age")} and removed["calls", "age"][0] == 1
    messages = [record for record in caplog.records if "older than 30 days" in record.getMessage()]
    assert len(messages) == 2 and all(record.levelno == logging.INFO for record in messages)


def test_retention_settings_out_of_range_are_one_line():
    for bad in (0, 1023, 2.5, True):
        with pytest.raises(InputError, match="max_bytes must be a whole number >= 1024") as refused:
            Retention(max_bytes=bad)
        assert "--journal-max-bytes must be" in refused.value.for_command_line()
    for bad in (0, -1, float("inf"), float("nan"), "30"):
        with pytest.raises(InputError, match="max_days must be a number of days > 0") as refused:
            Retention(max_days=bad)
        assert "--journal-max-days must be" in refused.value.for_command_line()


def test_a_size_and_days_of_retention_are_read_as_a_person_writes_them():
    sizes = {"1073741824": 1 << 30, "512M": 512 << 20, "512MiB": 512 << 20, "1.5GiB": 3 << 29, " 64 kib ": 64 << 10}
    assert {text: parse_max_bytes(text) for text in sizes} == sizes
    assert service_retention(None, None) == Retention() == Retention(1 << 30, 30)  # None: the default
    assert service_retention(parse_max_bytes("8K"), parse_max_days("0.5")) == Retention(8192, 0.5)
    for bad in ("1GB", "-1", "1e9", "lots", "", "1 G B"):
        with pytest.raises(InputError, match="is not a size; pass a number of bytes") as refused:
            parse_max_bytes(bad)
        assert refused.value.for_command_line().startswith(f"--journal-max-bytes {bad} is not a size")
    with pytest.raises(InputError, match="journal_max_days='soon' is not a number of days"):
        parse_max_days("soon")


def test_a_text_is_marked_cut_when_the_caller_or_the_journal_cut_it(tmp_path):
    """The mark is a fact, never read from the text's length: the caller says whether it cut the text (the
    gateway cuts at the length it routes on), and the journal marks what it cuts itself. A text of exactly
    TEXT_MAX_CHARS is whole (it was marked cut, since the journal inferred a cut from the length)."""
    journal = TrafficJournal(tmp_path, keep_text=True)
    hashed = TrafficJournal(tmp_path / "hashed")
    for target in (journal, hashed):
        target.record_call(call_entry(target.new_request_id()), "a" * (TEXT_MAX_CHARS + 10))
        target.record_call(call_entry(target.new_request_id()), "b" * TEXT_MAX_CHARS)
        target.record_call(call_entry(target.new_request_id()), "c" * TEXT_MAX_CHARS, text_truncated=True)
        target.record_call(call_entry(target.new_request_id()), "a short prompt cut by its caller", text_truncated=True)
        target.record_call(call_entry(target.new_request_id()), "a short prompt")
        target.record_call(call_entry(target.new_request_id()), None)
        target.close()
    longer, exact, exact_cut, short_cut, short, none = read_journal(tmp_path).calls
    assert len(longer["text"]) == TEXT_MAX_CHARS and longer["text_truncated"] is True
    assert exact["text"] == "b" * TEXT_MAX_CHARS and exact["text_truncated"] is False
    assert exact_cut["text_truncated"] is True and short_cut["text_truncated"] is True
    assert short["text_truncated"] is False and none["text_truncated"] is False and none["text"] is None
    marks = [call["text_truncated"] for call in read_journal(tmp_path / "hashed").calls]
    assert marks == [True, False, True, True, False, False]


def test_a_folder_that_can_never_be_written_is_refused_in_one_line(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(InputError, match=r"journal=.*a-file/journal.* cannot be written \(Not a directory\)"):
        check_journal_folder(blocker / "journal")
    with pytest.raises(InputError, match="is a file; pass a folder"):
        check_journal_folder(blocker)
    check_journal_folder(tmp_path / "new" / "journal")  # created, and left empty
    assert list((tmp_path / "new" / "journal").iterdir()) == []


# A journal on a real full disk: a 48 KiB tmpfs, mounted in a mount namespace of its own (root, or a user
# namespace), so that nothing outlives the process. Written, then filled, then freed.
FULL_DISK = textwrap.dedent(
    """
    import json, logging, subprocess, sys, time
    from pathlib import Path
    from benchgen_router.serving.journal import Retention, TrafficJournal
    from benchgen_router.serving.journal_reading import read_journal

    disk = Path(sys.argv[1])
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(disk)], check=True)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    folder = disk / "journal"
    journal = TrafficJournal(folder, keep_text=True, retention=Retention(max_bytes=160_000))  # files of 15 kB
    spare = disk / "spare"
    spare.write_bytes(b"s" * 8192)  # freed later, as an operator would
    sent = []
    for number in range(150):
        sent.append(journal.new_request_id())
        journal.record_call({"request_id": sent[-1], "number": number}, f"prompt {number} " + "p" * 200)
    def written():
        return sum(len(path.read_bytes().splitlines()) for path in folder.glob("*-*.jsonl"))

    deadline = time.monotonic() + 30
    while written() + journal.write_failures < len(sent) and time.monotonic() < deadline:
        time.sleep(0.05)  # every line written or counted as lost
    full = {"failures": journal.write_failures, "failure": journal.failure, "removed": len(journal.removed()),
            "files": {path.name: path.stat().st_size for path in folder.glob("*-*.jsonl")},
            "read": [call["request_id"] for call in read_journal(folder).calls], "sent": sent}
    spare.unlink()
    sent.append(journal.new_request_id())
    journal.record_call({"request_id": sent[-1]}, "after the disk was freed")
    journal.close()
    freed = {"failures": journal.write_failures - full["failures"], "failure": journal.failure,
             "last": read_journal(folder).calls[-1]["request_id"] == sent[-1]}
    print(json.dumps({"full": full, "freed": freed}))
    """
)


def in_own_mount_namespace() -> list[str]:
    """unshare's command line for a private mount namespace (a user namespace too when not root)."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to mount a small tmpfs in a namespace of its own")
    as_root = os.geteuid() == 0
    command = ["unshare", "--mount", "--propagation", "private"] + ([] if as_root else ["--user", "--map-root-user"])
    probe = subprocess.run([*command, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a mount namespace to mount a tmpfs in: {probe.stderr.strip()}")
    return command


def test_a_full_disk_loses_lines_counted_and_logged_once_never_a_file_that_holds_them(tmp_path):
    """The defect this pins: every failed write opened a new file, and rotation by count then removed the
    files that held the lines; on this disk, 150 calls left 15 empty files and none with a line."""
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(
        [*in_own_mount_namespace(), sys.executable, "-c", FULL_DISK, str(disk)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    full, freed = result["full"], result["freed"]
    assert 0 < full["failures"] < 150 and full["failure"] == "No space left on device"
    assert full["removed"] == 0
    sizes = list(full["files"].values())
    assert sizes.count(0) <= 1 and sum(sizes) > 30_000  # the files that hold lines, and no trail of empty ones
    assert full["read"] == full["sent"][: 150 - full["failures"]]  # every line written is there to read
    assert freed == {"failures": 0, "failure": None, "last": True}  # the same writer, on the same file
    log = done.stderr.splitlines()
    errors = [line for line in log if line.startswith("ERROR") and "cannot write" in line]
    assert len(errors) == 1 and "No space left on device" in errors[0] and "not being written" in errors[0]
    recovered = [line for line in log if "writing again" in line]
    assert len(recovered) == 1 and recovered[0].startswith("WARNING")
