"""The traffic journal: one JSON line per gateway call and per feedback, in size-rotated files.

`TrafficJournal` is the writer the gateway holds. Recording puts the line on a queue and returns; one
background thread writes it, so the event loop never waits on a disk. A full disk or an unwritable
folder is one warning and a count (`write_failures`), never an exception in the caller: the journal
must not cost an answer.

The folder may be shared by several processes (replicas, restarts):

- each process appends to its own files, `calls-<host>-<pid>-<n>.jsonl`, so lines never interleave;
  a file grows to `max_file_bytes`, then the next is started, and the folder keeps at most `max_files`
  finished files (the oldest are removed; a file a live writer holds locked is never removed);
- the folder's key, `.key` (32 random bytes, mode 0600, created once, whole, by whichever process comes
  first), signs request ids, so that any process on the folder recognises an id another one issued
  (feedback sent to another replica, or after a restart) and refuses a forged one;
- the same key salts the hash of the routed text (`text_sha256`): one prompt hashes the same in every
  process, for deduplication, while the hash is useless to guess prompts without the key. The text
  itself is stored only with `keep_text`, because prompts are users' data.

Each line is one write() to a file opened for appending, made as soon as the writer thread takes it
from the queue; a write that fails halfway is cut back, and the file is synced whenever the queue runs
empty and on close(). A killed process loses the lines still queued (none, or the one being written,
unless the disk lags behind the traffic) and a machine crash what was not yet synced; an earlier line
is never corrupted.
`read_journal` reads a folder back: it skips an unfinished last line with one warning naming file and
line, and joins each feedback to its call by request id, across files.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import hmac
import json
import logging
import os
import queue
import re
import secrets
import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchgen_router.errors import InputError

logger = logging.getLogger("benchgen_router.serving.journal")

KEY_FILE = ".key"
KEY_BYTES = 32
FILE_PATTERN = "calls-*.jsonl"
ID_PREFIX = "bgr-"
QUEUE_LIMIT = 100_000  # lines waiting for the disk; beyond it lines are dropped and counted, memory stays bounded
_STOP = object()


def _now() -> str:
    """UTC time with microseconds, in a form that sorts as text."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _safe_host() -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "host"


def _create_key(path: Path) -> None:
    """Write a new key under a private name (O_EXCL, 0600), then link it into place: link() fails when
    another process's key is there already, so exactly one key wins and no process reads a half-written one."""
    spare = path.with_name(f"{KEY_FILE}.{_safe_host()}-{os.getpid()}-{secrets.token_hex(4)}.tmp")
    fd = os.open(spare, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, secrets.token_bytes(KEY_BYTES))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(spare, path)
    except FileExistsError:
        pass
    finally:
        spare.unlink(missing_ok=True)


def _folder_key(folder: Path) -> bytes | None:
    """The folder's key, created when it has none; None when it can be neither read nor created."""
    path = folder / KEY_FILE
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            _create_key(path)
        key = path.read_bytes()
    except OSError as err:
        logger.warning(
            "traffic journal: cannot read or create the key %s (%s); request ids are recognised by this "
            "process only, and text hashes will not match other processes'",
            path,
            err.strerror or err,
        )
        return None
    if len(key) != KEY_BYTES:
        logger.warning(
            "traffic journal: the key %s is damaged (%d bytes, not %d); request ids are recognised by this "
            "process only. Remove the folder's journal (key and files) to start afresh.",
            path,
            len(key),
            KEY_BYTES,
        )
        return None
    return key


def _held_by_a_writer(path: Path) -> bool:
    """Whether a live writer holds the file (its current file, locked while open)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


class TrafficJournal:
    """Appends one JSON line per gateway call (and per feedback) to size-rotated files in `folder`.

    Writes happen on one background thread; `record_call`/`record_feedback` never block and never
    raise. `write_failures` counts the lines that could not be written."""

    def __init__(
        self, folder: Path, *, keep_text: bool = False, max_file_bytes: int = 64 << 20, max_files: int = 16
    ) -> None:
        if max_file_bytes < 1 or max_files < 1:
            raise InputError(f"max_file_bytes and max_files must be positive, not {max_file_bytes} and {max_files}.")
        self.folder = Path(folder)
        self.keep_text = keep_text
        self.max_file_bytes = max_file_bytes
        self.max_files = max_files
        self.write_failures = 0
        self._key = _folder_key(self.folder) or secrets.token_bytes(KEY_BYTES)
        self._prefix = f"calls-{_safe_host()}-{os.getpid()}-"
        self._number = 0
        self._fd: int | None = None
        self._path: Path | None = None
        self._size = 0
        self._failing = False  # in a run of failures: warned once already
        self._count_lock = threading.Lock()
        self._closed = False
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=QUEUE_LIMIT)
        self._thread = threading.Thread(target=self._write_loop, name="traffic-journal", daemon=True)
        self._thread.start()
        atexit.register(self.close)  # lines still queued at a normal exit are written, not lost

    # -- request ids and hashes ------------------------------------------------------------------

    def _sign(self, random_part: str) -> str:
        return hmac.new(self._key, b"request-id:" + random_part.encode("ascii"), hashlib.sha256).hexdigest()[:32]

    def new_request_id(self) -> str:
        """An unguessable id that any journal on this folder recognises."""
        random_part = secrets.token_hex(12)
        return f"{ID_PREFIX}{random_part}-{self._sign(random_part)}"

    def known_request_id(self, request_id: str) -> bool:
        """True iff a journal on this folder issued `request_id`."""
        if not isinstance(request_id, str) or not request_id.startswith(ID_PREFIX):
            return False
        random_part, _, signature = request_id[len(ID_PREFIX) :].partition("-")
        if not re.fullmatch(r"[0-9a-f]{24}", random_part) or not signature:
            return False
        return hmac.compare_digest(signature, self._sign(random_part))

    def text_hash(self, text: str) -> str:
        """The routed text's salted hash: the same for one text in every process on this folder."""
        return hmac.new(self._key, b"text:" + text.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()

    # -- recording -------------------------------------------------------------------------------

    def record_call(self, entry: dict[str, Any], text: str | None) -> None:
        """Journal one gateway call: `entry` plus time, kind, the text's salted hash and, with keep_text,
        the text."""
        line = {"time": _now(), "kind": "call", **entry}
        line["text_sha256"] = None if text is None else self.text_hash(text)
        if self.keep_text:
            line["text"] = text
        self._put(line)

    def record_feedback(self, request_id: str, score: float, comment: str | None) -> None:
        """Journal a feedback score for a request; the comment is user text, kept only with keep_text."""
        line: dict[str, Any] = {"time": _now(), "kind": "feedback", "request_id": request_id, "score": score}
        if self.keep_text and comment is not None:
            line["comment"] = comment
        self._put(line)

    def _put(self, line: dict[str, Any]) -> None:
        if self._closed:
            self._failed(1, "the journal is closed")
            return
        try:
            self._queue.put_nowait(line)
        except queue.Full:
            self._failed(1, f"{QUEUE_LIMIT} lines are waiting for the disk")

    def _failed(self, lines: int, why: str) -> None:
        with self._count_lock:
            self.write_failures += lines
            first = not self._failing
            self._failing = True
        if first:
            logger.warning(
                "traffic journal %s: cannot write (%s); lines are dropped and counted until writing works again, "
                "answers are not affected",
                self.folder,
                why,
            )

    # -- the writer thread -----------------------------------------------------------------------

    def _write_loop(self) -> None:
        stop = False
        while not stop:
            batch = [self._queue.get()]
            with contextlib.suppress(queue.Empty):
                while len(batch) < 1024:
                    batch.append(self._queue.get_nowait())
            wrote = False
            for item in batch:
                if item is _STOP:
                    stop = True
                else:
                    wrote = self._write_line(item) or wrote
            if wrote:
                self._sync()
        self._close_file()

    def _write_line(self, line: dict[str, Any]) -> bool:
        try:
            data = (json.dumps(line, default=str, allow_nan=False) + "\n").encode("ascii")
        except ValueError as err:  # a NaN score or the like: a caller's bug, never worth an exception here
            self._failed(1, f"a line could not be encoded: {err}")
            return False
        try:
            if self._fd is None or (self._size > 0 and self._size + len(data) > self.max_file_bytes):
                self._open_next()
            assert self._fd is not None
            written = 0
            try:
                while written < len(data):
                    written += os.write(self._fd, data[written:])
            except OSError:
                if written:  # cut back the half-written line, so the next one starts on a line of its own
                    os.ftruncate(self._fd, self._size)
                raise
        except OSError as err:
            self._close_file()  # reopened (a new file) on the next line: the disk may have been freed
            self._failed(1, f"{err.strerror or err}")
            return False
        self._size += written
        if self._failing:
            with self._count_lock:
                self._failing = False
            logger.warning("traffic journal %s: writing again (%d lines lost so far)", self.folder, self.write_failures)
        return True

    def _open_next(self) -> None:
        self._close_file()
        self.folder.mkdir(parents=True, exist_ok=True)
        while True:
            self._number += 1
            path = self.folder / f"{self._prefix}{self._number}.jsonl"
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
                break
            except FileExistsError:  # a file of an earlier process that had this pid: never append to it
                continue
        fcntl.flock(fd, fcntl.LOCK_EX)  # marks the file as being written: never removed while held
        self._fd, self._path, self._size = fd, path, 0
        self._remove_oldest()

    def _remove_oldest(self) -> None:
        """Keep the folder within `max_files` finished files (its writers' current files aside)."""
        try:
            files = sorted(self.folder.glob(FILE_PATTERN), key=_age)
        except OSError:
            return
        finished = [path for path in files if path != self._path and not _held_by_a_writer(path)]
        for path in finished[: max(0, len(finished) - self.max_files)]:
            with contextlib.suppress(OSError):
                path.unlink()

    def _sync(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.fsync(self._fd)

    def _close_file(self) -> None:
        if self._fd is not None:
            self._sync()
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        """Write every queued line, sync and close the file. Later records are dropped and counted."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join()
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)


def _age(path: Path) -> tuple[float, str]:
    try:
        return (path.stat().st_mtime, path.name)
    except OSError:
        return (0.0, path.name)


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    """The whole lines of one journal file; an unfinished last line or a damaged line is skipped with a
    warning naming file and line."""
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
            logger.warning(
                "traffic journal: %s line %d is unfinished (cut by a crash, or still being written); skipped",
                path,
                number,
            )
            return
        try:
            row = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            row = None
        if not isinstance(row, dict) or row.get("kind") not in ("call", "feedback"):
            logger.warning("traffic journal: %s line %d is damaged; skipped", path, number)
            continue
        yield row


def read_journal(folder: Path) -> Iterator[dict[str, Any]]:
    """The calls journaled in `folder`, oldest first, each with a "feedback" list (the feedback lines
    naming its request id, from any file, oldest first). Feedback whose call is not in the folder (its
    file rotated away) is counted in one warning."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"journal folder {folder} does not exist; pass the folder given to serve --journal.")
    files = sorted(folder.glob(FILE_PATTERN))
    if not files:
        raise InputError(f"{folder} holds no journal files ({FILE_PATTERN}); pass the folder given to serve --journal.")
    calls: dict[str, dict[str, Any]] = {}
    unnamed: list[dict[str, Any]] = []
    feedback: list[dict[str, Any]] = []
    for path in files:
        for row in _lines(path):
            if row["kind"] == "feedback":
                feedback.append(row)
            elif isinstance(row.get("request_id"), str):
                calls.setdefault(row["request_id"], row | {"feedback": []})
            else:
                unnamed.append(row | {"feedback": []})
    orphans = 0
    for row in sorted(feedback, key=lambda row: str(row.get("time"))):
        call = calls.get(row.get("request_id"))  # type: ignore[arg-type]
        if call is None:
            orphans += 1
            continue
        call["feedback"].append({key: value for key, value in row.items() if key not in ("kind", "request_id")})
    if orphans:
        logger.warning(
            "traffic journal %s: %d feedback lines name requests not in the folder (their files were rotated away); "
            "skipped",
            folder,
            orphans,
        )
    yield from sorted([*calls.values(), *unnamed], key=lambda row: str(row.get("time")))
