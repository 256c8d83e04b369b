"""The packaged query sets: what the guard is fitted on and what it is measured on.

The measuring sets are never fitted on, so the figures measured on them are out of sample. Each is
JSONL, one {"query", "group"} object a line, in benchgen_router/ood/queries/.
"""

from __future__ import annotations

from pathlib import Path

from benchgen_router.errors import InputError

_DATA = Path(__file__).resolve().parent / "queries"  # benchgen_router/ood/queries
PACKAGED_OOD_QUERIES = _DATA / "ood_queries.jsonl"  # measuring only: never fitted on
# Groups of the packaged OOD set: plainly not benchmark items (the guard must flag them), and
# phrased like benchmark items (reported, with no target).
PLAIN_OOD_GROUPS = (
    "turkish",
    "german",
    "chinese",
    "arabic",
    "russian",
    "hindi",
    "japanese",
    "code_tooling",
    "chit_chat",
    "everyday_writing_planning",
)
BENCHMARK_STYLE_OOD_GROUPS = ("benchmark_style_templated", "foreign_templated", "benchmark_style_plain")
PACKAGED_PLAIN_QUERIES = _DATA / "plain_queries.jsonl"  # measuring only: in-domain questions as users type them
PACKAGED_GUARD_INSIDE = _DATA / "guard_fit_inside.jsonl"  # fitting: in-domain questions as users type them
PACKAGED_GUARD_OUTSIDE = _DATA / "guard_fit_outside.jsonl"  # fitting: queries the guard must flag


def read_ood_queries(
    path: str | Path = PACKAGED_OOD_QUERIES, what: str = "OOD query set"
) -> tuple[list[str], list[str]]:
    """(queries, groups) of a query set (out-of-distribution, or the guard's fitting sets), checked
    row by row so that a bad row is named rather than embedded."""
    from benchgen_router.files import read_jsonl

    rows = read_jsonl(path, what)
    for number, row in enumerate(rows, 1):
        if not isinstance(row.get("query"), str) or not row["query"].strip() or not isinstance(row.get("group"), str):
            raise InputError(f"{what} {path}: row {number} needs a non-empty 'query' and a 'group' string.")
    if not rows:
        raise InputError(f"{what} {path} holds no queries.")
    return [row["query"] for row in rows], [row["group"] for row in rows]
