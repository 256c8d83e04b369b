"""collect/grading.py: math answers graded by math-verify in worker processes, each grade within a time
limit that a stuck worker cannot outlast; the string graders where they are called. Real processes, real
math-verify, no mocks."""

from __future__ import annotations

import threading
import time

import psutil
import pytest

from benchgen_router.collect.grading import Graders
from benchgen_router.graders import Graded, grade

pytest.importorskip("math_verify")
HOSTILE = "\\boxed{9^{9^{9^{9}}}}"  # math-verify's comparison runs until something stops it


def workers_of(graders: Graders) -> list[psutil.Process]:
    return [psutil.Process(worker.process.pid) for worker in graders._idle]


def test_a_grade_past_the_limit_is_wrong_counted_and_its_worker_replaced():
    graders = Graders("value", workers=1, time_limit_s=1.0)
    try:
        assert graders.grade("math_expression", "so \\boxed{\\frac12}", "0.5") == Graded("\\frac12", True)
        (first,) = workers_of(graders)
        started = time.perf_counter()
        assert graders.grade("math_expression", HOSTILE, "1") == Graded("9^{9^{9^{9}}}", False)
        assert time.perf_counter() - started < 3.0  # the limit, not math-verify's own 5 s (or sympy's hours)
        assert graders.timed_out("math_expression", HOSTILE, "1")
        assert not graders.timed_out("math_expression", "so \\boxed{\\frac12}", "0.5")
        assert not first.is_running()  # killed, and reaped
        # The next answer gets a new worker, and a verdict.
        assert graders.grade("math_expression", "\\boxed{10080}", "10,\\!080") == Graded("10080", True)
        (second,) = workers_of(graders)
        assert second.pid != first.pid
    finally:
        graders.close()
    assert not second.is_running()


def test_a_grade_is_made_once_per_run():
    graders = Graders("value", workers=1, time_limit_s=1.0)
    try:
        graders.grade("math_expression", HOSTILE, "1")
        started = time.perf_counter()
        assert graders.grade("math_expression", HOSTILE, "1") == Graded("9^{9^{9^{9}}}", False)
        assert time.perf_counter() - started < 0.1
        assert graders.grade("math_expression", HOSTILE, "2").correct is False  # another task: graded again
        assert graders.timed_out("math_expression", HOSTILE, "2")
    finally:
        graders.close()


def test_grades_run_in_parallel_from_threads_and_agree_with_the_grader():
    cases = [
        ("\\boxed{0.5}", "\\frac{1}{2}"),
        ("\\boxed{12.5}", "12"),
        ("\\boxed{(x-1)(x+1)}", "x^2-1"),
        ("\\boxed{x=2 \\lor x=3}", "3"),
        ("\\boxed{72^\\circ}", "72"),
        ("no box at all\n-256", "-256"),
    ]
    graders = Graders("value", workers=2)
    results: dict[int, Graded] = {}

    def grade_one(i: int, response: str, answer: str) -> None:
        results[i] = graders.grade("math_expression", response, answer)

    try:
        threads = [threading.Thread(target=grade_one, args=(i, *case)) for i, case in enumerate(cases * 3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(graders._idle) == 2  # no more workers than asked for
    finally:
        graders.close()
    assert [results[i] for i in range(len(cases) * 3)] == [grade("math_expression", *case) for case in cases] * 3


def test_string_graders_and_the_pilots_string_rule_start_no_worker():
    graders = Graders("string", workers=1)
    assert graders.grade("math_expression", "\\boxed{10080}", "10,\\!080") == Graded("10080", False)
    assert graders.grade("numeric_match", "Answer: 16", "16") == Graded("16", True)
    assert graders.grade("math_expression", "", "1") == Graded(None, False)
    assert graders._idle == []
    graders.close()
