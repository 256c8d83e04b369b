"""The forms in which one question reaches a router, and the rules that make them one.

Benchmark prompts wrap a question in a label ("Question: ") and an answer-format instruction
("Give the final answer in the form `Answer: ...`"); users type the question alone. A router
trained with `query_format` (recorded in its config.json, applied by its own code in every entry
point) drops the known wrappers before embedding, so both forms get one decision. The guard is
also fitted on shorter views of each prompt: the question without its options, and its question
sentence (guard_views).
"""

from __future__ import annotations

import re

LABELS = ("Problem: ", "Question: ")
# The pilot's answer-format instructions, verbatim (benchgen-pilot tasks.v1.jsonl).
INSTRUCTIONS = (
    "Answer with the letter of the single best option, in the form `Answer: X`. Do not explain after the answer line.",
    "Give the final numeric answer in the form `Answer: <number>` on the last line.",
    "Give the final answer in the form `Answer: <answer>` on the last line. Answer as briefly as the question allows.",
    "Put the final answer inside \\boxed{} on the last line.",
)
PILOT_QUERY_FORMAT = {"labels": list(LABELS), "instructions": list(INSTRUCTIONS)}
QUERY_FORMATS = {"pilot": PILOT_QUERY_FORMAT, "none": None}
FORMS = ("formatted", "plain")  # as the data gives them; without the pilot's label and instruction
_SENTENCE_END = re.compile(r"(?<=[.?!])\s+")


def canonical_query(text: str, rules: dict[str, list[str]] | None) -> str:
    """The router's own canonicalisation (configuration_router.canonical_query), imported when used:
    the model code imports transformers."""
    from benchgen_router.model_code import canonical_query as canonicalise

    return canonicalise(text, rules)


def plain_question(prompt: str) -> str:
    """The question as a user would type it: the prompt without the pilot's label and instruction."""
    return canonical_query(prompt, PILOT_QUERY_FORMAT)


def in_form(prompts: list[str], form: str) -> list[str]:
    """The prompts in one of FORMS."""
    if form not in FORMS:
        raise ValueError(f"unknown form {form!r}; use one of {', '.join(FORMS)}.")
    return list(prompts) if form == "formatted" else [plain_question(prompt) for prompt in prompts]


def guard_views(prompt: str, rules: dict[str, list[str]] | None) -> list[str]:
    """The distinct views of a prompt the guard is fitted on: the canonical query, its first paragraph
    (a multiple-choice question without its options) and its question sentence (the last one ending
    in '?', else the last sentence of the first paragraph)."""
    query = canonical_query(prompt, rules)
    stem = query.split("\n\n")[0].strip() or query
    sentences = [part.strip() for part in _SENTENCE_END.split(stem) if part.strip()]
    questions = [sentence for sentence in sentences if sentence.endswith("?")]
    sentence = (questions or sentences or [stem])[-1]
    return list(dict.fromkeys([query, stem, sentence]))
