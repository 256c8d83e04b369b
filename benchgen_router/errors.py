"""The one error type the tools turn into a single `error: ...` line (and exit code 2)."""

from __future__ import annotations


class UsageError(ValueError):
    """A problem with the caller's input, reported as one line that names the problem and the fix.

    A ValueError, so that library callers who catch bad values catch this too."""


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (library errors often run to many lines)."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


class Terminated(BaseException):
    """SIGTERM, raised where the work is, so that it unwinds as for Ctrl-C: temporary files are
    removed, a service drains, and the previous output is kept."""


def raise_terminated(signum: int, frame: object) -> None:
    """A SIGTERM handler: Terminated where the main thread is."""
    raise Terminated
