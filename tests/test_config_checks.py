"""config_checks.py: the rules a router's config must follow, checked where the package reads or writes one."""

from __future__ import annotations

import json

import pytest

from benchgen_router.config_checks import check_operating_points, check_query_format, check_router_config
from benchgen_router.errors import InputError
from benchgen_router.loading import load_router
from configuration_router import RouterConfig
from helpers import AGENTS

TEXT = {"model_type": "qwen3", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4}
POINTS = {"quality": {"cost_weight": 0, "latency_weight": 0}, "economy": {"cost_weight": 1.5, "latency_weight": 0}}


def router_config(**overrides) -> RouterConfig:
    return RouterConfig(text_config=dict(TEXT), id2label=dict(enumerate(AGENTS)), **overrides)


def test_a_config_within_the_rules_passes():
    check_router_config(router_config())
    check_router_config(router_config(operating_points=POINTS, ood_threshold=1.0, ood_fallback_agent=AGENTS[0]))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"head_hidden_dim": -1}, "head_hidden_dim must be >= 0"),
        ({"truncation_length": 0}, "truncation_length must be a positive"),
        ({"special_tokens_per_query": 1, "truncation_suffix_tokens": 2}, "truncation_suffix_tokens"),
        ({"truncation_suffix_tokens": -1}, "truncation_suffix_tokens"),
        ({"ood_threshold": float("nan"), "ood_fallback_agent": "open_mid"}, "ood_threshold must be a finite"),
        ({"ood_threshold": 3.0}, "ood_fallback_agent None is not an agent"),
        ({"ood_threshold": 3.0, "ood_fallback_agent": "gpt_x"}, "'gpt_x' is not an agent of this pool"),
        ({"operating_points": {"a.b": {"cost_weight": 0, "latency_weight": 0}}}, "must start with a letter"),
        ({"operating_points": {"cheap": {"cost_weight": -1, "latency_weight": 0}}}, "needs a number cost_weight"),
        ({"operating_points": POINTS, "operating_point": "fast"}, "'fast' is not one of this router's"),
        ({"head_kind": "svm"}, "head_kind must be one of cmaes, probability"),
        ({"head_kind": "probability", "head_hidden_dim": 8}, "a probability head is one linear layer"),
        (
            {"operating_points": {"eco": {"cost_weight": 1, "latency_weight": 0, "ood_fallback_agent": "gpt_x"}}},
            "'eco': ood_fallback_agent 'gpt_x' is not an agent",
        ),
    ],
)
def test_invalid_settings_are_refused_with_a_reason(overrides, message):
    with pytest.raises(ValueError, match=message):
        check_router_config(router_config(**overrides))


@pytest.mark.parametrize(
    "rules",
    [{"labels": "Question: "}, {"labels": [""]}, {"instructions": [3]}, {"prefixes": ["x"]}, ["Question: "]],
)
def test_malformed_query_rules_are_refused(rules):
    with pytest.raises(ValueError, match="query_format"):
        check_query_format(rules)


@pytest.mark.parametrize("points", [["quality"], {"quality": 1}, {5: {"cost_weight": 0, "latency_weight": 0}}])
def test_operating_points_that_are_not_named_weights_are_refused(points):
    with pytest.raises(ValueError, match="operating"):
        check_operating_points(points)


def test_loading_a_folder_that_breaks_a_rule_is_one_line_naming_it(tmp_path):
    from benchgen_router.model_code import default_router_dir

    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((default_router_dir() / name).read_bytes())
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "truncation_length": 0}))
    with pytest.raises(InputError, match="truncation_length must be a positive number of tokens"):
        load_router(str(tmp_path))
