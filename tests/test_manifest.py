"""manifest.py: the schema in one place: what readers need, what is refused, provenance kept."""

from __future__ import annotations

import pytest

from benchgen_router.errors import InputError
from benchgen_router.manifest import (
    READER_KEYS,
    REFERENCE_KEYS,
    STRUCTURE_KEYS,
    make_manifest,
    provenance,
    validate_manifest,
)

GOOD = {"agent_order": ["a", "b"], "embedding_dim": 4, "head_hidden_dim": 0, "backbone_model": "org/model"}


def test_the_reference_schema_and_what_readers_rely_on():
    assert READER_KEYS == ("agent_order", "embedding_dim", "head_hidden_dim", "backbone_model")
    assert set(READER_KEYS) <= set(REFERENCE_KEYS) and len(REFERENCE_KEYS) == 17
    assert set(STRUCTURE_KEYS) >= {"agent_order", "embedding_dim", "head_hidden_dim"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"agent_order": []}, "non-empty list"),
        ({"agent_order": ["a", "a"]}, "repeats ['a']"),
        ({"agent_order": ["a", "b\nc"]}, "newline or control character"),
        ({"agent_order": ["a", "tab\there"]}, "newline or control character"),
        ({"agent_order": ["a", " "]}, "non-empty string"),
        ({"embedding_dim": 0}, "embedding_dim must be an integer >= 1"),
        ({"embedding_dim": True}, "embedding_dim must be an integer >= 1"),
        ({"head_hidden_dim": -1}, "head_hidden_dim must be an integer >= 0"),
        ({"truncation_length": "long"}, "truncation_length must be a positive integer"),
        ({"backbone_model": ""}, "backbone_model must be"),
    ],
)
def test_what_readers_cannot_use_is_refused_with_one_line(change, message):
    with pytest.raises(InputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        validate_manifest({**GOOD, **change}, "m.json")


def test_make_manifest_orders_keys_and_refuses_unknown_ones():
    manifest = make_manifest(head_hidden_dim=0, embedding_dim=4, agent_order=["a", "b"], model_id="x", cma={})
    assert list(manifest) == ["model_id", "agent_order", "embedding_dim", "head_hidden_dim", "cma"]
    with pytest.raises(KeyError, match="not manifest keys"):
        make_manifest(**GOOD, colour="blue")
    kept = provenance({**GOOD, "history": [1], "n_train": 35, "query_format": {"labels": []}})
    assert kept == {"backbone_model": "org/model", "history": [1], "n_train": 35}  # the head's structure is not
