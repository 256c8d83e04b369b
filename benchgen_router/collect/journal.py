"""The journal: every finished call on disk the moment it finishes, so that a crash loses no paid answer.

A JSON-lines file next to the output (`calls.jsonl.journal`): a header naming the pool, then one
line per finished cell (task, agent, repetition) with its call record and what it was asked and
graded against, and for a judged answer a second line with the judge's verdict (written once the
judge has answered: a crash between the two asks the judge again on resume, never the agent). Each
line is one write() followed by fsync(), so a line is whole or, when the machine died inside that
write, an unterminated tail, which resuming drops (that one cell is asked again). The final files
are computed from the journal alone, so a resumed run and an uninterrupted one write the same rows.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchgen_router.collect.formats import CALL_FIELDS, Task
from benchgen_router.collect.judge import VERDICT_FIELDS, is_rating
from benchgen_router.errors import InputError, RouterError

logger = logging.getLogger("benchgen_router.collect")

FORMAT = "benchgen-router collect journal"
VERSION = 1

Cell = tuple[str, str, int]  # (task_id, agent, repetition)


class JournalInUse(InputError):
    """Another collect run holds the journal's lock: this run asked nothing."""


class JournalWriteFailed(RouterError):
    """The journal or an output could not be written (a full disk) after calls were made: the journal
    keeps every call that finished before, and --resume continues from it."""


class JournalLock:
    """An exclusive lock on a journal, held for a whole run: `<journal>.lock`, locked with flock(). The
    kernel releases it when the process ends, however it ends, so a crashed run never blocks the next;
    the file names the holder (pid, host, since when) for the run that is refused. Removed on release."""

    def __init__(self, journal: Path) -> None:
        self.path = journal.with_name(journal.name + ".lock")
        self._fd: int | None = None

    def acquire(self) -> JournalLock:
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            except OSError as err:
                raise InputError(
                    f"cannot create lock file {self.path} ({err.strerror}); pass another output path."
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 512).decode("utf-8", errors="replace").strip()
                os.close(fd)
                raise JournalInUse(
                    f"journal {self.path.with_suffix('')} is in use by another collect run "
                    f"({holder or 'starting'}); wait for it to end, or pass another output path."
                ) from None
            try:  # the file may have been removed by the run that just released it: lock the one in place
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        holder = f"pid {os.getpid()} on {socket.gethostname()} since {since}"
        with contextlib.suppress(OSError):  # the lock holds without its note (a full disk)
            os.ftruncate(fd, 0)
            os.pwrite(fd, holder.encode("utf-8"), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)  # while still locked: a run that opened it now sees another inode and retries
        os.close(self._fd)
        self._fd = None


@dataclass(frozen=True)
class Entry:
    """One finished cell as journaled."""

    task_id: str
    prompt_sha256: str
    grader: str
    answer: str
    call: Mapping[str, Any]

    @property
    def cell(self) -> Cell:
        return (self.task_id, self.call["agent"], self.call["repetition"])


def _fsync_folder(folder: Path) -> None:
    """Make a new file's name durable too (a crash right after creating it must not lose it)."""
    with contextlib.suppress(OSError):  # not every file system lets a folder be opened
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class Journal:
    """An open journal: the entries found in it (on resume) and an append-only handle."""

    def __init__(
        self,
        path: Path,
        fd: int,
        header: Mapping[str, Any],
        entries: dict[Cell, Entry],
        verdicts: dict[Cell, Mapping[str, Any]] | None = None,
    ) -> None:
        self.path = path
        self.header = dict(header)
        self.entries = entries
        self.verdicts = {} if verdicts is None else verdicts  # the judge's verdict per judged cell
        self._fd = fd

    @classmethod
    def create(cls, path: Path, pool_version: str, agents: Sequence[str], models: Sequence[str]) -> Journal:
        header = {"format": FORMAT, "version": VERSION, "pool_version": pool_version}
        header |= {"agents": list(agents), "models": list(models)}
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o666)
        except FileExistsError:
            raise InputError(f"journal {path} appeared while starting; is another collect run writing it?") from None
        except OSError as err:
            raise InputError(f"cannot create journal {path} ({err.strerror}); pass another output path.") from None
        journal = cls(path, fd, header, {})
        try:
            journal._write(header)
        except OSError as err:  # a full disk: no header-only or torn journal is left to resume from
            journal.close()
            path.unlink(missing_ok=True)
            raise InputError(
                f"cannot write journal {path} ({err.strerror}); free space or pass another output path."
            ) from None
        _fsync_folder(path.parent)
        return journal

    @classmethod
    def reopen(cls, path: Path, pool_version: str, agents: Sequence[str], models: Sequence[str]) -> Journal:
        """An existing journal, checked against this pool, its unterminated last line (if any) dropped."""
        try:
            data = path.read_bytes()
        except OSError as err:
            raise InputError(f"cannot read journal {path} ({err.strerror}).") from None
        whole = data[: data.rfind(b"\n") + 1]
        lines = whole.decode("utf-8", errors="replace").split("\n")[:-1]
        try:
            header = json.loads(lines[0]) if lines else None
        except json.JSONDecodeError:
            header = None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise InputError(f"{path} is not a collect journal; pass another output path.")
        expected = {"pool_version": pool_version, "agents": list(agents), "models": list(models)}
        for key, value in expected.items():
            if header.get(key) != value:
                raise InputError(
                    f"journal {path} was recorded with {key} {header.get(key)!r}, not this run's {value!r}; "
                    "resume it with the pool it was recorded with, or pass another output path."
                )
        entries: dict[Cell, Entry] = {}
        verdicts: dict[Cell, Mapping[str, Any]] = {}
        for number, line in enumerate(lines[1:], start=2):
            found = _entry(line, agents)
            if found is None:
                raise InputError(f"journal {path} line {number} is damaged; remove that line to resume.")
            if isinstance(found, Entry):
                entries.setdefault(found.cell, found)
            else:
                verdicts.setdefault(*found)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            if len(whole) < len(data):
                os.truncate(path, len(whole))
                logger.warning("journal %s: dropped an unfinished last line (that call is asked again)", path)
        except OSError as err:
            raise InputError(f"cannot append to journal {path} ({err.strerror}).") from None
        return cls(path, fd, header, entries, verdicts)

    def append(self, task: Task, call: Mapping[str, Any]) -> Entry:
        entry = Entry(task.task_id, task.prompt_sha256, task.grader, task.answer, call)
        self._write(
            {
                "task_id": entry.task_id,
                "prompt_sha256": entry.prompt_sha256,
                "grader": entry.grader,
                "answer": entry.answer,
                "call": dict(call),
            }
        )
        self.entries.setdefault(entry.cell, entry)
        return entry

    def append_verdict(self, cell: Cell, verdict: Mapping[str, Any]) -> None:
        """The judge's verdict on a journaled cell's answer (judge.VERDICT_FIELDS)."""
        task_id, agent, repetition = cell
        self._write({"task_id": task_id, "agent": agent, "repetition": repetition, "verdict": dict(verdict)})
        self.verdicts.setdefault(cell, verdict)

    def _write(self, row: Mapping[str, Any]) -> None:
        data = (json.dumps(row, allow_nan=False) + "\n").encode("ascii")  # escaped: any text, even lone surrogates
        while data:  # one write() in practice; a short write is continued, never dropped
            data = data[os.write(self._fd, data) :]
        os.fsync(self._fd)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


def _verdict(row: Mapping[str, Any], agents: Sequence[str]) -> tuple[Cell, Mapping[str, Any]] | None:
    verdict, task_id, agent, repetition = (row.get(key) for key in ("verdict", "task_id", "agent", "repetition"))
    if not isinstance(verdict, dict) or set(verdict) != set(VERDICT_FIELDS) or agent not in agents:
        return None
    if not isinstance(task_id, str) or not isinstance(repetition, int) or isinstance(repetition, bool):
        return None
    if verdict["rating"] is not None and not is_rating(verdict["rating"]):
        return None
    return (task_id, agent, repetition), verdict


def _entry(line: str, agents: Sequence[str]) -> Entry | tuple[Cell, Mapping[str, Any]] | None:
    """A journal line: a finished cell (Entry), a judge's verdict (cell, verdict), or None when damaged."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(row, dict):
        return None
    if "verdict" in row:
        return _verdict(row, agents)
    call = row.get("call")
    fields = (row.get("task_id"), row.get("prompt_sha256"), row.get("grader"), row.get("answer"))
    if not all(isinstance(value, str) for value in fields) or not isinstance(call, dict):
        return None
    repetition = call.get("repetition")
    if set(call) != set(CALL_FIELDS) or call.get("agent") not in agents:
        return None
    if not isinstance(repetition, int) or isinstance(repetition, bool) or repetition < 0:
        return None
    return Entry(*fields, call)
