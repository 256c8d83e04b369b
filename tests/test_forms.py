"""forms: the plain form of a pilot prompt, and the views the guard is fitted on."""

from __future__ import annotations

import pytest

from benchgen_router.files import read_jsonl
from benchgen_router.forms import INSTRUCTIONS, LABELS, PILOT_QUERY_FORMAT, guard_views, in_form, plain_question
from helpers import NO_PILOT, PILOT


def test_plain_question_drops_the_label_and_the_instruction():
    prompt = "Question: Which is a noble gas?\n\nA. Neon\nB. Iron\n\n" + INSTRUCTIONS[0]
    assert plain_question(prompt) == "Which is a noble gas?\n\nA. Neon\nB. Iron"
    assert in_form([prompt], "formatted") == [prompt] and in_form([prompt], "plain") == [plain_question(prompt)]
    with pytest.raises(ValueError, match="unknown form 'typed'"):
        in_form([prompt], "typed")


def test_guard_views_are_the_query_its_stem_and_its_question_sentence():
    prompt = "Problem: A train leaves at 3 pm. It travels 60 km. How long does it take?\n\nA. 1 h\nB. 2 h"
    query, stem, sentence = guard_views(prompt, PILOT_QUERY_FORMAT)
    assert query == prompt.removeprefix("Problem: ")
    assert stem == "A train leaves at 3 pm. It travels 60 km. How long does it take?"
    assert sentence == "How long does it take?"
    assert guard_views("What is 2+2?", PILOT_QUERY_FORMAT) == ["What is 2+2?"]  # one view when all agree


@pytest.mark.skipif(not (PILOT / "tasks.v1.jsonl").exists(), reason=NO_PILOT)
def test_every_pilot_prompt_has_a_known_wrapper_that_the_plain_form_removes():
    for task in read_jsonl(PILOT / "tasks.v1.jsonl", "tasks"):
        prompt, plain = task["prompt"], plain_question(task["prompt"])
        assert plain != prompt and prompt.startswith(LABELS) and not plain.startswith(LABELS), task["task_id"]
        assert not any(instruction in plain for instruction in INSTRUCTIONS), task["task_id"]
        assert plain in prompt and plain_question(plain) == plain, task["task_id"]
