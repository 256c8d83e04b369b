"""Answer graders: pull the final answer out of an agent's response and judge it against the task's.

Each task names its grader in its `grader` field. Extraction follows the answer format that the
task's prompt asks for, and reproduces how the pilot reward matrix (`rewards.v1-pilot.jsonl`)
extracted its answers, so that a new matrix is graded like the old one:

- `Answer: ...` prompts (numeric_match, mcq_letter, exact_match_ci): the text after the last
  `Answer:`; a model that breaks the line after the colon has its answer on the next line.
- `\\boxed{}` prompts (math_expression): the content of the last `\\boxed{...}`, braces balanced.
- A response without that marker falls back to its last non-empty line.

    from benchgen_router.graders import grade
    grade("mcq_letter", "... Answer: (C)", "C")      # Graded(extracted='C', correct=True)
    grade(raw_response=response, **task_row)        # a task row carries `grader` and `answer`
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

from benchgen_router.errors import InputError

# `Answer:` (or `**Answer**:`), any case; `\s*` may cross a line break, `.+` ends at the line's end.
ANSWER = re.compile(r"answer\s*(?:\*\*|__)?\s*:\s*(.+)", re.IGNORECASE)
BOXED = re.compile(r"\\boxed\s*\{")
# A number as written in an answer: thousands separators, a decimal part, an exponent.
NUMBER = re.compile(r"[-+]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?")
# Option letters are A-J (MMLU-Pro has ten options); a letter counts when no other letter touches it.
LETTER = re.compile(r"(?<![A-Za-z])([A-J])(?![A-Za-z])")
MARKUP = "*_`"  # markdown emphasis and code marks around an answer
# Numbers this close count as equal: the pilot's numeric answers are integers, so the rule only has
# to absorb how a number is written ("16.0", "1.6e1"), not rounding.
REL_TOL = 1e-6
# math-verify's per-call limits (seconds). They use SIGALRM, which only the main thread may set;
# elsewhere math-verify raises, so a grader running in a worker thread runs without them.
MATH_TIMEOUT_S = 5


@dataclass(frozen=True)
class Graded:
    """What a grader read as the response's final answer (None: no answer found), and its verdict."""

    extracted: str | None
    correct: bool


# How math_expression judges an extracted answer: by value (math-verify), or by the pilot's rule, the
# strings equal once spaces are dropped and \dfrac read as \frac, for extending a matrix graded so.
MATH_EQUIVALENCES = ("value", "string")


def grade(
    grader: str, raw_response: str | None, answer: str, math_equivalence: str = "value", **task: object
) -> Graded:
    """Grade one response with the task's grader. `task` takes the rest of a task row (prompt,
    answer_type, ...) so that a whole row can be passed; the graders need only its answer."""
    try:
        function = GRADERS[grader]
    except KeyError:
        raise InputError(f"unknown grader {grader!r}; the known graders are {', '.join(sorted(GRADERS))}.") from None
    if math_equivalence not in MATH_EQUIVALENCES:
        raise InputError(f"math_equivalence {math_equivalence!r} is not one of {', '.join(MATH_EQUIVALENCES)}.")
    if raw_response is None or not raw_response.strip():
        return Graded(None, False)
    if function is math_expression:
        return math_expression(raw_response, answer, math_equivalence)
    return function(raw_response, answer)


def numeric_match(raw_response: str, answer: str) -> Graded:
    """The first number of the answer line (`Answer: 2 hours` is 2) or, with no answer line, the
    last number of the last line, equal to the answer's number within REL_TOL."""
    after = answer_text(raw_response)
    numbers = find_numbers(last_line(raw_response) if after is None else after)
    if not numbers:
        return Graded(None, False)
    extracted = numbers[-1] if after is None else numbers[0]
    expected = find_numbers(answer)
    correct = bool(expected) and math.isclose(float(extracted), float(expected[0]), rel_tol=REL_TOL)
    return Graded(extracted, correct)


def mcq_letter(raw_response: str, answer: str) -> Graded:
    """The option letter of the answer line, or of the last line when there is none."""
    text = answer_text(raw_response)
    letter = option_letter(last_line(raw_response) if text is None else text)
    return Graded(letter, letter is not None and letter == answer.strip().upper())


def math_expression(raw_response: str, answer: str, equivalence: str = "value") -> Graded:
    """The last `\\boxed{}` (else the last line), equal in value to the answer by math-verify:
    `\\frac12` and `0.5` match `\\frac{1}{2}`, and `10080` matches `10,\\!080`, which the pilot's
    string comparison failed. With `equivalence="string"`, that comparison instead."""
    boxed = last_boxed(raw_response)
    extracted = last_line(raw_response) if boxed is None else boxed
    if not extracted:
        return Graded(None, False)
    if equivalence == "string":
        return Graded(extracted, pilot_string(extracted) == pilot_string(answer))
    try:  # sympy and ANTLR load only when a math answer is graded
        from math_verify import parse, verify
    except ImportError as err:
        raise InputError(
            f"the math_expression grader needs math-verify ({err.name} is missing): "
            "pip install 'benchgen-router[collect]'."
        ) from None

    limit = MATH_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    gold = parse(f"${answer}$", parsing_timeout=limit)
    target = parse(extracted if boxed is None else f"\\boxed{{{boxed}}}", parsing_timeout=limit)
    return Graded(extracted, bool(gold and target and verify(gold, target, timeout_seconds=limit)))


def exact_match_ci(raw_response: str, answer: str) -> Graded:
    """The answer line (else the last line) equal to the answer once both are case-folded, their
    whitespace runs made one space, and surrounding markdown marks and a final period removed."""
    text = answer_text(raw_response)
    extracted = last_line(raw_response) if text is None else text
    return Graded(extracted, comparable_text(extracted) == comparable_text(answer))


def pilot_string(text: str) -> str:
    return "".join(text.split()).replace("\\dfrac", "\\frac")


GRADERS: dict[str, Callable[..., Graded]] = {
    "numeric_match": numeric_match,
    "mcq_letter": mcq_letter,
    "math_expression": math_expression,
    "exact_match_ci": exact_match_ci,
}


def answer_text(response: str) -> str | None:
    """What follows the last `Answer:`, stripped; None when no `Answer:` is followed by any text."""
    found = ANSWER.findall(response)
    return found[-1].strip() if found else None


def last_line(response: str) -> str:
    """The last non-empty line, stripped."""
    return next((line.strip() for line in reversed(response.splitlines()) if line.strip()), "")


def last_boxed(response: str) -> str | None:
    """The content of the last `\\boxed{...}`; None when there is none or its braces never close
    (a response cut off by the token limit)."""
    starts = list(BOXED.finditer(response))
    if not starts:
        return None
    depth, begin = 1, starts[-1].end()
    for index in range(begin, len(response)):
        depth += {"{": 1, "}": -1}.get(response[index], 0)
        if depth == 0:
            return response[begin:index].strip()
    return None


def find_numbers(text: str) -> list[str]:
    """The numbers in `text`, thousands separators removed ("1,234.5" is "1234.5")."""
    text = text.replace("\u2212", "-")  # the Unicode minus sign that models and LaTeX renderers write
    return [match.replace(",", "") for match in NUMBER.findall(text)]


def option_letter(text: str) -> str | None:
    """The option an answer names: its leading capital letter (`(C)`, `**B**`, `D. the proton`), a
    letter alone in any case (`b`), or else its last free-standing capital letter (`Option B`)."""
    leading = re.match(r"[\s*_`(\[]*([A-J])(?![A-Za-z])", text) or re.fullmatch(r"[\W_]*([A-Ja-j])[\W_]*", text)
    if leading:
        return leading.group(1).upper()
    letters = LETTER.findall(text)
    return letters[-1] if letters else None


def comparable_text(text: str) -> str:
    """`text` as exact_match_ci compares it."""
    text = " ".join(text.split()).strip(MARKUP + " ")
    return text.removesuffix(".").rstrip().casefold()
