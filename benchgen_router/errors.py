"""The errors the package raises on purpose, and the SIGTERM signal as an exception.

Every `RouterError` is one line that names the problem and the fix, written for a Python caller.
Where the fix is a command-line flag, `cli` holds the same line for the command line, which the
commands print instead. The service maps the family to 4xx answers in one handler.
"""

from __future__ import annotations

import re


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


def setting_error(template: str, flags: dict[str, str] | None = None) -> InputError:
    """An InputError whose `template` names settings as {field} or {field=value}: a Python caller
    reads `field` or `field='value'`, the command line `--field-name [value]` (or the flag `flags`
    gives)."""
    flags = flags or {}

    def python(match: re.Match[str]) -> str:
        name, value = match.group(1), match.group(2)
        return name if value is None else f"{name}={value!r}"

    def command_line(match: re.Match[str]) -> str:
        name, value = match.group(1), match.group(2)
        flag = flags.get(name, "--" + name.replace("_", "-"))
        return flag if value is None else f"{flag} {value}"

    pattern = re.compile(r"\{(\w+)(?:=([^}]*))?\}")
    return InputError(pattern.sub(python, template), cli=pattern.sub(command_line, template))


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (library errors often run to many lines)."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


class Terminated(BaseException):
    """SIGTERM, raised where the work is, so that it unwinds as for Ctrl-C: temporary files are
    removed, a service drains, and the previous output is kept."""


def raise_terminated(signum: int, frame: object) -> None:
    """A SIGTERM handler: Terminated where the main thread is."""
    raise Terminated
