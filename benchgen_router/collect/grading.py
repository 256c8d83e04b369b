"""Grading a run's answers off its event loop, each within a time limit.

The string graders (numeric_match, mcq_letter, exact_match_ci, and math_expression by the pilot's string
rule) run where they are called: their patterns take time linear in the answer, and they read at most
its last GRADED_CHARS characters, so they take milliseconds. collect calls them in a worker thread.

math_expression by value asks math-verify (sympy), whose time has no such bound: `\\boxed{9^{9^{9^{9}}}}`
took 5 s, until math-verify's own limit stopped it, on collect's event loop, and every call in flight
waited. math-verify's limits are SIGALRM alarms, which only a main thread can set, and a thread cannot be
stopped from outside; sympy can also sit inside one long C call that no signal interrupts. So these answers
are graded in worker processes, each a grader's main thread, and each grade is given GRADE_TIME_LIMIT_S of
wall-clock time: a worker past it is killed (and replaced for the next answer), and the answer is graded
wrong, as math-verify grades what it times out on, and counted (`timed_out`). A worker that dies while
grading counts the same.
"""

from __future__ import annotations

import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

from benchgen_router.errors import InputError
from benchgen_router.graders import GRADED_CHARS, Graded, grade, math_extracted

logger = logging.getLogger("benchgen_router.collect")

# A grade by math-verify takes tens of milliseconds; a worker gets this long (its start aside) before
# the answer is graded wrong. math-verify's own limit, 5 s per parse and per comparison, was what
# stopped `\boxed{9^{9^{9^{9}}}}` before.
GRADE_TIME_LIMIT_S = 5.0
# A worker's start: Python, then math-verify and sympy (half a second alone; more on a busy machine).
WORKER_START_S = 120.0
WORKER_CODE = "from benchgen_router.collect.grading import serve; serve()"
READY = "ready"


def by_worker(grader: str, equivalence: str) -> bool:
    """Whether answers of `grader` are graded in a worker process (math-verify's): see the module."""
    return grader == "math_expression" and equivalence == "value"


class _WorkerGone(Exception):
    """The worker exited (killed, out of memory) before it answered."""


class _Worker:
    """One grading process: a request line in, a verdict line out, over its stdin and stdout."""

    def __init__(self) -> None:
        package_root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
        self.process = subprocess.Popen(
            [sys.executable, "-c", WORKER_CODE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,  # Ctrl-C in a terminal reaches the run, which stops its workers itself
        )
        self._pending = b""
        assert self.process.stdout is not None
        self._replies = select.poll()  # not select(): a run may hold file descriptors past its 1024
        self._replies.register(self.process.stdout, select.POLLIN)
        try:
            reply = self.read(WORKER_START_S)
        except _WorkerGone:
            reply = None
        if reply != READY:
            self.kill()
            why = reply.get("error") if isinstance(reply, dict) else f"it exited with code {self.process.returncode}"
            raise InputError(f"cannot start a grading worker ({why}).")

    def read(self, timeout_s: float) -> object:
        """The worker's next reply; None when none came within `timeout_s`."""
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0 or not self._replies.poll(left * 1000):
                return None
            chunk = os.read(self.process.stdout.fileno(), 65536)
            if not chunk:
                raise _WorkerGone
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return json.loads(line)

    def ask(self, request: list[str], timeout_s: float) -> object:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write((json.dumps(request) + "\n").encode("ascii"))
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            raise _WorkerGone from None
        return self.read(timeout_s)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()


class Graders:
    """The graders of one run, with `equivalence` (graders.MATH_EQUIVALENCES) for math. grade() may be
    called from several threads at once; at most `workers` answers are graded in worker processes at a
    time, each worker started when first needed. A grade is remembered for the run, so that writing the
    files after asking does not grade an answer again. close() ends the workers."""

    def __init__(self, equivalence: str, workers: int, time_limit_s: float = GRADE_TIME_LIMIT_S) -> None:
        self.equivalence, self.time_limit_s = equivalence, time_limit_s
        self._slots = threading.BoundedSemaphore(workers)
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._closed = False
        self._known: dict[tuple[str, str, str], Graded] = {}
        self._timed_out: set[tuple[str, str, str]] = set()

    def grade(self, grader: str, raw_response: str | None, answer: str) -> Graded:
        """The task's grader's verdict on a response (graders.grade), in time: see the module."""
        if raw_response is None or not raw_response.strip() or not by_worker(grader, self.equivalence):
            return grade(grader, raw_response, answer, self.equivalence)
        key = (grader, raw_response, answer)
        with self._lock:
            known = self._known.get(key)
        if known is not None:
            return known
        with self._slots:
            worker = self._worker()
            try:
                reply = worker.ask([grader, raw_response[-GRADED_CHARS:], answer, self.equivalence], self.time_limit_s)
            except _WorkerGone:
                reply = None
            except BaseException:  # Ctrl-C while waiting: the worker's reply would be read by no one
                worker.kill()
                raise
            if reply is None:
                worker.kill()
                graded = Graded(math_extracted(raw_response[-GRADED_CHARS:]), False)
                with self._lock:
                    self._timed_out.add(key)
            else:
                self._release(worker)
                if isinstance(reply, dict):  # the grader refused the task (InputError), as in this process
                    raise InputError(str(reply.get("error")))
                extracted, correct = reply  # type: ignore[misc]
                graded = Graded(extracted, bool(correct))
        with self._lock:
            self._known[key] = graded
        return graded

    def timed_out(self, grader: str, raw_response: str | None, answer: str) -> bool:
        """Whether this response was graded wrong because its grade ran past the time limit."""
        return raw_response is not None and (grader, raw_response, answer) in self._timed_out

    def _worker(self) -> _Worker:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return _Worker()

    def _release(self, worker: _Worker) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(worker)
                return
        worker.kill()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.kill()


def serve(stdin: IO[str] = sys.stdin) -> None:
    """A grading worker's loop (WORKER_CODE): one JSON request per line, [grader, response, answer,
    equivalence]; one JSON reply per line, [extracted, correct] or {"error": ...}. Nothing else reaches
    its stdout: what a library prints goes to stderr."""
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="ascii")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    # The parent bounds each grade; math-verify's notice that its own limits are off is expected.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    try:  # math-verify and sympy load before the first timed grade
        grade("math_expression", "\\boxed{1}", "1", signal_limits=False)
    except InputError as err:
        print(json.dumps({"error": str(err)}), file=replies, flush=True)
        return
    print(json.dumps(READY), file=replies, flush=True)
    for line in stdin:
        grader, response, answer, equivalence = json.loads(line)
        try:
            graded = grade(grader, response, answer, equivalence, signal_limits=False)
            reply: object = [graded.extracted, graded.correct]
        except InputError as err:
            reply = {"error": str(err)}
        print(json.dumps(reply), file=replies, flush=True)
