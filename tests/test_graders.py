"""The answer graders: hand-written responses for each grader, and the pilot's 900 recorded calls
graded again (scripts/regrade_pilot.py), which must come out as the pilot graded them."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading

import pytest

from benchgen_router.errors import InputError
from benchgen_router.graders import GRADERS, Graded, grade
from helpers import NO_PILOT, PILOT, run_tool
from scripts.regrade_pilot import REASONS, agreement, regrade

needs_pilot = pytest.mark.skipif(not (PILOT / "rewards.v1-pilot.jsonl").exists(), reason=NO_PILOT)


@pytest.mark.parametrize(
    ("response", "answer", "expected"),
    [
        ("Answer: 16", "16", Graded("16", True)),
        ("Answer: 109.", "109", Graded("109", True)),  # a sentence's period is not a decimal point
        ("Answer: 2 hours", "5", Graded("2", False)),
        ("Answer: 1,234", "1234", Graded("1234", True)),
        ("Answer: $1,234.50", "1234.5", Graded("1234.50", True)),
        ("Answer: 12%", "12", Graded("12", True)),
        ("Answer: \u22125", "-5", Graded("-5", True)),  # the Unicode minus sign
        ("Answer: **16**", "16", Graded("16", True)),
        ("Answer: 16.0", "16", Graded("16.0", True)),
        ("Answer: 16.01", "16", Graded("16.01", False)),  # within REL_TOL only
        ("Answer: 1.6e1", "16", Graded("1.6e1", True)),
        ("Answer: 120°", "120^\\circ", Graded("120", True)),  # the answer's number, its unit aside
        ("Answer: 16 (2016 mod 1000)", "16", Graded("16", True)),  # the first number of the answer line
        ("Answer: 3\nWait, I recount.\nAnswer: 4", "4", Graded("4", True)),  # the last answer line counts
        ("We need 5 boxes of 8, so 40", "40", Graded("40", True)),  # no answer line: the last number
        ("Answer: unknown", "16", Graded(None, False)),
    ],
)
def test_numeric_match(response: str, answer: str, expected: Graded) -> None:
    assert grade("numeric_match", response, answer) == expected


@pytest.mark.parametrize(
    ("response", "answer", "expected"),
    [
        ("Answer: B", "B", Graded("B", True)),
        ("Answer: B", "C", Graded("B", False)),
        ("**Answer: B**", "B", Graded("B", True)),
        ("Answer: (C)", "C", Graded("C", True)),
        ("Answer: C.", "C", Graded("C", True)),
        ("Answer: D. the proton", "D", Graded("D", True)),
        ("answer: c", "C", Graded("C", True)),  # a letter alone may be lower case
        ("Answer: a large atom", "A", Graded(None, False)),  # ... but "a" in a sentence is a word
        ("Answer: Option J", "J", Graded("J", True)),
        ("Answer: A\nOn second thought:\nAnswer: C", "C", Graded("C", True)),
        ("The best option is B", "B", Graded("B", True)),  # no answer line: the last line
        ("Answer: none of them", "A", Graded(None, False)),
    ],
)
def test_mcq_letter(response: str, answer: str, expected: Graded) -> None:
    assert grade("mcq_letter", response, answer) == expected


@pytest.mark.parametrize(
    ("response", "answer", "expected"),
    [
        ("\\[\n\\boxed{10}\n\\]", "10", Graded("10", True)),
        ("so $x = \\boxed{\\frac12}$.", "\\frac{1}{2}", Graded("\\frac12", True)),
        ("\\boxed{\\dfrac{448}{15625}}", "\\frac{448}{15625}", Graded("\\dfrac{448}{15625}", True)),
        ("\\boxed{0.5}", "\\frac{1}{2}", Graded("0.5", True)),
        ("\\boxed{10080}", "10,\\!080", Graded("10080", True)),  # LaTeX's thousands separator
        ("\\boxed{72^\\circ}", "72", Graded("72^\\circ", True)),
        ("\\boxed{(x-1)(x+1)}", "x^2-1", Graded("(x-1)(x+1)", True)),
        ("\\boxed{12.5}", "12", Graded("12.5", False)),
        ("First \\boxed{2}, then I fix it: \\boxed{3}", "3", Graded("3", True)),  # the last box counts
        ("\\boxed{\\frac{6}{16}}", "\\frac{3}{8}", Graded("\\frac{6}{16}", True)),  # nested braces
        ("-256", "-256", Graded("-256", True)),  # no box: the last line
        ("work\n\\boxed{\\frac{1", "\\frac{1}{2}", Graded("\\boxed{\\frac{1", False)),  # cut off: the last line
        ("\\boxed{}", "1", Graded(None, False)),
    ],
)
def test_math_expression(response: str, answer: str, expected: Graded) -> None:
    assert grade("math_expression", response, answer) == expected


def test_math_expression_in_a_worker_thread() -> None:
    """math-verify's timeouts need the main thread; a collector grading in a thread pool must still
    get verdicts, not an error or a silent False."""
    results = []
    worker = threading.Thread(target=lambda: results.append(grade("math_expression", "\\boxed{0.5}", "\\frac12")))
    worker.start()
    worker.join()
    assert results == [Graded("0.5", True)]


def test_math_expression_without_math_verify(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "math_verify", None)  # as if the collect extra were not installed
    with pytest.raises(InputError, match=r"math-verify .*benchgen-router\[collect\]"):
        grade("math_expression", "\\boxed{1}", "1")


@pytest.mark.parametrize(
    ("response", "answer", "expected"),
    [
        ("Answer: 0.4 MG", "0.4 mg", Graded("0.4 MG", True)),
        ("Answer: Paris.", "Paris", Graded("Paris.", True)),
        ("Answer:  0.4\u202fmg ", "0.4 mg", Graded("0.4\u202fmg", True)),  # any whitespace run is one space
        ("**Answer:** Paris", "Paris", Graded("** Paris", True)),  # extracted as the pilot did, compared bare
        ("Answer: $10,578", "$10,578", Graded("$10,578", True)),
        ("Answer: 10,578", "$10,578", Graded("10,578", False)),  # the currency sign is part of the answer
        ("Answer: 30.0 torr", "30.0 torr, 26.3 torr", Graded("30.0 torr", False)),
        ("Answer: London\nAnswer: Paris", "Paris", Graded("Paris", True)),  # the last answer line counts
        ("Answer:\nParis", "Paris", Graded("Paris", True)),  # the answer on the line after the colon
        ("I believe it is Paris", "Paris", Graded("I believe it is Paris", False)),  # no answer line
        ("Work...\nAnswer:", "Paris", Graded("Answer:", False)),  # a bare "Answer:" answers nothing
    ],
)
def test_exact_match_ci(response: str, answer: str, expected: Graded) -> None:
    assert grade("exact_match_ci", response, answer) == expected


@pytest.mark.parametrize("grader", sorted(GRADERS))
@pytest.mark.parametrize("response", [None, "", "  \n\t "])
def test_no_response_is_no_answer(grader: str, response: str | None) -> None:
    assert grade(grader, response, "A") == Graded(None, False)


def test_the_graders_are_the_pilots() -> None:
    assert set(GRADERS) == {"numeric_match", "mcq_letter", "math_expression", "exact_match_ci"}


def test_a_task_row_grades_as_it_is() -> None:
    task = {"task_id": "t1", "prompt": "Q?", "answer": "B", "answer_type": "multiple_choice", "grader": "mcq_letter"}
    assert grade(raw_response="Answer: B", **task) == Graded("B", True)


def test_unknown_grader() -> None:
    with pytest.raises(InputError) as raised:
        grade("fuzzy_match", "Answer: B", "B")
    message = str(raised.value)
    assert "\n" not in message and "'fuzzy_match'" in message
    assert all(name in message for name in GRADERS)


def test_graded_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Graded("A", True).correct = False  # type: ignore[misc]


def test_grading_imports_neither_torch_nor_transformers() -> None:
    code = (
        "import sys; from benchgen_router.graders import grade\n"
        "assert grade('math_expression', '\\\\boxed{1}', '1').correct  # loads math-verify and sympy\n"
        "print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.fixture(scope="module")
def pilot_calls():
    return regrade(PILOT)


@needs_pilot
def test_pilot_extraction_is_reproduced(pilot_calls) -> None:
    assert len(pilot_calls) == 900
    assert agreement(pilot_calls, "extracted") >= 0.99
    for name in GRADERS:
        assert agreement([c for c in pilot_calls if c.grader == name], "extracted") >= 0.99, name


@needs_pilot
def test_pilot_verdicts_are_reproduced(pilot_calls) -> None:
    """The string graders agree with the pilot on >= 99% of verdicts. math_expression differs where
    math-verify passes an equal answer that the pilot's string comparison failed (10080 for 10,\\!080):
    every such call is explained in the script, and none goes the other way."""
    strings = [c for c in pilot_calls if c.grader != "math_expression"]
    assert agreement(strings, "correct") >= 0.99
    differing = [c for c in pilot_calls if c.recorded.correct != c.ours.correct]
    assert all(c.grader == "math_expression" and c.ours.correct and not c.recorded.correct for c in differing)
    assert {(c.task_id, c.recorded.extracted) for c in differing} == set(REASONS)


@needs_pilot
def test_the_pilots_string_rule_reproduces_every_recorded_verdict() -> None:
    """For extending a matrix graded by the pilot's rule, math_equivalence="string" grades like it."""
    calls = regrade(PILOT, math_equivalence="string")
    assert agreement(calls, "correct") >= 0.99 and agreement(calls, "extracted") >= 0.99
    assert all(c.agrees for c in calls)


def test_math_equivalence_by_value_or_by_the_pilots_strings() -> None:
    assert grade("math_expression", "\\boxed{10080}", "10,\\!080").correct
    assert not grade("math_expression", "\\boxed{10080}", "10,\\!080", math_equivalence="string").correct
    assert grade("math_expression", "\\boxed{\\dfrac{1}{ 2}}", "\\frac{1}{2}", math_equivalence="string").correct
    with pytest.raises(InputError, match="math_equivalence 'loose'"):
        grade("math_expression", "\\boxed{1}", "1", math_equivalence="loose")


@needs_pilot
def test_regrade_script_reports() -> None:
    done = run_tool("scripts/regrade_pilot.py", "--pilot", str(PILOT), timeout=120)
    assert done.returncode == 0, done.stderr
    assert "| all | 900 | 900/900 (100.0%) |" in done.stdout
    disagreements = [line for line in done.stdout.splitlines() if line.startswith("| math500/")]
    assert disagreements and not any("not explained yet" in line for line in disagreements)


def test_regrade_script_without_pilot(tmp_path) -> None:
    done = run_tool("scripts/regrade_pilot.py", "--pilot", str(tmp_path), timeout=120)
    assert done.returncode == 1
    assert str(tmp_path / "tasks.v1.jsonl") in done.stderr
