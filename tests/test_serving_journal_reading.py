"""Reading a traffic journal back: calls joined to their feedback across files, and every line that is no use
(cut by a crash, damaged, text that is not valid UTF-8, a repeated request id, feedback whose call is gone)
skipped and counted, never an exception."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from test_serving_journal import call_entry

from benchgen_router.errors import InputError
from benchgen_router.serving.journal import TrafficJournal
from benchgen_router.serving.journal_reading import read_journal

LOGGER = "benchgen_router.serving.journal"


def write_calls(folder: Path, texts: list[str], keep_text: bool = True) -> list[str]:
    journal = TrafficJournal(folder, keep_text=keep_text)
    ids = []
    for text in texts:
        ids.append(journal.new_request_id())
        journal.record_call(call_entry(ids[-1]), text)
    journal.close()
    return ids


def append_line(path: Path, line: dict | bytes) -> None:
    with path.open("ab") as file:
        file.write(line if isinstance(line, bytes) else json.dumps(line).encode() + b"\n")


def test_a_cut_last_line_is_skipped_with_one_warning_and_earlier_lines_kept(tmp_path, caplog):
    ids = write_calls(tmp_path, ["prompt"] * 3)
    (path,) = tmp_path.glob("calls-*.jsonl")
    append_line(path, b'{"time": "2026-12-03T15:00:00.000000Z", "kind": "call", "request_id": "bgr-')  # a crash
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        reading = read_journal(tmp_path)
    assert [call["request_id"] for call in reading.calls] == ids and reading.unfinished_lines == 1
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 1 and str(path) in warnings[0] and "line 4" in warnings[0]

    # a new journal on the folder starts a file of its own and never appends after the cut
    journal = TrafficJournal(tmp_path)
    later = journal.new_request_id()
    journal.record_call(call_entry(later), "prompt")
    journal.record_feedback(ids[0], 1.0, None)
    journal.close()
    calls = read_journal(tmp_path).calls
    assert [call["request_id"] for call in calls] == [*ids, later]
    assert [feedback["score"] for feedback in calls[0]["feedback"]] == [1.0]


def test_a_line_whose_text_is_not_valid_utf8_is_skipped_and_counted(tmp_path, caplog):
    """A lone surrogate escape reads into a str that no file can hold: collect --from-journal once stopped
    with an internal error writing it. The line is skipped and counted like any damaged line."""
    (good,) = write_calls(tmp_path, ["a sound prompt"])
    (path,) = tmp_path.glob("calls-*.jsonl")
    append_line(path, b'{"time": "2999-01-01T00:00:00.000000Z", "kind": "call", "request_id": "bgr-x", '
                      b'"text": "bad \\ud800 text"}\n')  # fmt: skip
    append_line(path, b'{"time": "2999-01-01T00:00:01.000000Z", "kind": "call", "request_id": "bgr-y", '
                      b'"text": "a pair \\ud83d\\ude00 is fine"}\n')  # fmt: skip
    append_line(path, b"[1, 2]\n")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        reading = read_journal(tmp_path)
    assert [call["request_id"] for call in reading.calls] == [good, "bgr-y"]
    assert reading.calls[1]["text"] == "a pair \U0001f600 is fine"
    assert reading.damaged_lines == 2 and reading.unfinished_lines == 0
    messages = [record.getMessage() for record in caplog.records]
    assert [("line 2" in message, "not valid UTF-8" in message) for message in messages] == [
        (True, True),
        (False, False),
    ]


def test_repeated_request_ids_are_counted_and_those_with_another_text_named(tmp_path, caplog):
    ids = write_calls(tmp_path, ["first", "second", "third"])
    (path,) = tmp_path.glob("calls-*.jsonl")
    lines = path.read_text().splitlines()
    copy = tmp_path / "calls-copied-1-1.jsonl"  # a file copied back in: every line repeats
    copy.write_text("\n".join(lines) + "\n")
    changed = json.loads(lines[1]) | {"text": "not what was sent", "text_sha256": "0" * 64}
    append_line(copy, changed)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        reading = read_journal(tmp_path)
    assert [call["request_id"] for call in reading.calls] == ids
    assert [call["text"] for call in reading.calls] == ["first", "second", "third"]  # the first line read is kept
    assert reading.repeated_calls == 4 and reading.conflicting_ids == [ids[1]]
    (warning,) = [record.getMessage() for record in caplog.records]
    assert "4 call lines repeat a request id" in warning and f"1 of those ids carry another text: {ids[1]}" in warning


def test_feedback_whose_call_is_gone_is_counted_and_feedback_in_a_calls_file_still_joins(tmp_path, caplog):
    (kept,) = write_calls(tmp_path, ["prompt"])
    (path,) = tmp_path.glob("calls-*.jsonl")
    # journals written before feedback had files of its own hold it beside the calls
    append_line(path, {"time": "2026-12-03T15:00:00.000000Z", "kind": "feedback", "request_id": kept, "score": 1.0})
    append_line(path, {"time": "2026-12-03T15:00:01.000000Z", "kind": "feedback", "request_id": "bgr-gone", "score": 0})
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        reading = read_journal(tmp_path)
    ((call,), orphans) = reading.calls, reading.orphan_feedback
    assert [feedback["score"] for feedback in call["feedback"]] == [1.0] and orphans == 1
    assert any("1 feedback lines name requests not in the folder" in record.getMessage() for record in caplog.records)


def test_reading_a_folder_without_a_journal_is_one_line(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        read_journal(tmp_path / "missing")
    with pytest.raises(InputError, match=r"holds no journal files \(calls-\*.jsonl or feedback-\*.jsonl\)"):
        read_journal(tmp_path)
