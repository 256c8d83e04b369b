"""bench/streaming.py: the input files it routes and the table it prints (no routing is run)."""

from __future__ import annotations

from benchgen_router.bench.streaming import TINY_ROUTER, table_lines, write_input


def test_write_input_cycles_the_prompts_one_per_line(tmp_path):
    path = tmp_path / "queries.txt"
    size = write_input(path, ["What is\n2 + 2?", "  Name   a prime. "], 5)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines == ["What is 2 + 2?", "Name a prime.", "What is 2 + 2?", "Name a prime.", "What is 2 + 2?"]
    assert size == path.stat().st_size


def test_table_has_a_line_per_size():
    rows = [
        {
            "lines": 10_000,
            "input_bytes": 3 * 2**20,
            "output_lines": 10_000,
            "seconds": 20.0,
            "peak_rss_bytes": 466 * 2**20,
        },
        {
            "lines": 100_000,
            "input_bytes": 30 * 2**20,
            "output_lines": 99_999,
            "seconds": 200.0,
            "peak_rss_bytes": 2**29,
        },
    ]
    lines = table_lines(rows, None, "the pilot", threads=1)
    assert lines[0] == f"- router: {TINY_ROUTER}; workload: the pilot"
    assert lines[1].startswith("- CPU: ") and lines[1].endswith("; 1 torch thread(s)")
    assert lines[2].startswith("\n| input lines |")
    assert lines[3:] == ["| 10,000 | 3.0 | 10,000 | 20 | 500 | 466 |", "| 100,000 | 30.0 | 99,999 | 200 | 500 | 512 |"]
