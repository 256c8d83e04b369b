"""Reading a traffic journal folder back (serving/journal.py writes it): its calls, oldest first, each
with the feedback on it, and what the reading had to leave out.

A line that is no use is skipped and counted, never an error: an unfinished last line (cut by a crash,
or being written right now), a damaged one (not JSON, not a call or feedback, or text that is not valid
UTF-8: a lone surrogate escape, which no writer of the journal produces), a call line whose request id
an earlier line has (the first is kept; ids whose repeats carry another text are named in the log), and
feedback whose call is not in the folder (its file removed by retention).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchgen_router.errors import InputError
from benchgen_router.serving.journal import FILE_PATTERNS, journal_files

logger = logging.getLogger("benchgen_router.serving.journal")

LINE_KINDS = ("call", "feedback")
IDS_LOGGED = 10  # ids with conflicting lines named in the log; the rest are counted


@dataclass
class JournalReading:
    """A journal folder as read: its calls, oldest first, each with a "feedback" list (the feedback lines
    naming its request id, from any file, oldest first), and the lines left out."""

    calls: list[dict[str, Any]] = field(default_factory=list)
    unfinished_lines: int = 0
    damaged_lines: int = 0
    repeated_calls: int = 0  # call lines whose request id an earlier line has
    conflicting_ids: list[str] = field(default_factory=list)  # request ids repeated with another text
    orphan_feedback: int = 0  # feedback lines whose call is not in the folder


def _valid_text(row: dict[str, Any]) -> bool:
    """Whether every text of a line is valid UTF-8 (json reads a lone surrogate escape into a str that is not)."""
    try:
        for value in row.values():
            if isinstance(value, str):
                value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _lines(path: Path, reading: JournalReading) -> Iterator[dict[str, Any]]:
    """The whole, sound lines of one journal file; the others are counted in `reading`, with a warning
    naming file and line."""
    try:
        data = path.read_bytes()
    except OSError as err:
        logger.warning("traffic journal: cannot read %s (%s); skipped", path, err.strerror or err)
        return
    lines = data.split(b"\n")
    for number, raw in enumerate(lines, start=1):
        if not raw:
            continue
        if number == len(lines):  # no newline after it: cut by a crash, or being written right now
            reading.unfinished_lines += 1
            logger.warning(
                "traffic journal: %s line %d is unfinished (cut by a crash, or still being written); skipped",
                path,
                number,
            )
            return
        try:
            row = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            row = None
        if not isinstance(row, dict) or row.get("kind") not in LINE_KINDS:
            reading.damaged_lines += 1
            logger.warning("traffic journal: %s line %d is damaged; skipped", path, number)
            continue
        if not _valid_text(row):
            reading.damaged_lines += 1
            logger.warning("traffic journal: %s line %d holds text that is not valid UTF-8; skipped", path, number)
            continue
        yield row


def _same_text(first: dict[str, Any], other: dict[str, Any]) -> bool:
    return all(first.get(key) == other.get(key) for key in ("text_sha256", "text"))


def read_journal(folder: str | Path) -> JournalReading:
    """The journal in `folder` (the folder given to serve --journal), read whole."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"journal folder {folder} does not exist; pass the folder given to serve --journal.")
    files = journal_files(folder)
    if not files:
        patterns = " or ".join(FILE_PATTERNS)
        raise InputError(f"{folder} holds no journal files ({patterns}); pass the folder given to serve --journal.")
    reading = JournalReading()
    calls: dict[str, dict[str, Any]] = {}
    unnamed: list[dict[str, Any]] = []
    feedback: list[dict[str, Any]] = []
    conflicting: dict[str, None] = {}  # ordered, without repeats
    for path in files:
        for row in _lines(path, reading):
            request_id = row.get("request_id")
            if row["kind"] == "feedback":
                feedback.append(row)
            elif not isinstance(request_id, str):
                unnamed.append(row | {"feedback": []})
            elif request_id in calls:
                reading.repeated_calls += 1
                if not _same_text(calls[request_id], row):
                    conflicting[request_id] = None
            else:
                calls[request_id] = row | {"feedback": []}
    for row in sorted(feedback, key=lambda row: str(row.get("time"))):
        call = calls.get(row.get("request_id"))  # type: ignore[arg-type]
        if call is None:
            reading.orphan_feedback += 1
            continue
        call["feedback"].append({key: value for key, value in row.items() if key not in ("kind", "request_id")})
    reading.conflicting_ids = list(conflicting)
    reading.calls = sorted([*calls.values(), *unnamed], key=lambda row: str(row.get("time")))
    _log_left_out(folder, reading)
    return reading


def _log_left_out(folder: Path, reading: JournalReading) -> None:
    if reading.orphan_feedback:
        logger.warning(
            "traffic journal %s: %d feedback lines name requests not in the folder (their files were removed by "
            "retention); skipped",
            folder,
            reading.orphan_feedback,
        )
    if reading.repeated_calls:
        ids = reading.conflicting_ids
        named = ", ".join(ids[:IDS_LOGGED]) + (f" and {len(ids) - IDS_LOGGED} more" if len(ids) > IDS_LOGGED else "")
        logger.warning(
            "traffic journal %s: %d call lines repeat a request id an earlier line has (the first is kept)%s",
            folder,
            reading.repeated_calls,
            f"; {len(ids)} of those ids carry another text: {named}" if ids else "",
        )
