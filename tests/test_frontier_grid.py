"""frontier.grid: operating-point names as users write them on the command line, and the one error
line that names the wrong character, the characters a name may hold and a name that would do."""

from __future__ import annotations

import re

import pytest

from benchgen_router.errors import InputError
from benchgen_router.frontier.grid import Tradeoff, parse_operating_point
from helpers import cli

# The rule, written here literally: a letter, then at most 63 letters, digits, '_' or '-'.
NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")


@pytest.mark.parametrize("text", ["balanced=0.2", "w0_06=0.06", "fast-1=0:0.01", "Q=0", "a" * 64 + "=1"])
def test_names_of_letters_digits_underscores_and_dashes_are_accepted(text):
    name, tradeoff = parse_operating_point(text)
    assert NAME.fullmatch(name) and name == text.split("=")[0]
    assert isinstance(tradeoff, Tradeoff)


@pytest.mark.parametrize(
    ("text", "problem", "example"),
    [
        ("w0.06=0.06", "'w0.06' has '.'", "w0_06=0.06"),
        ("a b/c=1", "'a b/c' has ' ', '/'", "a_b_c=1"),
        ("1a=1", "'1a' does not start with a letter", "p1a=1"),
        ("b" * 65 + "=1", "is longer than 64 characters", "b" * 64 + "=1"),
        ("=1", "it is empty", "balanced=0.2"),
    ],
)
def test_a_bad_name_is_one_line_naming_the_problem_the_rule_and_a_name_that_works(text, problem, example):
    with pytest.raises(InputError) as caught:
        parse_operating_point(text)
    message = str(caught.value)
    assert "\n" not in message and problem in message
    assert "starts with a letter and has at most 64 letters, digits, '_' or '-'" in message
    suggested = re.search(r"\(e\.g\. (\S+)\)$", message).group(1)
    assert suggested == example
    name, _ = parse_operating_point(suggested)  # the suggestion itself is accepted
    assert NAME.fullmatch(name)


def test_the_command_line_says_which_characters_a_name_may_hold(capsys):
    assert cli("train", "--operating-point", "w0.06=0.06") == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert "'w0.06' has '.'" in err[-1] and "letters, digits, '_' or '-'" in err[-1] and "w0_06=0.06" in err[-1]
