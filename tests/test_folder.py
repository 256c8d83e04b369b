"""folder.py: the card from its template (merged with the text a README keeps after it), the
folder checks, and the tokenizer saved without loading flags."""

from __future__ import annotations

import json

import pytest

from benchgen_router.errors import InputError
from benchgen_router.folder import CARD_END, check_output_folder, is_router_folder, merge_card, render_card
from configuration_router import RouterConfig
from helpers import AGENTS


def config(**training) -> RouterConfig:
    text = {"model_type": "qwen3", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4}
    return RouterConfig(text_config=text, id2label=dict(enumerate(AGENTS)), training=training)


def test_the_card_is_rendered_from_the_template():
    card = render_card(config(model_id="head-x", n_train=35, n_test=11, test_reward=0.61), "org/model", "v2")
    front = card.split("---\n")[1]
    assert 'base_model: "org/model"' in front and "pipeline_tag: text-classification" in front
    assert "# head-x" in card and "| rows (train / held out) | 35 / 11 |" in card and "0.6100" in card
    assert "at revision `v2`" in card and card.rstrip().endswith(CARD_END)
    assert "$" not in card.replace("$x", "")  # every placeholder filled
    local = render_card(config(), "/models/local-copy", None)
    assert "base_model" not in local.split("---\n")[1]  # a local path is not a Hub model


def test_a_new_card_keeps_what_the_readme_held_after_the_previous_one():
    first = render_card(config(model_id="one"), "org/model", None)
    readme = first + "\n# The project\n\nDocumentation.\n"
    second = merge_card(render_card(config(model_id="two"), "org/model", None), readme)
    assert "# two" in second and "# one" not in second and second.endswith("\n# The project\n\nDocumentation.\n")
    assert merge_card("card", "a README without the marker") == "card"


def test_folders_that_hold_something_else_are_refused(tmp_path):
    check_output_folder(tmp_path / "new", overwrite=False)  # a new folder is fine
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.md").write_text("x")
    with pytest.raises(InputError, match="already holds files and no router"):
        check_output_folder(tmp_path / "theirs", overwrite=False)
    check_output_folder(tmp_path / "theirs", overwrite=True)
    (tmp_path / "router").mkdir()
    (tmp_path / "router" / "config.json").write_text(json.dumps({"model_type": "benchgen_router"}))
    assert is_router_folder(tmp_path / "router") and not is_router_folder(tmp_path / "theirs")
    check_output_folder(tmp_path / "router", overwrite=False)  # a router folder is replaced


def cv_point(name: str, kind: str, reward: float, cost: float, latency: float) -> dict:
    return {
        "name": name, "kind": kind, "reward": reward, "reward_std_repeats": 0.01, "delta_reward": reward - 0.9,
        "delta_se": 0.02, "cost_per_1k": cost, "latency_s": latency, "share": {a: 0.2 for a in AGENTS},
    }  # fmt: skip


def test_the_card_shows_cost_and_latency_only_when_they_were_measured():
    assert "## Quality, cost and latency" not in render_card(config(), "org/model", None)
    frontier = {
        "repeats": 3, "folds": 5, "rows": 46, "cv_seed": 0, "search": {"generations": 20},
        "reference": "always frontier_a",
        "points": [
            cv_point("router lc0_ll0", "router", 0.87, 0.11, 12.0),
            cv_point("always frontier_a", "fixed", 0.9, 0.1, 20.0),
            cv_point("oracle (first best)", "oracle", 0.95, 0.12, 20.0),
        ],
    }  # fmt: skip
    card = render_card(config(frontier=frontier), "org/model", None)
    assert "## Quality, cost and latency" in card and "3x repeated 5-fold" in card
    assert "| router (router lc0_ll0) | 0.8700 ± 0.0100 | -0.0300 ± 0.0200 | 0.1100 (110%) | 12.00 (60%) |" in card
    assert "| always frontier_a | 0.9000 ± 0.0100 |" in card and "oracle (first best)" not in card
    assert "operating_point=" not in card  # one head: nothing to choose


def test_the_card_lists_every_operating_point_and_marks_the_default():
    points = {
        "quality": {"cost_weight": 0, "latency_weight": 0, "cv": cv_point("x", "router", 0.88, 0.1, 10.0)},
        "cheap": {"cost_weight": 2, "latency_weight": 0},
    }
    text = {"model_type": "qwen3", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4}
    cfg = RouterConfig(
        text_config=text, id2label=dict(enumerate(AGENTS)), operating_points=points, operating_point="cheap"
    )
    card = render_card(cfg, "org/model", None)
    assert "| `quality`: cost 0, latency 0 | 0.8800 ± 0.0100 |" in card
    assert "| `cheap` (default): cost 2, latency 0 | n/a |" in card  # measured nothing: claims nothing
    assert 'operating_point="cheap"' in card
    assert "holds only the 2 heads, one per operating point (2 x 165 values)" in card
