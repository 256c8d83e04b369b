"""The answer graders: hand-written responses for each grader, and the pilot's 900 recorded calls
graded again (scripts/regrade_pilot.py), which must come out as the pilot graded them."""

from __future__ import annotations

import dataclasses
import logging
import math
import subprocess
import sys
import threading
import time

import pytest

from benchgen_router import graders
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
        # An answer offering two values names no answer: wrong, whichever the task's is.
        ("Answer: between 40 and 44", "40", Graded("40 and 44", False)),
        ("Answer: 40 or 44", "44", Graded("40 or 44", False)),
        ("Answer: 40-44", "40", Graded("40-44", False)),
        ("Answer: 40–44 apples", "40", Graded("40–44", False)),
        ("Answer: 3, 4", "3", Graded("3, 4", False)),
        ("We need 40 or 44", "44", Graded("40 or 44", False)),  # no answer line: the last two numbers
        ("Answer: 42 or 42.0", "42", Graded("42", True)),  # one value, written twice
        ("Answer: -3 or 3", "3", Graded("-3 or 3", False)),
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
        # An answer naming more than one option names no answer: wrong, whichever the task's is.
        ("Answer: A or B", "A", Graded("A or B", False)),
        ("Answer: (A) (B) (C) (D)", "A", Graded("(A) (B)", False)),
        ("Answer: either (A) or (C)", "C", Graded("(A) or (C)", False)),
        ("Answer: B/C", "B", Graded("B/C", False)),
        ("Answer: **A**, **D**", "D", Graded("**A**, **D**", False)),
        ("The answer is A or B", "A", Graded("A or B", False)),  # no answer line: the last line
        ("Answer: C, I think", "C", Graded("C", True)),  # "I" before a lower-case word is the pronoun
        ("Answer: C, I'm sure", "C", Graded("C", True)),
        ("Answer: B (B)", "B", Graded("B", True)),  # one option, twice
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
        # Alternatives are a set of values, equal to no single one (math-verify alone reads `\\lor`'s
        # last term: 3).
        ("\\boxed{x=2 \\lor x=3}", "3", Graded("x=2 \\lor x=3", False)),
        ("\\boxed{2 \\vee 3}", "2", Graded("2 \\vee 3", False)),
        ("\\boxed{2 \\text{ or } 3}", "3", Graded("2 \\text{ or } 3", False)),
        ("$\\boxed{2}$ or $\\boxed{3}$.", "3", Graded("\\boxed{2}$ or $\\boxed{3}", False)),  # boxed alternatives
        ("\\boxed{x=2 \\lor x=3}", "2, 3", Graded("x=2 \\lor x=3", True)),  # ... unless both are asked for
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


def test_math_verify_logs_quote_a_bounded_part_of_the_answer(monkeypatch, caplog) -> None:
    """math-verify logs the text it timed out on; a 600-character answer is cut to LOGGED_CHARS."""
    monkeypatch.setattr(graders, "MATH_TIMEOUT_S", 1)
    # A parse slower than the limit on any machine: how long sympy takes on this answer depends on the
    # CPU and on what it parsed before, so each LaTeX parse first sleeps past the limit (the alarm
    # interrupts the sleep), and nothing parsed earlier is served from math-verify's cache.
    parser = pytest.importorskip("math_verify.parser")
    latex2sympy = parser.latex2sympy

    def slow_latex2sympy(*args, **kwargs):
        time.sleep(5)
        return latex2sympy(*args, **kwargs)

    monkeypatch.setattr(parser, "latex2sympy", slow_latex2sympy)
    parser.parse_latex_cached.cache_clear()
    nested = "\\boxed{" + "(" * 300 + "1" + ")" * 300 + "}"
    with caplog.at_level(logging.WARNING, logger="math_verify"):
        assert grade("math_expression", nested, "1") == Graded(nested[7:-1], False)
    timeouts = [record.getMessage() for record in caplog.records if "Timeout during" in record.getMessage()]
    assert timeouts, "the answer did not time out: the test no longer reaches math-verify's warning"
    assert all(len(message) <= graders.LOGGED_CHARS + 30 for message in timeouts), timeouts


# The hedge rule (docs/collect.md, "Hedges") against a table of forms. Each hedge names two values,
# (x, y); it is graded wrong whichever of them the task's answer is, and extracted as written.
HEDGES = [
    # parenthesised alternatives
    ("mcq_letter", "Answer: A (or B)", ("A", "B"), "A (or B)"),
    ("mcq_letter", "Answer: (A) or possibly (B)", ("A", "B"), "(A) or possibly (B)"),
    ("numeric_match", "Answer: 40 (or 44)", ("40", "44"), "40 (or 44"),
    ("numeric_match", "Answer: 40 or maybe 44", ("40", "44"), "40 or maybe 44"),
    # pipes, semicolons, and/or, between options or values
    ("mcq_letter", "Answer: A | B", ("A", "B"), "A | B"),
    ("mcq_letter", "Answer: A; B", ("A", "B"), "A; B"),
    ("mcq_letter", "Answer: A and/or B", ("A", "B"), "A and/or B"),
    ("mcq_letter", "Answer: C vs. D", ("C", "D"), "C vs. D"),
    ("numeric_match", "Answer: 40 | 44", ("40", "44"), "40 | 44"),
    ("numeric_match", "Answer: 40; 44", ("40", "44"), "40; 44"),
    ("numeric_match", "Answer: 40 and/or 44", ("40", "44"), "40 and/or 44"),
    ("numeric_match", "Answer: 40%, or 44%", ("40", "44"), "40%, or 44"),
    # ranges: spaced dashes, slashes, dots
    ("numeric_match", "Answer: 40 - 44", ("40", "44"), "40 - 44"),
    ("numeric_match", "Answer: 40 – 44", ("40", "44"), "40 – 44"),
    ("numeric_match", "Answer: 40 / 44", ("40", "44"), "40 / 44"),
    ("numeric_match", "Answer: 40..44", ("40", "44"), "40..44"),
    ("numeric_match", "Answer: 40 ... 44", ("40", "44"), "40 ... 44"),
    ("numeric_match", "Answer: 40 ~ 44", ("40", "44"), "40 ~ 44"),
    ("numeric_match", "It takes 40-44 days", ("40", "44"), "40-44"),  # no answer line: the last two numbers
    # plus-or-minus: one value marked, or two joined
    ("numeric_match", "Answer: ±40", ("40", "-40"), "±40"),
    ("numeric_match", "Answer: +/-40", ("40", "-40"), "+/-40"),
    ("numeric_match", "Answer: x = \\pm 40", ("40", "-40"), "\\pm 40"),
    ("numeric_match", "Answer: 40 +/- 2", ("40", "42"), "40 +/- 2"),
    ("numeric_match", "Answer: 40+/-2", ("40", "42"), "40+/-2"),
    ("numeric_match", "Answer: 40±2", ("40", "38"), "40±2"),
    ("math_expression", "\\boxed{\\pm 3}", ("3", "-3"), "\\pm 3"),
    ("math_expression", "\\boxed{3 \\pm 1}", ("4", "2"), "3 \\pm 1"),
    # two boxes joined as alternatives
    ("math_expression", "\\boxed{2}; \\boxed{3}", ("2", "3"), "\\boxed{2}; \\boxed{3}"),
    ("math_expression", "\\boxed{2} | \\boxed{3}", ("2", "3"), "\\boxed{2} | \\boxed{3}"),
    ("math_expression", "\\boxed{2} \\text{ and/or } \\boxed{3}", ("2", "3"), "\\boxed{2} \\text{ and/or } \\boxed{3}"),
    (
        "math_expression",
        "\\boxed{2}\\quad\\text{or}\\quad\\boxed{3}",
        ("2", "3"),
        "\\boxed{2}\\quad\\text{or}\\quad\\boxed{3}",
    ),
    # alternatives inside one box: a divides-sign, a lone bar, \lor
    ("math_expression", "\\boxed{2 \\mid 3}", ("2", "3"), "2 \\mid 3"),
    ("math_expression", "\\boxed{2 | 3}", ("2", "3"), "2 | 3"),
    ("math_expression", "\\boxed{x=2 \\lor x=3}", ("2", "3"), "x=2 \\lor x=3"),
]
# Forms of one value, each graded against the answer it names: a minus sign, a negative number, a
# fraction, a date, a ratio, a decimal, an absolute value, the same value twice; and a form the task's
# own answer has (an interval or range that is the answer asked for).
NOT_HEDGES = [
    ("numeric_match", "Answer: -40", "-40", "-40"),
    ("numeric_match", "Answer: \u221240", "-40", "-40"),  # the Unicode minus sign
    ("numeric_match", "Answer: x = -40", "-40", "-40"),
    ("numeric_match", "Answer: 3/4", "3/4", "3"),  # a fraction: numeric_match reads its numerator
    ("numeric_match", "Answer: 2024-01-05", "2024", "2024"),
    ("numeric_match", "Answer: 1/5/2024", "1", "1"),
    ("numeric_match", "Answer: 3:2", "3", "3"),
    ("numeric_match", "Answer: 12:30", "12", "12"),
    ("numeric_match", "Answer: 40.5", "40.5", "40.5"),
    ("numeric_match", "Answer: 1,234", "1234", "1234"),
    ("numeric_match", "Answer: 40-40", "40", "40"),
    ("numeric_match", "Answer: 16 (2016 mod 1000)", "16", "16"),
    ("numeric_match", "Answer: 40-44", "40-44", "40"),  # the task's answer is that range
    ("numeric_match", "Answer: ±3", "±3", "3"),
    ("numeric_match", "Answer: [2, 5]", "[2, 5]", "2"),
    ("mcq_letter", "Answer: B - the proton", "B", "B"),
    ("mcq_letter", "Answer: A (not B)", "A", "A"),
    ("mcq_letter", "Answer: C. I think so", "C", "C"),
    ("math_expression", "\\boxed{-5}", "-5", "-5"),
    ("math_expression", "\\boxed{\\frac{3}{2}}", "3/2", "\\frac{3}{2}"),
    ("math_expression", "\\boxed{3:2}", "3:2", "3:2"),
    ("math_expression", "\\boxed{0.75}", "\\frac34", "0.75"),
    ("math_expression", "\\boxed{|x-3|}", "|x-3|", "|x-3|"),
    ("math_expression", "\\boxed{[2, 5]}", "[2,5]", "[2, 5]"),  # an interval asked for
    ("math_expression", "\\boxed{(2, 5)}", "(2,5)", "(2, 5)"),
    ("math_expression", "\\boxed{2 \\mid 3}", "2, 3", "2 \\mid 3"),  # both values asked for
    ("math_expression", "First \\boxed{2}, then I fix it: \\boxed{3}", "3", "3"),  # a correction
]


@pytest.mark.parametrize(("grader", "response", "values", "written"), HEDGES)
def test_a_hedge_is_wrong_whichever_value_it_names(grader, response, values, written):
    for answer in values:
        assert grade(grader, response, answer) == Graded(written, False), answer


@pytest.mark.parametrize(("grader", "response", "answer", "extracted"), NOT_HEDGES)
def test_one_value_however_written_is_an_answer(grader, response, answer, extracted):
    assert grade(grader, response, answer) == Graded(extracted, True)


# Inputs that a backtracking pattern takes quadratic time on: long runs where a pattern could split
# its match many ways, or restart at every position.
WORST_CASES = {
    "numeric_match": lambda n: "The answer" + " " * n + "is 42",
    "mcq_letter": lambda n: "Answer:" + " " * (n // 2) + "**" + " " * (n // 2) + "x",
    "exact_match_ci": lambda n: "answer **" + "\n" * n + "x",
    "math_expression": lambda n: "\\boxed {" * (n // 8),
    "hedged letters": lambda n: "Answer: " + "(" * (n // 3) + "A" + ")" * (n // 3) + " " * (n // 3) + "B",
    "hedged numbers": lambda n: "Answer: " + "1" * (n // 3) + " " * (n // 3) + "or" + " " * (n // 3) + "2",
    "hedged boxes": lambda n: "\\boxed{" + "{" * n + "} or \\boxed{1}",
    "plus-or-minus": lambda n: "Answer: " + " +/-" * (n // 4) + "1",
    "dotted range": lambda n: "Answer: 1" + "." * n + "2",
}


@pytest.mark.parametrize("case", sorted(WORST_CASES))
def test_the_patterns_take_linear_time(case: str) -> None:
    """Ten times the input may take at most twenty times as long (quadratic would be a hundred), plus
    slack for a busy machine: relative to a baseline measured in the same test, so no CPU's speed
    matters. The sizes stay under GRADED_CHARS, past which the graders read no more."""
    grader = {"hedged letters": "mcq_letter", "hedged boxes": "math_expression"}.get(case, "numeric_match")
    grader = case if case in GRADERS else grader
    small, large = 6_000, 60_000
    assert len(WORST_CASES[case](large)) <= graders.GRADED_CHARS

    def seconds(n: int) -> float:
        response = WORST_CASES[case](n)
        best = math.inf
        for _ in range(3):
            started = time.perf_counter()
            grade(grader, response, "1", math_equivalence="string")
            best = min(best, time.perf_counter() - started)
        return best

    baseline = seconds(small)
    assert seconds(large) <= 20 * baseline + 0.05, (case, baseline)


def test_a_response_is_graded_on_its_tail() -> None:
    """A 10 MB response grades like its last GRADED_CHARS characters, quickly."""
    filler = "x" * 10_000_000
    assert grade("numeric_match", "Answer: 7\n" + filler + "\nAnswer: 42", "42") == Graded("42", True)
    assert grade("numeric_match", "Answer: 42\n" + filler, "42").extracted is None


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
def test_no_pilot_answer_reads_as_a_hedge(pilot_calls) -> None:
    """Hedges are graded wrong, and none of the pilot's option or number answers is one: each reads as a
    single letter or number (for math, the verdict tests above pin that no verdict changed)."""
    for call in pilot_calls:
        read = call.ours.extracted
        if call.grader == "mcq_letter":
            assert read is None or len(read) == 1, (call.task_id, read)
        elif call.grader == "numeric_match":
            assert read is None or graders.NUMBER.fullmatch(read), (call.task_id, read)


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
