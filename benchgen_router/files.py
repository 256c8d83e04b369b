"""Reading and writing files: JSON and JSON lines, query files, and outputs that are never half-written.

Lines are split on "\\n" (and "\\r\\n") only. `str.splitlines()` also breaks on U+2028, U+0085 and
other characters that are valid inside a JSON string or a query, which would lose rows and shift
every later line number.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import stat
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, BinaryIO, TextIO

from benchgen_router.errors import InputError, setting_error

# Field / column names a query is commonly stored under, in the order they are tried when the user
# names none: "prompt" first because BenchGen's own task files (router-pilot-tasks) use it.
TEXT_FIELDS = ("prompt", "query", "question", "text", "input")
# An input row's identifier, copied to the output so picks can be joined back to the input.
ID_FIELDS = ("id", "task_id", "query_id", "uid")
FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".tsv": "tsv", ".parquet": "parquet"}


def split_lines(data: bytes) -> Iterator[tuple[int, str]]:
    """(line number, text) for each "\\n"-terminated line, without its "\\r\\n" or "\\n"; bytes that
    are not UTF-8 are kept as surrogates (surrogateescape) so only their line is refused."""
    yield from numbered_lines(io.BytesIO(data))


def numbered_lines(stream: BinaryIO) -> Iterator[tuple[int, str]]:
    """split_lines over a binary stream, read a line at a time (bounded memory); a leading
    byte-order mark (spreadsheet exports) is dropped."""
    for number, raw in enumerate(stream, start=1):
        line = raw.decode("utf-8", errors="surrogateescape")
        if number == 1:
            line = line.removeprefix("\ufeff")
        yield number, line.removesuffix("\n").removesuffix("\r")


def read_json(path: str | os.PathLike, what: str) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{what} not found: {path}") from None
    except IsADirectoryError:
        raise InputError(f"{what} {path} is a folder; pass the file.") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InputError(f"{what} {path} is not valid JSON ({err}); pass the file the tool wrote.") from None


def read_jsonl(path: str | os.PathLike, what: str) -> list[dict[str, Any]]:
    """All rows of a JSON-lines file; a malformed line is an error naming its line number."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise InputError(f"{what} not found: {path}") from None
    except IsADirectoryError:
        raise InputError(f"{what} {path} is a folder; pass a JSON-lines file.") from None
    rows = []
    for number, line in split_lines(data):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputError(f"{what} {path} line {number} is not valid JSON ({err.msg}); fix or remove it.") from None
        if not isinstance(row, dict):
            raise InputError(f"{what} {path} line {number} is not a JSON object; each line must be one.")
        rows.append(row)
    return rows


def to_json(value: Any, **options: Any) -> str:
    """json.dumps that refuses NaN and infinities (which JSON has no spelling for) instead of writing
    `NaN`, which no JSON reader accepts."""
    try:
        return json.dumps(value, allow_nan=False, **options)
    except ValueError:
        raise InputError("a result holds NaN or an infinite number, which JSON cannot represent.") from None


# ---------------------------------------------------------------------------------------------
# Outputs: checked before the work, written to a temporary file, moved into place at the end


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _same_file(a: Path, b: Path) -> bool:
    with contextlib.suppress(OSError):
        return os.path.samefile(a, b)
    return False


class Output:
    """Where results go. A regular file (or a link to one, written through the link) is replaced
    atomically: a temporary file is created next to it when the Output is made, which proves the
    folder is writable before any work, and renamed over it by `commit()`. A device, pipe or socket
    (`/dev/stdout`, a named pipe) is a stream and is written as results come.

    `discard()` (or leaving a `with` block on an error) removes the temporary file and leaves the
    previous file as it was.
    """

    def __init__(self, path: str | os.PathLike, inputs: Iterable[str | os.PathLike] = (), binary: bool = False):
        given = Path(path)
        for source in inputs:
            if str(source) != "-" and _same_file(given, Path(source)):
                raise InputError(f"output {given} is the input file {source}; pass another output path.")
        self.path = given
        self.streaming = False
        self._tmp: str | None = None
        mode = "wb" if binary else "w"
        encoding = None if binary else "utf-8"
        try:
            info = os.stat(given)  # follows links
        except FileNotFoundError:
            info = None
        except OSError as err:
            raise InputError(f"cannot use output {given} ({err.strerror}); pass another path.") from None
        if info is not None and stat.S_ISDIR(info.st_mode):
            raise InputError(f"output {given} is a folder; pass a file name.")
        if info is not None and not stat.S_ISREG(info.st_mode):  # a device, pipe or socket: a stream
            self.streaming = True
            try:
                self.handle: IO[Any] = open(given, mode, encoding=encoding)  # noqa: SIM115 (closed by commit)
            except OSError as err:
                raise InputError(f"cannot write to {given} ({err.strerror}).") from None
            return
        self.target = given.resolve() if given.is_symlink() else given  # write through a link to its file
        if not self.target.parent.is_dir():
            raise InputError(f"output folder {self.target.parent} does not exist; create it or pass another path.")
        try:
            fd, self._tmp = tempfile.mkstemp(prefix=f".{self.target.name}.", suffix=".tmp", dir=self.target.parent)
        except OSError as err:
            raise InputError(
                f"cannot write to {self.target.parent} ({err.strerror}); pass another output path."
            ) from None
        self.handle = os.fdopen(fd, mode, encoding=encoding)

    def commit(self) -> None:
        """Move the finished file into place (or close the stream)."""
        try:
            self.handle.close()
            if self._tmp is not None:
                previous = os.stat(self.target).st_mode & 0o777 if self.target.exists() else 0o666 & ~_umask()
                os.chmod(self._tmp, previous)  # mkstemp creates 0600; keep the file's own mode
                os.replace(self._tmp, self.target)
                self._tmp = None
        except OSError as err:
            self.discard()
            raise InputError(f"cannot write {self.path} ({err.strerror}); nothing was replaced.") from None

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            self.handle.close()
        if self._tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._tmp)
            self._tmp = None

    def __enter__(self) -> IO[Any]:
        return self.handle

    def __exit__(self, kind: type[BaseException] | None, *_: Any) -> None:
        if kind is None:
            self.commit()
        else:
            self.discard()


@contextlib.contextmanager
def atomic_output(
    path: str | os.PathLike, mode: str = "w", inputs: Iterable[str | os.PathLike] = ()
) -> Iterator[IO[Any]]:
    """A handle whose content replaces `path` only if the block finishes (see Output); `path` may not
    be one of `inputs` (also through links)."""
    with Output(path, inputs, binary="b" in mode) as handle:
        yield handle


def check_output_path(path: str | os.PathLike, inputs: Iterable[str | os.PathLike] = ()) -> Path:
    """Refuse an output path that cannot be written (checked before any long work)."""
    Output(path, inputs).discard()
    return Path(path)


@contextlib.contextmanager
def staging_dir(final_dir: str | os.PathLike, owned: Iterable[str] = ()) -> Iterator[Path]:
    """A temporary folder beside final_dir; on success its files are moved into final_dir.

    On any error the temporary folder is removed and final_dir is left as it was, so a failed run
    never leaves half-written output. Files of final_dir that the staging folder does not hold are
    kept, except those named in `owned`: files this writer makes, which a run that did not make
    them must not leave behind from an earlier one.
    """
    final = Path(final_dir)
    if final.exists() and not final.is_dir():
        raise InputError(f"output folder {final} is a file; pass a folder path.")
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{final.resolve().name}.tmp-", dir=final.parent)
    except OSError as err:
        raise InputError(f"cannot write into {final.parent} ({err.strerror}); pass another folder.") from None
    try:
        yield Path(tmp)
        final.mkdir(parents=True, exist_ok=True)
        for name in owned:
            if not (Path(tmp) / name).exists() and (final / name).is_file():
                (final / name).unlink()
        for source in sorted(Path(tmp).rglob("*")):
            if source.is_file():
                target = final / source.relative_to(tmp)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.chmod(source, 0o666 & ~_umask())  # writers that stage via mkstemp leave 0600
                os.replace(source, target)
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Query files: every line becomes a Query or a Skipped line with its reason


@dataclass
class Query:
    line: int
    text: str
    id: Any = None


@dataclass
class Skipped:
    line: int
    reason: str


def text_problem(value: Any, name: str) -> str | None:
    """Why `value` cannot be routed as a query, or None when it can (tokenizer-level emptiness, such
    as a lone zero-width space, is found later by the router's own tokenizer)."""
    if not isinstance(value, str):
        return f"{name} is not text (got {type(value).__name__})"
    if not value.strip():
        return f"{name} is empty"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # undecodable input bytes (surrogateescape) or a lone \ud800 escape
        return f"{name} is not valid UTF-8 text"
    return None


def choose_text_field(names: Iterable[str], chosen: str | None, source: str) -> str:
    """The field/column holding the query: the user's, or the first usual name the input has."""
    names = list(names)
    if chosen is None:
        chosen = next((name for name in TEXT_FIELDS if name in names), None)
        if chosen is None:
            raise setting_error(
                f"{source} has none of the usual query fields ({', '.join(TEXT_FIELDS)}); it has "
                f"{', '.join(map(repr, names)) or 'none'}. Pass {{text_field=NAME}}."
            )
    elif chosen not in names:
        raise InputError(f"{source} has no field '{chosen}'; it has {', '.join(map(repr, names)) or 'none'}.")
    return chosen


def choose_id_field(names: Iterable[str], chosen: str | None, source: str) -> str | None:
    """The field/column copied to the output as "id": the user's, or the first usual one, if any."""
    names = list(names)
    if chosen is None:
        return next((name for name in ID_FIELDS if name in names), None)
    if chosen not in names:
        raise setting_error(f"{source} has no field '{chosen}' for {{id_field}}; it has {', '.join(map(repr, names))}.")
    return chosen


def read_text_lines(lines: Iterable[tuple[int, str]]) -> Iterator[Query | Skipped]:
    """Plain text: every line is one query, used as written (only the line break is dropped)."""
    for number, line in lines:
        problem = text_problem(line, "line")
        yield Skipped(number, problem) if problem else Query(number, line)


def read_jsonl_lines(
    lines: Iterable[tuple[int, str]], text_field: str | None, id_field: str | None, source: str
) -> Iterator[Query | Skipped]:
    """JSON lines: one object per line; the query is its text field, the id (if any) is kept.

    The fields are chosen on the first object (the input is read as a stream); a field the user
    names must be in the first object too."""
    chosen = False
    for number, line in lines:
        if not line.strip():
            yield Skipped(number, "empty line")
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            yield Skipped(number, f"not valid JSON ({err.msg})")
            continue
        if not isinstance(row, dict):
            yield Skipped(number, "not a JSON object")
            continue
        if not chosen:
            text_field = choose_text_field(row, text_field, f"{source} (line {number}, its first object)")
            id_field = choose_id_field(row, id_field, f"{source} (line {number}, its first object)")
            chosen = True
        if text_field not in row:
            yield Skipped(number, f"no '{text_field}' field")
            continue
        problem = text_problem(row[text_field], f"'{text_field}'")
        yield Skipped(number, problem) if problem else Query(number, row[text_field], row.get(id_field))


def read_csv_lines(
    stream: TextIO, delimiter: str, column: str | None, id_column: str | None, source: str
) -> Iterator[Query | Skipped]:
    """CSV/TSV with a header row; a quoted field may span lines, so a row is numbered by the line
    it starts on (line 1 is the header)."""
    previous_limit = csv.field_size_limit(2**31 - 1)  # csv refuses fields over 128 KiB by default
    try:
        reader = csv.reader(stream, delimiter=delimiter)
        header = next(reader, None)
        if header is None:
            return
        column = choose_text_field(header, column, source)
        id_column = choose_id_field(header, id_column, source)
        text_at = header.index(column)
        id_at = header.index(id_column) if id_column is not None else None
        while True:
            start = reader.line_num + 1
            row = next(reader, None)
            if row is None:
                return
            if not row or not any(cell.strip() for cell in row):
                yield Skipped(start, "empty line")
            elif text_at >= len(row):
                yield Skipped(start, f"row has {len(row)} fields, no '{column}' column")
            else:
                problem = text_problem(row[text_at], f"'{column}'")
                identifier = row[id_at] if id_at is not None and id_at < len(row) else None
                yield Skipped(start, problem) if problem else Query(start, row[text_at], identifier)
    finally:
        csv.field_size_limit(previous_limit)


def input_format(path: str, chosen: str | None) -> str:
    """The --format, or the one the file name says; stdin and unknown extensions are plain text."""
    if chosen:
        return chosen
    suffix = Path(path).suffix.lower()
    if suffix == ".json":
        raise setting_error(
            f"{path}: a .json file is one JSON document, not one query per line; convert it to "
            "JSON lines (.jsonl), or pass {format=jsonl} if it already is."
        )
    return FORMATS.get(suffix, "text")


def open_input(path: str) -> BinaryIO:
    """The input file (or stdin for '-') as a binary stream, with one clear line when it cannot be read."""
    if path == "-":
        return sys.stdin.buffer
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise InputError(f"input file not found: {path}") from None
    except (IsADirectoryError, PermissionError) as err:
        raise InputError(f"cannot read {path} ({err.strerror}); pass a query file.") from None


def read_queries(
    stream: BinaryIO, fmt: str, text_field: str | None, id_field: str | None, source: str
) -> Iterator[Query | Skipped]:
    """Every line of an input stream as a Query or a Skipped line, read lazily (bounded memory)."""
    if fmt == "jsonl":
        return read_jsonl_lines(numbered_lines(stream), text_field, id_field, source)
    if fmt in ("csv", "tsv"):
        text = io.TextIOWrapper(stream, encoding="utf-8-sig", errors="surrogateescape", newline="")
        return read_csv_lines(text, "\t" if fmt == "tsv" else ",", text_field, id_field, source)
    if fmt == "parquet":
        raise setting_error(f"{source}: Parquet input needs {{engine=ray}} (Ray Data reads it).")
    return read_text_lines(numbered_lines(stream))
