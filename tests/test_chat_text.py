"""chat_text.py: the text a router scores in a conversation, one rule for the gateway and the LiteLLM plugins;
nothing to score is one InputError line."""

from __future__ import annotations

import pytest

from benchgen_router.chat_text import ROUTING_TEXT_MAX_CHARS, routing_text
from benchgen_router.errors import InputError

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "first question"},
    {"role": "assistant", "content": "first answer"},
    {"role": "user", "content": [{"type": "text", "text": "second"}, {"type": "image_url", "image_url": {}}]},
    {"role": "user", "content": "\u200b"},  # shows nothing: skipped, as an image is
]


@pytest.mark.parametrize(
    ("route_on", "expected"),
    [
        ("last-user", "second"),
        ("first-user", "first question"),
        ("conversation", "first question\n\nfirst answer\n\nsecond"),
    ],
)
def test_each_rule_picks_its_text_and_skips_messages_that_show_nothing(route_on, expected):
    assert routing_text(CONVERSATION, route_on).text == expected


def test_a_long_text_is_cut_and_says_so():
    routed = routing_text([{"role": "user", "content": "x" * (ROUTING_TEXT_MAX_CHARS + 5)}], "last-user")
    assert len(routed.text) == ROUTING_TEXT_MAX_CHARS and routed.cut


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([], "non-empty list"),
        ([{"role": "assistant", "content": "hi"}], "no user text"),
        ([{"role": "user", "content": "\x00\u200b"}], "only invisible characters"),
        ([{"role": "user", "content": "\ud800"}], "not valid UTF-8"),
    ],
)
def test_nothing_to_score_is_one_line(messages, message):
    with pytest.raises(InputError, match=message) as raised:
        routing_text(messages, "last-user")
    assert "\n" not in str(raised.value)
    with pytest.raises(InputError, match="route_on 'middle'"):
        routing_text(CONVERSATION, "middle")
