"""The pool's keys kept out of whatever the gateway relays (docs/gateway.md, "Keys"): an upstream that echoes
the key it was sent, in its body, its headers or its stream, hands it to no client.

An upstream may write a key back in any mix of its characters' spellings: as they are, JSON-escaped (`\\/`,
`\\u002b` or `\\u002B`, a surrogate pair beyond the BMP) or percent-encoded (`%2B`). KeyRedactor matches every
such spelling of every key with one pattern, and replaces each by `***`. A stream is masked as it passes
(StreamRedactor): a chunk goes out at once but for a tail that may begin a key, held back until the next
chunk tells; that tail is shorter than the longest spelling of a key, and an SSE event, which ends with a
line end, never leaves one.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

MASK = b"***"
# JSON's two-character escapes (RFC 8259, section 7), beside \uXXXX, which any character may take.
JSON_SHORT_ESCAPES = {
    '"': b'\\"',
    "\\": b"\\\\",
    "/": b"\\/",
    "\b": b"\\b",
    "\f": b"\\f",
    "\n": b"\\n",
    "\r": b"\\r",
    "\t": b"\\t",
}

# One spelling of a character: the bytes each of its positions may hold (a hex digit in either case).
Spelling = tuple[frozenset[int], ...]


def exactly(data: bytes) -> Spelling:
    return tuple(frozenset({byte}) for byte in data)


def hex_digits(value: int, count: int) -> Spelling:
    return tuple(frozenset(digit.encode() + digit.upper().encode()) for digit in f"{value:0{count}x}")


def json_units(code: int) -> list[int]:
    """The UTF-16 code units of a code point, as JSON's \\u escapes write it."""
    if code < 0x10000:
        return [code]
    offset = code - 0x10000
    return [0xD800 + (offset >> 10), 0xDC00 + (offset & 0x3FF)]


def spellings(character: str) -> list[Spelling]:
    """Every way a body, header or stream may write `character`: its UTF-8 bytes, a JSON escape, or
    percent-encoding."""
    encoded = character.encode("utf-8")
    forms = [exactly(encoded)]
    if character in JSON_SHORT_ESCAPES:
        forms.append(exactly(JSON_SHORT_ESCAPES[character]))
    forms.append(sum((exactly(b"\\u") + hex_digits(unit, 4) for unit in json_units(ord(character))), ()))
    forms.append(sum((exactly(b"%") + hex_digits(byte, 2) for byte in encoded), ()))
    return forms


def byte_class(allowed: frozenset[int]) -> bytes:
    escaped = b"".join(re.escape(bytes([byte])) for byte in sorted(allowed))
    return escaped if len(allowed) == 1 else b"[" + escaped + b"]"


def alternatives(patterns: Iterable[bytes]) -> bytes:
    return b"(?:" + b"|".join(patterns) + b")"


def spelled(spelling: Spelling) -> bytes:
    return b"".join(map(byte_class, spelling))


def key_pattern(key: list[list[Spelling]]) -> bytes:
    """Any spelling of the key: each character in any of its spellings."""
    return b"".join(alternatives(map(spelled, forms)) for forms in key)


def key_beginning_pattern(key: list[list[Spelling]]) -> bytes:
    """A beginning of a spelling of the key, up to the end of the data: characters spelled whole, then part of
    one or none. A character's spellings are prefix-free (none begins another), so the pattern is flat: each
    character is spelled whole, or the data ends, after part of it or at once."""
    groups = []
    for position, forms in enumerate(key):
        parts = [spelled(spelling[:length]) for spelling in forms for length in range(1, len(spelling))]
        ends = [alternatives(parts) + rb"\Z"] if parts else []
        # The first character is begun at least: the tail is never empty.
        groups.append(alternatives([*map(spelled, forms), *ends, *([rb"\Z"] if position else [])]))
    return b"".join(groups) + rb"\Z"


class KeyRedactor:
    """Every spelling of the given keys, found and masked in bytes."""

    def __init__(self, keys: Iterable[str]) -> None:
        # Longest first: where one key begins another, the longer is masked whole.
        spelt = [[spellings(character) for character in key] for key in sorted(set(keys), key=len, reverse=True)]
        spelt = [key for key in spelt if key]
        # A pattern per key: Python's engine skips quickly to one key's first bytes, not to any of several keys'.
        self.patterns = [re.compile(key_pattern(key)) for key in spelt]
        self.beginnings = [re.compile(key_beginning_pattern(key)) for key in spelt]
        # The longest a key may be written: a held tail is shorter.
        self.longest = max((sum(max(map(len, forms)) for forms in key) for key in spelt), default=0)
        # The bytes a spelling holds: data that ends with another (an SSE event ends with a line end) holds
        # no beginning of a key, and is not searched.
        self.spelled_bytes = frozenset(
            byte for key in spelt for forms in key for spelling in forms for allowed in spelling for byte in allowed
        )

    def redact(self, data: bytes) -> bytes:
        for pattern in self.patterns:
            data = pattern.sub(MASK, data)
        return data

    def held_length(self, data: bytes) -> int:
        """The length of the longest tail of masked `data` that begins a spelling of a key: what a stream holds
        back until more bytes tell (0: nothing). Each key's pattern finds its earliest start, in one search of
        at most `longest` - 1 bytes."""
        if not data or data[-1] not in self.spelled_bytes:
            return 0
        window = max(0, len(data) - self.longest + 1)
        starts = [found.start() for pattern in self.beginnings if (found := pattern.search(data, window))]
        return len(data) - min(starts, default=len(data))


@functools.lru_cache(maxsize=8)
def key_redactor(keys: tuple[str, ...]) -> KeyRedactor:
    """One redactor per set of keys: the pool's keys are read per call, and rarely change."""
    return KeyRedactor(keys)


class StreamRedactor:
    """A stream's bytes masked as they pass: feed() gives what may go out now, finish() the held tail."""

    def __init__(self, redactor: KeyRedactor) -> None:
        self.redactor = redactor
        self.held = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self.redactor.redact(self.held + chunk)
        held = self.redactor.held_length(data)
        self.held = data[len(data) - held :]
        return data[: len(data) - held]

    def finish(self) -> bytes:
        """The tail held at the end: a beginning of a key that never completed, relayed as it is."""
        held, self.held = self.held, b""
        return held
