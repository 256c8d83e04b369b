"""The traffic journal: one JSON line per gateway call and per feedback, in files kept within a budget
of bytes and of days.

`TrafficJournal` is the writer the gateway holds. Recording puts the line on a queue and returns; one
background thread writes it, so the event loop never waits on a disk. A line that cannot be written is
dropped and counted, never an exception in the caller: the journal must not cost an answer.

Files. The folder may be shared by several processes (replicas, restarts); each appends to its own
files, so lines never interleave: calls to `calls-<host>-<pid>-<n>.jsonl`, feedback to
`feedback-<host>-<pid>-<n>.jsonl`. A file is finished when the next line would take it past an eighth
of its kind's budget (at most 64 MiB), or when it is a day old, and the next one is started.

Retention (`Retention`): when a file is started, and every ten minutes, a finished file whose last
line is older than `max_days` is removed, and each kind is brought within its own share of `max_bytes`
by removing its oldest finished files: calls keep three quarters, feedback one quarter. So feedback,
however much of it comes, only ever pushes out older feedback, never the calls `collect --from-journal`
reads. A file that a live writer holds (locked) is never removed. Removed files are counted (by kind
and reason) and logged.

Feedback is bounded: FEEDBACK_PER_REQUEST lines per request id (a user who rates an answer, changes
their mind a few times, or a client that retries); more is refused and counted (`feedback_refused`).

The folder's key, `.key` (32 random bytes, mode 0600, created once, whole, by whichever process comes
first), signs request ids, so that any process on the folder recognises an id another one issued
(feedback sent to another replica, or after a restart) and refuses a forged one; it also salts the
hash of the routed text (`text_sha256`): one prompt hashes the same in every process, for
deduplication, while the hash is useless to guess prompts without the key. The text itself is stored
only with `keep_text`, because prompts are users' data, and at most TEXT_MAX_CHARS of it, the most the
gateway routes on. A text that was cut, by the gateway or here, is marked `text_truncated`: the caller
says whether it cut it, since a text of exactly that length may be whole or cut.

Failures. Each line is one write() to a file opened for appending; a write that fails halfway is cut
back. A failed write (a full disk) never starts a new file, so it never makes retention remove one:
the writer keeps its file and tries the next line there. The first failure is one ERROR in the log,
writing again one WARNING; meanwhile `failure` says why and `write_failures` counts the lines lost.
A killed process loses the lines still queued and a machine crash what was not yet synced (the files
are synced whenever the queue runs empty, and on close()); an earlier line is never corrupted.
The reader is serving/journal_reading.py.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import fcntl
import hashlib
import hmac
import json
import logging
import math
import os
import queue
import re
import secrets
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchgen_router.errors import setting_error

logger = logging.getLogger("benchgen_router.serving.journal")

KEY_FILE = ".key"
KEY_BYTES = 32
KINDS = ("calls", "feedback")
FILE_PATTERNS = tuple(f"{kind}-*.jsonl" for kind in KINDS)
ID_PREFIX = "bgr-"
QUEUE_LIMIT = 100_000  # lines waiting for the disk; beyond it lines are dropped and counted, memory stays bounded
# Retention's defaults. The calls' 768 MiB of 1 GiB hold 1.4 million calls journaled as hashes, or 510,000
# with a prompt of a thousand characters each (measured, docs/gateway.md): far more than a collect sample
# takes, and small beside a server's disk. 30 days: a retraining round samples the recent traffic, and
# prompts stored with their text are users' data, not to be kept without end.
DEFAULT_MAX_BYTES = 1 << 30
DEFAULT_MAX_DAYS = 30.0
RETENTION_FLAGS = {"max_bytes": "--journal-max-bytes", "max_days": "--journal-max-days"}  # the command line's
SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
FEEDBACK_SHARE = 0.25  # of max_bytes; calls keep the rest
MIN_MAX_BYTES = 1024  # a budget of a few lines: less would keep nothing
MAX_FILE_BYTES = 64 << 20
FILES_PER_BUDGET = 8  # a kind's files are an eighth of its budget: retention removes history in eighths
FILE_MAX_AGE_S = 86400.0  # a file is finished after a day, so that retention by days is a day late at most
RETENTION_CHECK_S = 600.0
# The gateway routes on at most this many characters of a prompt (serving/gateway.py cuts there); the
# journal keeps no more, and marks a text it cuts.
TEXT_MAX_CHARS = 65536
# Feedback lines per request id: one rating, changed a few times or retried by a client. Counted per
# process over the FEEDBACK_IDS_TRACKED ids most recently rated (a bounded memory).
FEEDBACK_PER_REQUEST = 10
FEEDBACK_IDS_TRACKED = 100_000
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


def check_journal_folder(folder: str | os.PathLike) -> None:
    """Refuse, in one line, a folder the journal could never write: one that cannot be created (a file
    in its path, no permission) or in which no file can be created (a read-only file system). Creates
    the folder. A full disk passes: it may be freed, and the journal reports it while it lasts."""
    path = Path(folder).expanduser()
    if path.exists() and not path.is_dir():
        raise setting_error(f"{{journal={folder}}} is a file; pass a folder (it is created when missing).")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".probe-{_safe_host()}-{os.getpid()}-{secrets.token_hex(4)}"
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        probe.unlink()
    except OSError as err:
        raise setting_error(
            f"{{journal={folder}}} cannot be written ({err.strerror or err}); pass a folder this user can create "
            "and write."
        ) from None


@dataclass(frozen=True)
class Retention:
    """How much of the journal a folder keeps: `max_bytes` in all (calls three quarters, feedback one
    quarter), and nothing older than `max_days`."""

    max_bytes: int = DEFAULT_MAX_BYTES
    max_days: float = DEFAULT_MAX_DAYS

    def __post_init__(self) -> None:
        size, days = self.max_bytes, self.max_days
        if isinstance(size, bool) or not isinstance(size, int) or size < MIN_MAX_BYTES:
            raise setting_error(
                f"journal retention: {{max_bytes}} must be a whole number >= {MIN_MAX_BYTES}, got {size!r}.",
                RETENTION_FLAGS,
            )
        if isinstance(days, bool) or not isinstance(days, int | float) or not (math.isfinite(days) and days > 0):
            raise setting_error(
                f"journal retention: {{max_days}} must be a number of days > 0, got {days!r}.", RETENTION_FLAGS
            )

    def budget(self, kind: str) -> int:
        feedback = int(self.max_bytes * FEEDBACK_SHARE)
        return feedback if kind == "feedback" else self.max_bytes - feedback

    def file_bytes(self, kind: str) -> int:
        return max(1, min(MAX_FILE_BYTES, self.budget(kind) // FILES_PER_BUDGET))


def service_retention(max_bytes: int | None, max_days: float | None) -> Retention:
    """The retention a service's settings ask for, each left as None taking its default; one line when out
    of range."""
    return Retention(
        DEFAULT_MAX_BYTES if max_bytes is None else max_bytes, DEFAULT_MAX_DAYS if max_days is None else max_days
    )


def parse_max_bytes(text: str) -> int:
    """A retention's bytes as a person writes them: 1073741824, 512M, 512MiB, 1.5GiB (K, M, G and T are
    binary, as MiB and GiB); 1GB is refused rather than guessed at (a thousand or 1024 cubed)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*(?:([KMGT])(?:iB)?)?\s*", text, re.IGNORECASE)
    if match is None:
        raise setting_error(
            f"{{journal_max_bytes={text}}} is not a size; pass a number of bytes, or one with K, M, G or T, which are "
            "binary (512M or 512MiB, 1G or 1GiB)."
        )
    number, unit = match.groups()
    return int(float(number) * SIZE_UNITS[(unit or "").upper()])


def parse_max_days(text: str) -> float:
    """A retention's days as a person writes them: 30, 0.5."""
    try:
        return float(text)
    except ValueError:
        raise setting_error(f"{{journal_max_days={text}}} is not a number of days; pass one, e.g. 30 or 0.5.") from None


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


@dataclass
class _Series:
    """The files of one kind this process writes: the open one, its size, and when it was started."""

    kind: str
    prefix: str
    fd: int | None = None
    path: Path | None = None
    size: int = 0
    started: float = 0.0  # time.monotonic()
    number: int = 0


class TrafficJournal:
    """Appends one JSON line per gateway call (and per feedback) to files in `folder`, kept within
    `retention`.

    Writes happen on one background thread; `record_call`/`record_feedback` never block and never
    raise. `write_failures` counts the lines that could not be written, `failure` says why the last one
    failed (None while writing works), `feedback_refused` counts feedback over FEEDBACK_PER_REQUEST,
    and `removed()` the files retention removed."""

    def __init__(
        self, folder: str | os.PathLike, *, keep_text: bool = False, retention: Retention | None = None
    ) -> None:
        self.folder = Path(folder)
        self.keep_text = keep_text
        self.retention = retention or Retention()
        self.write_failures = 0
        self.feedback_refused = 0
        self.failure: str | None = None
        self._removed: collections.Counter[tuple[str, str]] = collections.Counter()  # (kind, reason): files
        self._removed_bytes: collections.Counter[tuple[str, str]] = collections.Counter()
        self._feedback_given: dict[str, int] = {}  # request id -> feedback lines, in order of the latest
        self._key = _folder_key(self.folder) or secrets.token_bytes(KEY_BYTES)
        self._series = {kind: _Series(kind, f"{kind}-{_safe_host()}-{os.getpid()}-") for kind in KINDS}
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

    def record_call(self, entry: dict[str, Any], text: str | None, text_truncated: bool = False) -> None:
        """Journal one gateway call: `entry` plus time, kind, the text's salted hash, whether the text was
        cut (`text_truncated`: the caller cut it, as the gateway does at the length it routes on, or the
        journal did, to TEXT_MAX_CHARS) and, with keep_text, the text."""
        if text is not None and len(text) > TEXT_MAX_CHARS:
            text, text_truncated = text[:TEXT_MAX_CHARS], True
        line = {"time": _now(), "kind": "call", **entry}
        line["text_sha256"] = None if text is None else self.text_hash(text)
        line["text_truncated"] = text is not None and text_truncated
        if self.keep_text:
            line["text"] = text
        self._put(line)

    def record_feedback(self, request_id: str, score: float, comment: str | None) -> bool:
        """Journal a feedback score for a request; the comment is user text, kept only with keep_text.
        False when the request has had its FEEDBACK_PER_REQUEST already: refused, counted, and logged
        once per request id."""
        with self._count_lock:
            given = self._feedback_given.pop(request_id, 0)
            self._feedback_given[request_id] = given + 1  # re-inserted: the oldest rated id comes first
            if len(self._feedback_given) > FEEDBACK_IDS_TRACKED:
                del self._feedback_given[next(iter(self._feedback_given))]
            refused = given >= FEEDBACK_PER_REQUEST
            if refused:
                self.feedback_refused += 1
        if refused:
            if given == FEEDBACK_PER_REQUEST:
                logger.warning(
                    "traffic journal %s: request %s has had its %d feedback lines; more feedback for it is refused "
                    "and counted",
                    self.folder,
                    request_id,
                    FEEDBACK_PER_REQUEST,
                )
            return False
        line: dict[str, Any] = {"time": _now(), "kind": "feedback", "request_id": request_id, "score": score}
        if self.keep_text and comment is not None:
            line["comment"] = comment
        self._put(line)
        return True

    def removed(self) -> dict[tuple[str, str], tuple[int, int]]:
        """What retention removed so far: (files, bytes) per (kind, reason), reason "age" or "size"."""
        with self._count_lock:
            return {key: (files, self._removed_bytes[key]) for key, files in self._removed.items()}

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
            first = self.failure is None
            self.failure = why
        if first:
            logger.error(
                "traffic journal %s: cannot write (%s); the journal is not being written: lines are dropped and "
                "counted until writing works again, answers are not affected",
                self.folder,
                why,
            )

    def _working(self) -> None:
        if self.failure is None:
            return
        with self._count_lock:
            self.failure = None
        logger.warning("traffic journal %s: writing again (%d lines lost so far)", self.folder, self.write_failures)

    # -- the writer thread -----------------------------------------------------------------------

    def _write_loop(self) -> None:
        stop = False
        next_check = time.monotonic() + RETENTION_CHECK_S
        while not stop:
            batch = []
            with contextlib.suppress(queue.Empty):
                batch.append(self._queue.get(timeout=max(0.0, next_check - time.monotonic())))
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
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + RETENTION_CHECK_S
                self._check_age()
        for series in self._series.values():
            self._finish(series)

    def _write_line(self, line: dict[str, Any]) -> bool:
        try:
            data = (json.dumps(line, default=str, allow_nan=False) + "\n").encode("ascii")
        except ValueError as err:  # a NaN score or the like: a caller's bug, never worth an exception here
            self._failed(1, f"a line could not be encoded: {err}")
            return False
        series = self._series["feedback" if line["kind"] == "feedback" else "calls"]
        try:
            if series.fd is None or self._due(series, len(data)):
                self._start_file(series)
            self._append(series, data)
        except OSError as err:  # the file is kept: a failed write never starts another, nor removes one
            self._failed(1, f"{err.strerror or err}")
            return False
        self._working()
        return True

    def _due(self, series: _Series, size: int) -> bool:
        """Whether the series' file is finished: `size` more bytes would pass its size, or it is a day old."""
        full = series.size > 0 and series.size + size > self.retention.file_bytes(series.kind)
        return full or time.monotonic() - series.started > FILE_MAX_AGE_S

    def _append(self, series: _Series, data: bytes) -> None:
        assert series.fd is not None
        written = 0
        try:
            while written < len(data):
                written += os.write(series.fd, data[written:])
        except OSError:
            if written:  # cut back the half-written line, so the next one starts on a line of its own
                try:
                    os.ftruncate(series.fd, series.size)
                except OSError:
                    self._finish(series)  # the half line ends this file; the reader skips it
            raise
        series.size += written

    def _start_file(self, series: _Series) -> None:
        self._finish(series)
        self.folder.mkdir(parents=True, exist_ok=True)
        while True:
            series.number += 1
            path = self.folder / f"{series.prefix}{series.number}.jsonl"
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
                break
            except FileExistsError:  # a file of an earlier process that had this pid: never append to it
                continue
        fcntl.flock(fd, fcntl.LOCK_EX)  # marks the file as being written: never removed while held
        series.fd, series.path, series.size, series.started = fd, path, 0, time.monotonic()
        self._retain(series.kind)

    def _check_age(self) -> None:
        """Every RETENTION_CHECK_S: finish a file that is a day old (however quiet the traffic), so that
        retention by days can remove it, then apply retention."""
        for series in self._series.values():
            if series.fd is not None and time.monotonic() - series.started > FILE_MAX_AGE_S:
                self._finish(series)
            self._retain(series.kind)

    def _retain(self, kind: str) -> None:
        """Remove `kind`'s finished files older than max_days, then its oldest until they leave room within
        its budget for this process's current file to fill."""
        current = self._series[kind].path
        try:
            files = [(path, path.stat()) for path in self.folder.glob(f"{kind}-*.jsonl") if path != current]
        except OSError:
            return
        files.sort(key=lambda item: (item[1].st_mtime, item[0].name))
        oldest = time.time() - self.retention.max_days * 86400
        total = sum(stat.st_size for _, stat in files) + self.retention.file_bytes(kind)
        for path, stat in files:
            old = stat.st_mtime < oldest
            if not old and total <= self.retention.budget(kind):
                continue
            if _held_by_a_writer(path):
                continue
            try:
                path.unlink()
            except OSError:
                continue
            total -= stat.st_size
            self._count_removed(kind, "age" if old else "size", path, stat.st_size)

    def _count_removed(self, kind: str, reason: str, path: Path, size: int) -> None:
        with self._count_lock:
            self._removed[kind, reason] += 1
            self._removed_bytes[kind, reason] += size
        why = (
            f"older than {self.retention.max_days:g} days"
            if reason == "age"
            else f"the {kind} kept are over their {self.retention.budget(kind)} bytes"
        )
        # Removal by age is the policy at work; by size, history lost to volume: worth an operator's eye.
        level = logging.INFO if reason == "age" else logging.WARNING
        logger.log(level, "traffic journal %s: removed %s (%d bytes): %s", self.folder, path.name, size, why)

    def _sync(self) -> None:
        for series in self._series.values():
            if series.fd is not None:
                with contextlib.suppress(OSError):
                    os.fsync(series.fd)

    def _finish(self, series: _Series) -> None:
        if series.fd is not None:
            with contextlib.suppress(OSError):
                os.fsync(series.fd)
            with contextlib.suppress(OSError):
                os.close(series.fd)
            series.fd, series.path = None, None

    def close(self) -> None:
        """Write every queued line, sync and close the files. Later records are dropped and counted."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join()
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)


def journal_files(folder: Path) -> Sequence[Path]:
    """The journal's files in `folder`, calls and feedback, by name."""
    return sorted(path for pattern in FILE_PATTERNS for path in folder.glob(pattern))
