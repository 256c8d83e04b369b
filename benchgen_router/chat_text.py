"""The text a router scores in a chat conversation: one rule for the gateway and the LiteLLM plugins.

    routed = routing_text(messages, "last-user")  # RoutingText(text, cut), or InputError naming why not

Imports nothing beyond the standard library and the package's errors, so a plugin can use it without the
service's dependencies (Ray, Starlette).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from benchgen_router.errors import InputError
from benchgen_router.files import text_problem

ROUTE_ON = ("last-user", "first-user", "conversation")
# The router reads at most its truncation length (512 tokens for the bundled one) from the start of
# the text; longer text would only cost tokenizing, beside every query of its batch.
ROUTING_TEXT_MAX_CHARS = 65536
# Unicode categories that show nothing alone: format (zero-width spaces, joiners, the BOM), control (NUL),
# separators, unassigned and private code points, and combining marks without a letter to sit on. A lone
# surrogate (undecodable input) is not among them: it is broken rather than invisible, and refused by name.
INVISIBLE_CATEGORIES = frozenset({"Cf", "Cc", "Cn", "Co", "Zs", "Zl", "Zp", "Mn", "Mc", "Me"})


def content_text(content: Any) -> str:
    """A message's text: a string content, or the `text` parts of a list of parts (images and audio
    carry none)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
        )
    return ""


def visible(text: str) -> bool:
    return any(unicodedata.category(character) not in INVISIBLE_CATEGORIES for character in text)


@dataclass(frozen=True)
class RoutingText:
    """What the router scores, and whether it was cut to ROUTING_TEXT_MAX_CHARS (a journal says so, since a
    cut text is not the prompt the user sent)."""

    text: str
    cut: bool


def routing_text(messages: Any, route_on: str) -> RoutingText:
    """What the router scores: the last user message with visible text ("last-user"); the first ("first-user"),
    so that every turn of a conversation goes to the agent its opening was routed to; or every user and
    assistant message with visible text, in order ("conversation"). A message whose text shows nothing (a
    zero-width space, a NUL) is skipped as an image is: the router would score nothing. InputError (one line)
    when there is nothing to score. On a large conversation this is seconds of work: callers on an event
    loop run it in a thread."""
    if route_on not in ROUTE_ON:
        raise InputError(f"route_on {route_on!r} must be one of {', '.join(ROUTE_ON)}.")
    if not isinstance(messages, list) or not messages:
        raise InputError('"messages" must be a non-empty list of chat messages.')
    roles = ("user", "assistant") if route_on == "conversation" else ("user",)
    texts = [
        (message["role"], content_text(message.get("content")))
        for message in messages
        if isinstance(message, Mapping) and message.get("role") in roles
    ]
    if not any(role == "user" and text.strip() for role, text in texts):
        raise InputError("the messages hold no user text for the router to score.")
    # Only the start of a text is scored: whether it shows anything is decided there.
    texts = [(role, text) for role, text in texts if visible(text[:ROUTING_TEXT_MAX_CHARS])]
    if not any(role == "user" for role, _ in texts):
        raise InputError(
            "the user text holds only invisible characters (zero-width, control); send a message with words."
        )
    if route_on == "conversation":
        text = "\n\n".join(text for _, text in texts)
    else:
        text = texts[0][1] if route_on == "first-user" else texts[-1][1]
    cut = len(text) > ROUTING_TEXT_MAX_CHARS
    text = text[:ROUTING_TEXT_MAX_CHARS]
    problem = text_problem(text, "the text to route on")
    if problem:
        raise InputError(f"{problem}; a router cannot score it.")
    return RoutingText(text, cut)
