"""serving/call_usage.py: what a gateway call used, counted only when believable."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("ray.serve")

from benchgen_router.serving.call_usage import MAX_SCANNED_LINE_BYTES, StreamUsage, cost_headers, plausible_usage
from benchgen_router.upstreams import Upstream


def test_the_cost_header_is_the_billed_cost_else_the_tokens_at_the_pool_prices():
    alpha = Upstream("alpha", "m", "http://h/v1", price_per_1m_prompt_usd=1.0, price_per_1m_output_usd=2.0)

    def header(usage):
        return cost_headers(plausible_usage(alpha, usage))

    assert header({"prompt_tokens": 1000, "completion_tokens": 500}) == {
        "x-benchgen-cost-usd": "0.0020000000"  # (1000 x 1 + 500 x 2) / 1M
    }
    billed = {"prompt_tokens": 1000, "completion_tokens": 500, "cost": 0.00042}
    assert header(billed) == {"x-benchgen-cost-usd": "0.0004200000"}  # OpenRouter's own figure
    assert header(None) == {} and header({"total_tokens": 3}) == {}
    unpriced = Upstream(agent="alpha", model="m", base_url="http://h/v1")
    assert cost_headers(plausible_usage(unpriced, {"prompt_tokens": 1, "completion_tokens": 1})) == {}
    assert header({"prompt_tokens": 10**30, "completion_tokens": 1}) == {}  # no call uses that: not priced


def test_a_streams_usage_is_read_as_its_bytes_pass():
    events = b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n: comment\n\ndata: {"usage": {"prompt_tokens": 5'
    usage = StreamUsage()
    for start in range(0, len(events), 7):  # cut anywhere, even inside an event
        usage.feed(events[start : start + 7])
    usage.feed(b', "completion_tokens": 2}}\n\n')
    assert usage.usage == {"prompt_tokens": 5, "completion_tokens": 2}
    last = StreamUsage()
    last.feed(b'data: {"usage": {"prompt_tokens": 1, "completion_tokens": 1}}')  # no newline before the end
    last.finish()
    assert last.usage == {"prompt_tokens": 1, "completion_tokens": 1}


def test_a_stream_without_line_ends_is_scanned_in_linear_time_and_bounded_memory():
    """64-byte chunks and no line end, as a hostile upstream streams them: each byte is handled once (it took
    seconds when each chunk copied the line so far), at most MAX_SCANNED_LINE_BYTES are kept, and a line past
    that bound is not scanned, not even its tail, while the next line is."""
    usage = StreamUsage()
    filler = b"x" * 64
    started = time.perf_counter()
    for _ in range((4 * MAX_SCANNED_LINE_BYTES + (2 << 20)) // 64):
        usage.feed(filler)
        assert len(usage.pending) <= MAX_SCANNED_LINE_BYTES
    seconds = time.perf_counter() - started
    assert seconds < 1.0, f"{seconds:.2f} s for {4 * MAX_SCANNED_LINE_BYTES + (2 << 20)} bytes"
    usage.feed(b'data: {"usage": {"prompt_tokens": 666, "completion_tokens": 666}}\n')  # the long line's tail
    assert usage.usage is None
    usage.feed(b'data: {"usage": {"prompt_tokens": 3, "completion_tokens": 4}}\n\n')
    assert usage.usage == {"prompt_tokens": 3, "completion_tokens": 4}
