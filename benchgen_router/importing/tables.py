"""Reading outcome tables: CSV/TSV and JSON lines, row by row with the line each row starts on, and the
cells every reader shares (the prompt text, correctness, numbers). Rows are read lazily, so a file of
a few hundred thousand rows never sits in memory as row objects."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchgen_router.errors import InputError, setting_error
from benchgen_router.files import numbered_lines, text_problem

TRUE_WORDS, FALSE_WORDS = {"true", "1", "1.0", "yes"}, {"false", "0", "0.0", "no"}
TABLE_SUFFIXES = {".csv": ",", ".tsv": "\t"}
JSONL_SUFFIXES = (".jsonl", ".ndjson")
PICKLE_SUFFIXES = (".pkl", ".pickle")

Rows = Iterator[tuple[int, dict[str, Any]]]  # (line the row starts on, the row)


def refuse_pickle(path: Path, what: str = "outcomes") -> None:
    """Pickles run code when loaded: refused by name and by their magic bytes, never opened further."""
    if path.suffix.lower() in PICKLE_SUFFIXES:
        raise InputError(f"{path} is a pickle, which can run code when loaded and is never read; export CSV or JSONL.")
    try:
        with open(path, "rb") as handle:
            start = handle.read(2)
    except FileNotFoundError:
        raise InputError(f"{what} file not found: {path}") from None
    except OSError as err:
        raise InputError(f"cannot read {path} ({err.strerror}); pass a CSV or JSONL file.") from None
    if len(start) == 2 and start[0] == 0x80 and 2 <= start[1] <= 5:  # pickle protocols 2 to 5 open with PROTO
        raise InputError(
            f"{path} holds a pickle, which can run code when loaded and is never read; export CSV or JSONL."
        )


def _decode_error(path: Path, line: int) -> InputError:
    return InputError(f"{path} line {line} is not UTF-8 text; save the file as UTF-8.")


def _first_undecodable_line(path: Path) -> int:
    """The line of a file's first byte sequence that is not UTF-8 (found again, line by line, only
    once reading the file as text has failed)."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                return number
    return 1


def read_table(
    path: Path, what: str = "outcomes", needs: str = "one row per (prompt, model) outcome"
) -> tuple[list[str], Rows]:
    """(column names, rows) of a CSV/TSV (header row; a quoted field may span lines, so a row is
    numbered by the line it starts on) or JSON-lines file (columns: the first object's keys). The rows
    are an iterator: a malformed row is an InputError when it is reached."""
    refuse_pickle(path, what)
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        return read_jsonl_table(path, needs)
    if suffix not in TABLE_SUFFIXES:
        raise InputError(
            f"{path}: {what} are read from .csv, .tsv, .jsonl or .ndjson files; rename it or export one of those."
        )
    delimiter = TABLE_SUFFIXES[suffix]
    with _csv_reader(path, delimiter) as reader:
        header = next(reader, None)
    if not header:
        raise InputError(f"{path} is empty; it needs a header row and {needs}.")
    if len(set(header)) != len(header):
        repeated = sorted({name for name in header if header.count(name) > 1})
        raise InputError(f"{path} line 1 repeats column {repeated[0]!r}; every column needs its own name.")
    return header, _csv_rows(path, delimiter, header)


@contextmanager
def _csv_reader(path: Path, delimiter: str) -> Iterator[Any]:
    """A csv reader over the file as UTF-8 text (a leading byte-order mark dropped); a malformed row or
    bytes that are not UTF-8 are one InputError naming the line."""
    previous_limit = csv.field_size_limit(2**31 - 1)  # answers can pass csv's 128 KiB default
    reader = None
    try:
        with open(path, encoding="utf-8-sig", newline="") as handle:
            reader = csv.reader(handle, delimiter=delimiter)
            yield reader
    except csv.Error as err:
        line = reader.line_num if reader is not None else 1
        raise InputError(f"{path} line {line} is not valid CSV ({err}); fix its quoting.") from None
    except UnicodeDecodeError:
        raise _decode_error(path, _first_undecodable_line(path)) from None
    finally:
        csv.field_size_limit(previous_limit)


def _csv_rows(path: Path, delimiter: str, header: list[str]) -> Rows:
    with _csv_reader(path, delimiter) as reader:
        next(reader)  # the header
        while True:
            start = reader.line_num + 1
            cells = next(reader, None)
            if cells is None:
                return
            if not any(cell.strip() for cell in cells):
                continue
            if len(cells) != len(header):
                raise InputError(
                    f"{path} line {start} has {len(cells)} fields for {len(header)} columns; quote fields that "
                    "hold the delimiter or a line break."
                )
            yield start, dict(zip(header, cells, strict=True))


def read_jsonl_table(path: Path, needs: str) -> tuple[list[str], Rows]:
    """(column names: the first object's keys, rows) of a JSON-lines file, whatever its suffix."""
    rows = _jsonl_rows(path)
    first = next(rows, None)
    if first is None:
        raise InputError(f"{path} has no rows; it needs {needs}.")

    def every_row() -> Rows:
        yield first
        yield from rows

    return list(first[1]), every_row()


def _jsonl_rows(path: Path) -> Rows:
    with open(path, "rb") as handle:
        for number, line in numbered_lines(handle):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise InputError(f"{path} line {number} is not valid JSON ({err.msg}); fix or remove it.") from None
            except UnicodeError:
                raise _decode_error(path, number) from None
            if not isinstance(row, dict):
                raise InputError(f"{path} line {number} is not a JSON object; each line must be one object.")
            yield number, row


# ---------------------------------------------------------------------------------------------
# Columns and cells


def choose_column(header: Sequence[str], chosen: str | None, usual: Sequence[str], what: str, path: Path) -> str | None:
    """The column the caller named (which must exist), else the first of the usual names present, else None."""
    if chosen is not None:
        if chosen not in header:
            raise InputError(f"{path} has no column {chosen!r} for {what}; it has {', '.join(map(repr, header))}.")
        return chosen
    return next((name for name in usual if name in header), None)


def required_column(
    header: Sequence[str], chosen: str | None, usual: Sequence[str], described: str, what: str, flag: str, path: Path
) -> str:
    """choose_column's column, which must exist: none of the usual names is one line naming the flag to pass."""
    name = choose_column(header, chosen, usual, described, path)
    if name is None:
        raise setting_error(
            f"{path} has none of the usual {what} columns ({', '.join(usual)}); it has "
            f"{', '.join(map(repr, header))}. Pass {{{flag}=NAME}}."
        )
    return name


def text_cell(value: Any, where: str, column: str) -> str:
    problem = "is empty" if value is None else text_problem(value, f"'{column}'")
    if problem:
        raise InputError(f"{where}: {problem}; every row needs the prompt text and the model name.")
    return value


def parse_correct(value: Any, where: str, column: str, correct_at: float | None) -> float:
    """1.0 or 0.0 from a boolean, True/False text, 0/1, or a score in [0, 1] (>= correct_at is correct)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in TRUE_WORDS:
            return 1.0
        if word in FALSE_WORDS:
            return 0.0
        try:
            value = float(word)
        except ValueError:
            raise InputError(
                f"{where}: '{column}' is {value!r}; it must be True/False, 1/0 or a score from 0 to 1."
            ) from None
    if not isinstance(value, int | float) or not math.isfinite(value) or not 0 <= value <= 1:
        raise InputError(f"{where}: '{column}' is {value!r}; it must be True/False, 1/0 or a score from 0 to 1.")
    if value in (0, 1):
        return float(value)
    if correct_at is None:
        raise setting_error(
            f"{where}: '{column}' is the score {value!r}; rewards count calls as correct or wrong, so pass "
            "{correct_at=SCORE} to count a score from SCORE up as correct (e.g. 0.5)."
        )
    return 1.0 if value >= correct_at else 0.0


def number_cell(value: Any, where: str, column: str, maximum: float, whole: bool = False) -> float:
    """A number >= 0 (empty or null: NaN, unknown)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return math.nan
    number = value
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = None
    if (
        not isinstance(number, int | float)
        or isinstance(number, bool)
        or not math.isfinite(number)
        or not 0 <= number <= maximum
        or (whole and number != int(number))
    ):
        kind = "a whole number" if whole else "a number"
        raise InputError(f"{where}: '{column}' is {value!r}; it must be {kind} from 0 to {maximum:g}.")
    return float(number)


def id_cell(value: Any, where: str, column: str) -> str:
    """A task id as text: a string, or a whole number (JSON lines write ids as numbers, CSV as text, and
    the two must match)."""
    if isinstance(value, bool) or value is None:
        raise InputError(f"{where}: '{column}' is {value!r}; an id must be text or a whole number.")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        return str(value)
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{where}: '{column}' is {value!r}; every row needs an id (text or a whole number).")
    return value.strip()


def short(prompt: str) -> str:
    """A prompt as a short quoted snippet, for an error line."""
    text = " ".join(prompt.split())
    return repr(text if len(text) <= 60 else text[:57] + "...")
