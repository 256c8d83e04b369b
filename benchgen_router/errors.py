"""The errors the package raises on purpose, and the SIGTERM signal as an exception.

Every `RouterError` is one line that names the problem and the fix, written for a Python caller.
Where the fix is a command-line flag, `cli` holds the same line for the command line, which the
commands print instead. The service maps the family to 4xx answers in one handler.
"""

from __future__ import annotations


class RouterError(Exception):
    """A problem the caller can fix."""

    def __init__(self, message: str, *, cli: str | None = None) -> None:
        super().__init__(message)
        self.cli = cli

    def for_command_line(self) -> str:
        return self.cli or str(self)


class InputError(RouterError, ValueError):
    """A value, file or dataset the package cannot use (a ValueError, as callers expect)."""


class RouterTypeError(RouterError, TypeError):
    """An argument of a type the package does not take (a TypeError, as callers expect)."""


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (library errors often run to many lines)."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


class Terminated(BaseException):
    """SIGTERM, raised where the work is, so that it unwinds as for Ctrl-C: temporary files are
    removed, a service drains, and the previous output is kept."""


def raise_terminated(signum: int, frame: object) -> None:
    """A SIGTERM handler: Terminated where the main thread is."""
    raise Terminated
