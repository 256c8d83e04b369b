"""files.py: lines split on \\n only, query files read as streams, outputs checked before the work and
never half-written, links written through, devices written as streams, the input never the output."""

from __future__ import annotations

import io
import json
import os

import pytest

from benchgen_router.errors import InputError
from benchgen_router.files import (
    Output,
    Query,
    Skipped,
    atomic_output,
    read_jsonl,
    read_queries,
    split_lines,
    staging_dir,
    to_json,
)

# Characters str.splitlines() breaks on that are valid inside a query or a JSON string.
SEPARATORS = ["\u2028", "\u2029", "\u0085", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e"]


@pytest.mark.parametrize("separator", SEPARATORS)
def test_lines_split_on_newline_only(separator):
    data = f"one{separator}query\r\ntwo\n".encode()
    assert list(split_lines(data)) == [(1, f"one{separator}query"), (2, "two")]


@pytest.mark.parametrize("separator", SEPARATORS)
def test_a_jsonl_row_holding_a_separator_is_one_row(tmp_path, separator):
    rows = [{"prompt": f"a{separator}b", "id": 1}, {"prompt": "c", "id": 2}]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    assert read_jsonl(path, "rows") == rows
    items = list(read_queries(io.BytesIO(path.read_bytes()), "jsonl", None, None, "rows"))
    assert items == [Query(1, f"a{separator}b", 1), Query(2, "c", 2)]
    text = list(read_queries(io.BytesIO(f"x{separator}y\nz\n".encode()), "text", None, None, "t"))
    assert text == [Query(1, f"x{separator}y"), Query(2, "z")]


def test_query_files_are_read_lazily_with_bad_lines_numbered():
    data = b'{"prompt": "a"}\nnot json\n[1]\n{"other": 1}\n{"prompt": ""}\n'
    items = read_queries(io.BytesIO(data), "jsonl", None, None, "f")
    assert next(items) == Query(1, "a")  # a generator: nothing past line 1 was needed yet
    assert [type(i).__name__ for i in items] == ["Skipped", "Skipped", "Skipped", "Skipped"]
    csv = b'\xef\xbb\xbfid,prompt\n1,"multi\nline"\n2,\n'  # a BOM, a quoted field over two lines, an empty one
    assert list(read_queries(io.BytesIO(csv), "csv", None, None, "c")) == [
        Query(2, "multi\nline", "1"),
        Skipped(4, "'prompt' is empty"),
    ]


def test_output_replaces_the_file_only_when_committed(tmp_path):
    target = tmp_path / "out.jsonl"
    target.write_text("previous\n")
    target.chmod(0o640)
    with pytest.raises(RuntimeError), atomic_output(target) as handle:
        handle.write("half")
        raise RuntimeError
    assert target.read_text() == "previous\n" and os.listdir(tmp_path) == ["out.jsonl"]
    with atomic_output(target) as handle:
        handle.write("new\n")
    assert target.read_text() == "new\n" and target.stat().st_mode & 0o777 == 0o640  # the file's own mode kept


def test_a_link_is_written_through_to_its_file(tmp_path):
    real = tmp_path / "real.jsonl"
    real.write_text("old\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(real)
    with atomic_output(link) as handle:
        handle.write("new\n")
    assert link.is_symlink() and real.read_text() == "new\n"


def test_the_input_itself_is_refused_also_through_a_link(tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("q\n")
    link = tmp_path / "alias.txt"
    link.symlink_to(source)
    for output in (source, link):
        with pytest.raises(InputError, match="is the input file"):
            Output(output, inputs=[source])
    assert source.read_text() == "q\n"


def test_atomic_output_refuses_its_input(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text('{"query": "q"}\n')
    with pytest.raises(InputError, match="is the input file"), atomic_output(source, inputs=[source]) as handle:
        handle.write("results")
    assert source.read_text() == '{"query": "q"}\n'


def test_staging_removes_the_owned_files_this_run_did_not_write(tmp_path):
    final = tmp_path / "out"
    final.mkdir()
    for name in ("guard.bin", "plot.png", "mine.txt"):
        (final / name).write_text("old")
    with staging_dir(final, owned=("guard.bin", "plot.png", "head.npy")) as staging:
        (staging / "plot.png").write_text("new")
        (staging / "head.npy").write_text("new")
    assert {p.name: p.read_text() for p in final.iterdir()} == {"plot.png": "new", "head.npy": "new", "mine.txt": "old"}
    with pytest.raises(RuntimeError), staging_dir(final, owned=("plot.png",)):
        raise RuntimeError("the run failed")
    assert (final / "plot.png").read_text() == "new"  # a failed run removes nothing


def test_a_device_is_written_as_a_stream_and_kept():
    output = Output("/dev/null")
    assert output.streaming
    output.handle.write("x\n")
    output.commit()
    assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")


@pytest.mark.parametrize(
    ("path", "message"),
    [("/sys/kernel/out.jsonl", "cannot write to"), ("/no/such/folder/out.jsonl", "does not exist")],
)
def test_an_unwritable_output_is_found_before_any_work(path, message):
    with pytest.raises(InputError, match=message):
        Output(path)


def test_json_output_never_holds_nan():
    assert to_json({"a": 1.5}) == '{"a": 1.5}'
    for bad in (float("nan"), float("inf")):
        with pytest.raises(InputError, match="NaN or an infinite number"):
            to_json({"logit": bad})
