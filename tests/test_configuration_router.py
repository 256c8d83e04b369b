"""configuration_router.py: what RouterConfig stores and derives (its rules: test_config_checks.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import Qwen3Config

from configuration_router import RouterConfig
from helpers import AGENTS

TEXT = {"model_type": "qwen3", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4}


def router_config(**overrides) -> RouterConfig:
    return RouterConfig(text_config=dict(TEXT), id2label=dict(enumerate(AGENTS)), **overrides)


def test_a_nested_dict_becomes_the_backbone_config_and_the_pool_reads_in_logit_order():
    config = router_config()
    assert isinstance(config.text_config, Qwen3Config) and config.embedding_dim == 32
    assert config.agent_order == AGENTS
    assert (config.head_hidden_dim, config.truncation_length, config.pack_queries) == (0, 1024, True)


def test_a_text_config_without_model_type_is_refused():
    with pytest.raises(ValueError, match="model_type"):
        RouterConfig(text_config={"hidden_size": 32})


def test_a_path_is_stored_as_a_string_and_the_config_round_trips(tmp_path):
    config = router_config(backbone_name_or_path=Path("/models/qwen"), backbone_revision="v2", bundled_backbone=True)
    assert config.backbone_name_or_path == "/models/qwen"
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["backbone_name_or_path"] == "/models/qwen" and saved["text_config"]["model_type"] == "qwen3"
    again = RouterConfig.from_pretrained(tmp_path)
    assert again.agent_order == AGENTS and again.bundled_backbone and again.backbone_revision == "v2"


def test_guard_settings_default_to_no_guard_and_round_trip(tmp_path):
    plain = router_config()
    assert not plain.has_ood_guard and plain.ood_guard and plain.ood_fallback_agent is None
    guarded = router_config(ood_threshold=512.5, ood_fallback_agent="frontier_b")
    assert guarded.has_ood_guard
    guarded.save_pretrained(tmp_path)
    loaded = RouterConfig.from_pretrained(tmp_path, ood_guard=False)
    assert (loaded.ood_threshold, loaded.ood_fallback_agent, loaded.ood_guard) == (512.5, "frontier_b", False)
    assert loaded.has_ood_guard


def test_a_config_written_with_its_calibration_record_still_loads(tmp_path):
    # Older folders kept the guard's calibration record in config.json; it is now in the report.
    router_config(ood_threshold=512.5, ood_fallback_agent="frontier_b").save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**saved, "ood_calibration": {"keep_share": 0.95}}))
    assert RouterConfig.from_pretrained(tmp_path).ood_threshold == 512.5


# ---------------------------------------------------------------------------------------------
# Canonical queries, per-point fallback agents

RULES = {"labels": ["Question: ", "Problem: "], "instructions": ["Reply with `Answer: X`.", "Box it."]}


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("Question: What is 2+2?\n\nReply with `Answer: X`.", "What is 2+2?"),
        ("Question: Pick one.\n\nA. x\nB. y\n\nReply with `Answer: X`.", "Pick one.\n\nA. x\nB. y"),
        ("Problem: Find x.\n\nBox it.\n", "Find x."),  # a trailing newline is whitespace
        ("Reply with `Answer: X`.\n\nWhat is 2+2?", "What is 2+2?"),  # an instruction anywhere
        ("  what is 2+2?  ", "what is 2+2?"),
        ("What is 2+2? Reply with `Answer: X`.", "What is 2+2? Reply with `Answer: X`."),  # not a paragraph
        ("The Question: of the day", "The Question: of the day"),  # a label only at the start
        ("Reply with `Answer: X`.", "Reply with `Answer: X`."),  # never emptied
        ("Question: ", "Question:"),  # the label alone is all there is: only whitespace goes
    ],
)
def test_canonical_query_drops_only_the_known_wrapper(text, canonical):
    assert router_config(query_format=RULES).canonical_query(text) == canonical


def test_without_rules_the_query_is_embedded_exactly_as_given():
    text = "  Question: What is 2+2?\n\nReply with `Answer: X`.\n"
    assert router_config().canonical_query(text) == text and router_config().query_format == {}


def test_each_operating_point_may_name_its_own_fallback_agent():
    points = {
        "quality": {"cost_weight": 0, "latency_weight": 0},
        "economy": {"cost_weight": 1.5, "latency_weight": 0, "ood_fallback_agent": "open_cheap_reasoning"},
    }
    config = router_config(
        ood_threshold=1.0, ood_fallback_agent="frontier_b", operating_points=points, operating_point="quality"
    )
    assert config.fallback_agent() == config.fallback_agent("quality") == "frontier_b"
    assert config.fallback_agent("economy") == "open_cheap_reasoning"


@pytest.mark.parametrize("name", [["quality"], 5, {"quality": 1}])
def test_an_operating_point_that_is_not_a_name_is_a_value_error(name):
    config = router_config(operating_points={"quality": {"cost_weight": 0, "latency_weight": 0}})
    with pytest.raises(ValueError, match="is not one of this router's: quality"):
        config.check_operating_point(name)


def test_a_backbone_written_by_transformers_5_keeps_its_rope_theta_on_either_line():
    """transformers 5 writes a Qwen3 backbone's RoPE settings only as `rope_parameters`; 4.x read the router's
    backbone at its own default theta (1e4 for 1e6), and every embedding changed. The rotary frequencies the
    backbone is built with are the written theta's on 4.x and 5.x alike."""
    import torch

    from modeling_router import RouterModel

    head_dim = 8
    written = {**TEXT, "head_dim": head_dim, "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0}}
    config = RouterConfig(text_config=written, id2label=dict(enumerate(AGENTS)))
    frequencies = RouterModel(config).backbone.rotary_emb.inv_freq
    expected = 1.0 / (1_000_000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    torch.testing.assert_close(frequencies.double(), expected, rtol=1e-5, atol=0)
