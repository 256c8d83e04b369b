"""The packaged query sets (benchgen_router/ood/query_sets.py): where they are, and the OOD set's form."""

from __future__ import annotations

from pathlib import Path

import benchgen_router
from benchgen_router import ood
from benchgen_router.files import read_jsonl

OOD_QUERIES = Path(benchgen_router.__file__).resolve().parent / "ood" / "queries" / "ood_queries.jsonl"
PLAIN_GROUPS = ood.PLAIN_OOD_GROUPS
# Near the pilot's domains: writing, code and chit-chat on its subjects, its questions in other languages.
NEAR_GROUPS = ("writing_near_domain", "code_near_domain", "chit_chat_near_domain", "foreign_plain", "foreign_wrapped")
HARD_GROUPS = ood.BENCHMARK_STYLE_OOD_GROUPS


def read_ood_queries() -> tuple[list[str], list[str]]:
    rows = read_jsonl(OOD_QUERIES, "OOD query set")
    return [row["query"] for row in rows], [row["group"] for row in rows]


def test_ood_query_set_is_well_formed():
    queries, groups = read_ood_queries()
    assert len(queries) >= 100 and len(set(queries)) == len(queries)
    assert all(isinstance(query, str) and query.strip() for query in queries)
    assert set(groups) == set(PLAIN_GROUPS) | set(NEAR_GROUPS) | set(HARD_GROUPS)
    assert min(groups.count(group) for group in set(groups)) >= 10


def test_packaged_sets_are_read_from_the_package_data():
    data = OOD_QUERIES.parent
    for path in (
        ood.PACKAGED_OOD_QUERIES,
        ood.PACKAGED_PLAIN_QUERIES,
        ood.PACKAGED_GUARD_INSIDE,
        ood.PACKAGED_GUARD_OUTSIDE,
    ):
        assert path.parent == data and path.is_file(), path
    assert ood.read_ood_queries() == read_ood_queries()  # the default is the packaged OOD set
