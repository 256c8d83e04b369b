"""serving/redaction.py: every spelling of a pool key masked, in a body and in a stream however it is cut."""

from __future__ import annotations

import json
import random
import time
import urllib.parse

import pytest

from benchgen_router.serving.redaction import KeyRedactor, StreamRedactor, key_redactor

# "/", "+" and "=": what JSON encoders and URLs escape; "é" and "𝄞": a two-byte and a four-byte character.
KEY = "sk-or/v1+Zm9v=bar/é𝄞=="
OTHER_KEY = "other-key-5f1c"


def json_escaped(text: str, escaped: str, upper: bool = False) -> str:
    """`text` with the characters in `escaped` written as \\uXXXX (a surrogate pair beyond the BMP)."""
    out = []
    for character in text:
        utf16 = character.encode("utf-16-be")
        units = [int.from_bytes(utf16[start : start + 2], "big") for start in range(0, len(utf16), 2)]
        escape = "".join(f"\\u{unit:04X}" if upper else f"\\u{unit:04x}" for unit in units)
        out.append(escape if character in escaped else character)
    return "".join(out)


SPELLINGS = {
    "raw": KEY,
    "json-dumps-ascii": json.dumps(KEY)[1:-1],  # Python's encoder, ensure_ascii: é and 𝄞 escaped
    "slash-escaped": KEY.replace("/", "\\/"),  # PHP's and Java's encoders
    "plus-and-equals-escaped": json_escaped(KEY, "+="),
    "every-character-upper-hex": json_escaped(KEY, KEY, upper=True),
    "percent-encoded": urllib.parse.quote(KEY, safe=""),
    "mixed": "sk%2Dor\\/v1\\u002BZm9v%3dbar/\\u00e9%F0%9D%84%9E\\u003D=",
}


@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_every_spelling_of_a_key_is_masked_in_a_body(spelling):
    redactor = KeyRedactor([KEY, OTHER_KEY])
    body = f'{{"error": {{"message": "Incorrect API key provided: {SPELLINGS[spelling]}; also {OTHER_KEY}."}}}}'
    masked = redactor.redact(body.encode())
    assert masked == b'{"error": {"message": "Incorrect API key provided: ***; also ***."}}'


def test_text_without_a_key_is_left_as_it_is():
    redactor = KeyRedactor([KEY])
    near = f"{KEY[:-1]} {KEY[1:]} sk-or\\\\/v1 \\u00 %2".encode()  # a key but its last or first character
    assert redactor.redact(near) == near
    assert KeyRedactor([]).redact(near) == near and KeyRedactor([""]).redact(near) == near
    assert key_redactor((KEY,)) is key_redactor((KEY,))  # compiled once per set of keys


def stream_of(*contents: str) -> bytes:
    return b"".join(
        b"data: " + json.dumps({"choices": [{"delta": {"content": content}}]}, ensure_ascii=False).encode() + b"\n\n"
        for content in contents
    )


def relayed(redactor: KeyRedactor, chunks: list[bytes]) -> tuple[bytes, int]:
    """(what a client gets, the most bytes held back at once)."""
    stream = StreamRedactor(redactor)
    out, most_held = [], 0
    for chunk in chunks:
        out.append(stream.feed(chunk))
        most_held = max(most_held, len(stream.held))
    out.append(stream.finish())
    return b"".join(out), most_held


@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_a_key_cut_anywhere_across_chunks_is_masked_with_bounded_holding(spelling):
    """Cut at every byte into two chunks, and byte by byte: the client gets what the whole stream would give
    masked, and no more than the longest spelling of a key less one byte is ever held back."""
    redactor = KeyRedactor([KEY, OTHER_KEY])
    key_bytes = SPELLINGS[spelling].encode()
    data = b'data: {"content": "key ' + key_bytes + b'"}\n\n' + stream_of("and after")
    whole = redactor.redact(data)
    assert key_bytes not in whole and b"***" in whole
    for cut in range(len(data) + 1):
        out, most_held = relayed(redactor, [data[:cut], data[cut:]])
        assert out == whole, cut
        assert most_held <= redactor.longest - 1
    out, most_held = relayed(redactor, [data[i : i + 1] for i in range(len(data))])
    assert out == whole and 0 < most_held <= redactor.longest - 1


def test_random_streams_cut_at_random_are_masked_as_their_whole():
    redactor = KeyRedactor([KEY, OTHER_KEY])
    pieces = [*(value.encode() for value in SPELLINGS.values()), OTHER_KEY.encode(), b"sk-", b"\\u00", b"%2", b"\n\n"]
    pieces += [b"data: {}", b"plain words ", b"\\", b"/"]
    rng = random.Random(7)
    for _ in range(300):
        data = b"".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))
        cuts = sorted(rng.sample(range(len(data) + 1), min(len(data) + 1, rng.randint(0, 6))))
        chunks = [data[start:end] for start, end in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        out, most_held = relayed(redactor, chunks)
        assert out == redactor.redact(data), (data, cuts)
        assert most_held <= redactor.longest - 1


def test_an_ordinary_stream_goes_out_chunk_by_chunk_and_a_tail_that_may_begin_a_key_waits_for_the_next():
    redactor = KeyRedactor([KEY])
    stream = StreamRedactor(redactor)
    events = stream_of("hello", "sk-or", "world")
    assert stream.feed(events) == events and stream.held == b""  # an event ends with a line end: nothing held
    assert stream.feed(b'data: {"content": "sk-o') == b'data: {"content": "'  # "sk-o" may begin the key
    assert stream.feed(b'ut"}\n\n') == b'sk-out"}\n\n'  # it did not: released with the next chunk
    assert stream.feed(b"tail sk-or\\/v") == b"tail " and stream.finish() == b"sk-or\\/v"  # the end: as it came


def test_masking_a_stream_costs_the_same_per_byte_however_it_is_cut():
    """Chunks made of what begins a key (a hostile upstream's): each chunk's work is bounded by the longest
    spelling of a key, not by the stream so far."""
    redactor = KeyRedactor([KEY, OTHER_KEY])
    for chunk in (b"s" * 64, b"\\" * 64, b"sk-or/v1+" * 8, b"%2" * 32):
        stream = StreamRedactor(redactor)
        started = time.perf_counter()
        for _ in range(10_000):  # 640 KiB
            stream.feed(chunk)
        seconds = time.perf_counter() - started
        assert seconds < 2.0, (chunk[:10], seconds)
        assert len(stream.held) <= redactor.longest - 1
