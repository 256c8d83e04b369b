"""Answer graders: pull the final answer out of an agent's response and judge it against the task's.

Each task names its grader in its `grader` field. Extraction follows the answer format that the
task's prompt asks for, and reproduces how the pilot reward matrix (`rewards.v1-pilot.jsonl`)
extracted its answers, so that a new matrix is graded like the old one:

- `Answer: ...` prompts (numeric_match, mcq_letter, exact_match_ci): the text after the last
  `Answer:`; a model that breaks the line after the colon has its answer on the next line.
- `\\boxed{}` prompts (math_expression): the content of the last `\\boxed{...}`, braces balanced.
- A response without that marker falls back to its last non-empty line.
- An answer that names two different options or values as alternatives is a hedge, graded wrong
  whatever it names. The rule (docs/collect.md, "Hedges"): the value a grader reads and its
  neighbour of the same kind are alternatives when nothing stands between them but fillers
  (spaces, brackets, emphasis) and at least one joiner, a word or mark that offers a choice or a
  range (`or`, `and/or`, `to`, `,`, `;`, `|`, a spaced `/`, a dash between numbers, `..`, `±`,
  `\\lor`, ...); a value marked plus-or-minus names two. What writes one value is no joiner: a
  sign, a decimal point, an unspaced `/` (a fraction), a chain of three numbers (a date), a colon.
  A form the task's own answer has (`40-44`) is compared, not refused.

Every pattern runs in time linear in the response, and a grader reads at most the last
GRADED_CHARS characters of it (where its final answer is), so a hostile answer cannot stall a run.

    from benchgen_router.graders import grade
    grade("mcq_letter", "... Answer: (C)", "C")      # Graded(extracted='C', correct=True)
    grade(raw_response=response, **task_row)        # a task row carries `grader` and `answer`
"""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

from benchgen_router.errors import InputError

# `Answer:` (or `**Answer**:`), any case; `\s*` may cross a line break, `.+` ends at the line's end.
# No two `\s*` may touch (`\s*(?:\*\*)?\s*` splits a run of n spaces n ways: quadratic).
ANSWER = re.compile(r"answer\s*(?:(?:\*\*|__)\s*)?:\s*(.+)", re.IGNORECASE)
BOXED = re.compile(r"\\boxed\s*\{")
# A number as written in an answer: thousands separators, a decimal part, an exponent. A number
# written from its decimal point (`.5`) starts after no digit or point: `40..44` is 40 and 44.
NUMBER = re.compile(r"[-+]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|(?<![.\d])\.\d+)(?:[eE][-+]?\d+)?")
# Option letters are A-J (MMLU-Pro has ten options); a letter counts when no other letter touches it.
LETTER = re.compile(r"(?<![A-Za-z])([A-J])(?![A-Za-z])")
OPTION_MARKS = "*_`()[]"  # brackets and emphasis around an option letter
# Hedges (docs/collect.md, "Hedges"). Words that offer a choice or a range between two values:
JOIN_WORDS = r"or|and/or|and|nor|to|through|thru|versus|vs\.?|maybe|possibly|perhaps|probably|otherwise"
JOIN_WORD = rf"(?<![A-Za-z])(?:{JOIN_WORDS})(?![A-Za-z])"
PLUS_MINUS = r"±|∓|\+\s*/\s*-|\+-|\\pm(?![A-Za-z])|\\mp(?![A-Za-z])"  # one value marked: two values
# Between two numbers: fillers (spaces, brackets, emphasis, a unit sign) around at least one joiner:
# a word, a mark of a list or a choice, plus-or-minus, a dash or dots of a range, a slash. (An unspaced
# slash is a fraction, and a dash that is the second number's sign a range only when nothing else
# joins them: see hedged_numbers.)
NUMBER_FILLER = r"[\s*_`$%°()\[\]]"
NUMBER_JOINT = re.compile(
    rf"{NUMBER_FILLER}*(?:(?:{JOIN_WORD}|{PLUS_MINUS}|[,;|&~/…]|\.{{2,}}|[-–—]){NUMBER_FILLER}*)+", re.IGNORECASE
)
MARKED_PLUS_MINUS = re.compile(rf"(?:{PLUS_MINUS}){NUMBER_FILLER}*$")
# Between two option letters: fillers around at least one joiner (a dash is not one: `B - the proton`
# explains B), or a bracket opening before the second letter: `(A) (B)` lists options.
LETTER_FILLER = r"[\s.*_`()\[\]]"
LETTER_JOINT = re.compile(rf"{LETTER_FILLER}*(?:(?:{JOIN_WORD}|[,;|/&+]){LETTER_FILLER}*)+", re.IGNORECASE)
LETTER_LIST = re.compile(r"[*_`)\]]*\.?\s+[(\[][*_`]*")
# Between two boxes: spaces, punctuation, LaTeX spacing, and joiners, words or marks, bare or in \text{}.
# Anything else (`First \boxed{2}, then I fix it: \boxed{3}`) makes the later box a correction.
BOX_JOINT = re.compile(
    rf"(?:[\s$.,;|&~/]|\\[,;:! ]|\\q?quad(?![A-Za-z])|\\text\{{\s*(?:{JOIN_WORDS})\s*\}}"
    rf"|\\(?:lor|vee|mid)(?![A-Za-z])|{JOIN_WORD})*",
    re.IGNORECASE,
)
# Inside one box, `\lor`, `\vee` and `\mid` join alternatives; math-verify reads `x=2 \lor x=3` as its last
# term, 3, so they are written as the list separator it reads as a set: {2, 3}, which equals no single
# value. So is a lone `|` (bars in pairs are absolute values; `\|` is a norm).
DISJUNCTION = re.compile(r"\\(?:lor|vee|mid)(?![A-Za-z])")
BAR = re.compile(r"(?<!\\)\|")
MARKUP = "*_`"  # markdown emphasis and code marks around an answer
# Numbers this close count as equal: the pilot's numeric answers are integers, so the rule only has
# to absorb how a number is written ("16.0", "1.6e1"), not rounding.
REL_TOL = 1e-6
# math-verify's per-call limits (seconds). They use SIGALRM, which only the main thread may set;
# elsewhere math-verify raises, so a grader running in a worker thread runs without them, and one
# whose caller bounds the grade itself (collect's grading workers: collect/grading.py) turns them off.
MATH_TIMEOUT_S = 5
# A final answer sits at the end of a response: the graders read its last GRADED_CHARS characters, and
# math-verify is asked about an extracted answer of at most MATH_CHARS (longer ones are compared as
# strings: no real answer is that long, and sympy's time grows with it).
GRADED_CHARS = 65_536
MATH_CHARS = 1_000
# math-verify logs the text it timed out on; a log line quotes at most this much of it.
LOGGED_CHARS = 200


@dataclass(frozen=True)
class Graded:
    """What a grader read as the response's final answer (None: no answer found), and its verdict."""

    extracted: str | None
    correct: bool


# How math_expression judges an extracted answer: by value (math-verify), or by the pilot's rule, the
# strings equal once spaces are dropped and \dfrac read as \frac, for extending a matrix graded so.
MATH_EQUIVALENCES = ("value", "string")


def grade(
    grader: str,
    raw_response: str | None,
    answer: str,
    math_equivalence: str = "value",
    *,
    signal_limits: bool = True,
    **task: object,
) -> Graded:
    """Grade one response with the task's grader. `task` takes the rest of a task row (prompt,
    answer_type, ...) so that a whole row can be passed; the graders need only its answer.
    `signal_limits=False` turns math-verify's own time limits off, for a caller that bounds the grade's
    time itself (collect/grading.py)."""
    try:
        function = GRADERS[grader]
    except KeyError:
        raise InputError(f"unknown grader {grader!r}; the known graders are {', '.join(sorted(GRADERS))}.") from None
    if math_equivalence not in MATH_EQUIVALENCES:
        raise InputError(f"math_equivalence {math_equivalence!r} is not one of {', '.join(MATH_EQUIVALENCES)}.")
    if raw_response is None or not raw_response.strip():
        return Graded(None, False)
    raw_response = raw_response[-GRADED_CHARS:]
    if function is math_expression:
        return math_expression(raw_response, answer, math_equivalence, signal_limits)
    return function(raw_response, answer)


def numeric_match(raw_response: str, answer: str) -> Graded:
    """The first number of the answer line (`Answer: 2 hours` is 2) or, with no answer line, the
    last number of the last line, equal to the answer's number within REL_TOL."""
    after = answer_text(raw_response)
    text = (last_line(raw_response) if after is None else after).replace("\u2212", "-")
    found = list(NUMBER.finditer(text))
    if not found:
        return Graded(None, False)
    extracted = number_value(found[-1] if after is None else found[0])
    hedge = number_hedge(text, found, reads_first=after is not None)
    if hedge is not None and number_hedge(answer, list(NUMBER.finditer(answer)), reads_first=True) is None:
        return Graded(hedge, False)
    expected = find_numbers(answer)
    correct = bool(expected) and math.isclose(float(extracted), float(expected[0]), rel_tol=REL_TOL)
    return Graded(extracted, correct)


def hedged_letters(text: str, first: re.Match[str], second: re.Match[str]) -> bool:
    """Whether two neighbouring option letters are offered as alternatives (different ones; an "I"
    before a lower-case word is the pronoun)."""
    between = text[first.end() : second.start()]
    if first.group() == second.group() or len(between) > 20:
        return False
    if not (LETTER_JOINT.fullmatch(between) or LETTER_LIST.fullmatch(between)):
        return False
    return not (second.group() == "I" and re.match(r"'|\s+[a-z]", text[second.end() : second.end() + 2]))


def number_hedge(text: str, found: list[re.Match[str]], reads_first: bool) -> str | None:
    """The hedge, as written, that the number a grader reads (the first of `found`, or the last) is part
    of: that number marked plus-or-minus, or it and its neighbour offered as alternatives or a range.
    None when it names one value."""
    if not found:
        return None
    index = 0 if reads_first else len(found) - 1
    read = found[index]
    sign = read.group()[0] if read.group()[0] in "+-" else ""
    before = text[max(0, read.start() - 20) : read.start()] + sign
    marked = MARKED_PLUS_MINUS.search(before)
    if marked is not None:
        return text[read.start() - (len(before) - len(sign) - marked.start()) : read.end()]
    pair = index if reads_first else index - 1  # the pair (found[pair], found[pair + 1])
    if not 0 <= pair < len(found) - 1 or not hedged_numbers(text, found, pair):
        return None
    return text[found[pair].start() : found[pair + 1].end()]


def hedged_numbers(text: str, found: list[re.Match[str]], pair: int) -> bool:
    """Whether found[pair] and found[pair + 1] are offered as alternatives or a range, of different values."""
    first, second = found[pair], found[pair + 1]
    between = text[first.end() : second.start()]
    second_value = float(number_value(second))
    if len(between) > 20 or between == "/":  # an unspaced slash: a fraction, `3/4`
        return False
    if not NUMBER_JOINT.fullmatch(between):
        # `40-44`, `40 -44`: the dash read as the second number's sign joins them as a range, unless
        # a third number joins on the same way (a date, `2024-01-05`).
        dash = second.group().startswith("-") and NUMBER_JOINT.fullmatch(between + "-")
        if not dash or (between == "" and in_dashed_chain(text, found, pair)):
            return False
        second_value = abs(second_value)
    return float(number_value(first)) != second_value


def in_dashed_chain(text: str, found: list[re.Match[str]], pair: int) -> bool:
    """Whether the numbers of `pair` have a third joined to them by an unspaced dash, before or after."""

    def dashed(i: int) -> bool:  # found[i] and found[i + 1] touch, the second's sign between them
        return 0 <= i < len(found) - 1 and found[i].end() == found[i + 1].start() and found[i + 1].group()[0] == "-"

    return dashed(pair - 1) or dashed(pair + 1)


def mcq_letter(raw_response: str, answer: str) -> Graded:
    """The option letter of the answer line, or of the last line when there is none."""
    after = answer_text(raw_response)
    text = last_line(raw_response) if after is None else after
    letters = list(LETTER.finditer(text))
    pair = letters[-2:] if after is None else letters[:2]  # the letter read, and its neighbour
    if len(pair) == 2 and hedged_letters(text, *pair):
        start = len(text[: pair[0].start()].rstrip(OPTION_MARKS))
        end = len(text) - len(text[pair[1].end() :].lstrip(OPTION_MARKS))
        return Graded(text[start:end], False)
    letter = option_letter(text)
    return Graded(letter, letter is not None and letter == answer.strip().upper())


def math_expression(raw_response: str, answer: str, equivalence: str = "value", signal_limits: bool = True) -> Graded:
    """The last `\\boxed{}` (else the last line), equal in value to the answer by math-verify:
    `\\frac12` and `0.5` match `\\frac{1}{2}`, and `10080` matches `10,\\!080`, which the pilot's
    string comparison failed. With `equivalence="string"`, that comparison instead. math-verify's time
    limits hold on the main thread, unless `signal_limits` is False."""
    boxed = last_boxed(raw_response)
    extracted = math_extracted(raw_response)
    if not extracted:
        return Graded(None, False)
    if equivalence == "string":
        return Graded(extracted, pilot_string(extracted) == pilot_string(answer))
    hedge = hedged_boxes(raw_response) if boxed is not None else None
    if hedge is not None:
        return Graded(hedge, False)
    if len(extracted) > MATH_CHARS:
        return Graded(extracted, pilot_string(extracted) == pilot_string(answer))
    try:  # sympy and ANTLR load only when a math answer is graded
        from math_verify import parse, verify
    except ImportError as err:
        raise InputError(
            f"the math_expression grader needs math-verify ({err.name} is missing): "
            "pip install 'benchgen-router[collect]'."
        ) from None

    on_main_thread = threading.current_thread() is threading.main_thread()
    limit = MATH_TIMEOUT_S if signal_limits and on_main_thread else None
    _bound_math_verify_logs()
    gold = parse(f"${alternatives_as_set(answer)}$", parsing_timeout=limit)
    target = parse(alternatives_as_set(extracted if boxed is None else f"\\boxed{{{boxed}}}"), parsing_timeout=limit)
    return Graded(extracted, bool(gold and target and verify(gold, target, timeout_seconds=limit)))


def math_extracted(raw_response: str) -> str:
    """What math_expression reads as the final answer: the last `\\boxed{}`'s content, else the last line."""
    boxed = last_boxed(raw_response)
    return last_line(raw_response) if boxed is None else boxed


def exact_match_ci(raw_response: str, answer: str) -> Graded:
    """The answer line (else the last line) equal to the answer once both are case-folded, their
    whitespace runs made one space, and surrounding markdown marks and a final period removed."""
    text = answer_text(raw_response)
    extracted = last_line(raw_response) if text is None else text
    return Graded(extracted, comparable_text(extracted) == comparable_text(answer))


class _ShortLogs(logging.Filter):
    """Cuts a math-verify log line (`Timeout during parsing: <the whole answer>`) to LOGGED_CHARS."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if len(message) > LOGGED_CHARS:
            record.msg, record.args = f"{message[:LOGGED_CHARS]}... ({len(message)} characters)", None
        return True


def _bound_math_verify_logs() -> None:
    for name in ("math_verify.parser", "math_verify.grader", "math_verify.utils", "math_verify.metric"):
        logger = logging.getLogger(name)
        if not any(isinstance(existing, _ShortLogs) for existing in logger.filters):
            logger.addFilter(_ShortLogs())


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
    found = braced(response, starts[-1].end()) if starts else None
    return None if found is None else found[0]


def alternatives_as_set(latex: str) -> str:
    """`latex` with the marks that join alternatives (DISJUNCTION, a lone `|`) written as commas, which
    math-verify reads as a set: `2 \\lor 3` is {2, 3}, equal only to an answer that is that set."""
    latex = DISJUNCTION.sub(",", latex)
    return BAR.sub(",", latex) if len(BAR.findall(latex)) % 2 else latex


def hedged_boxes(response: str) -> str | None:
    """`\\boxed{2} or \\boxed{3}`: the last two boxes joined as alternatives (BOX_JOINT between them)
    with different contents, as written; None otherwise (a later box that corrects an earlier one is
    the answer)."""
    starts = list(BOXED.finditer(response))
    if len(starts) < 2:
        return None
    first, last = braced(response, starts[-2].end()), braced(response, starts[-1].end())
    if first is None or last is None or pilot_string(first[0]) == pilot_string(last[0]):
        return None
    between = response[first[1] + 1 : starts[-1].start()]
    if len(between) > 40 or not BOX_JOINT.fullmatch(between):
        return None
    return response[starts[-2].start() : last[1] + 1]


def braced(text: str, begin: int) -> tuple[str, int] | None:
    """The text from `begin` to the brace that closes the one just before it, stripped, and that
    brace's index; None when it never closes."""
    depth = 1
    for index in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth == 0:
            return text[begin:index].strip(), index
    return None


def number_value(match: re.Match[str]) -> str:
    return match.group().replace(",", "")


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
