"""card.py: the model card from its template and the typed report, merged with the text a README
keeps after it; each figure once, and nothing claimed that was not measured."""

from __future__ import annotations

from benchgen_router.release.card import CARD_END, merge_card, render_card
from benchgen_router.release.report import GuardReport, PointFigures, PointReport, TrainingReport
from configuration_router import RouterConfig
from helpers import AGENTS

TEXT = {"model_type": "qwen3", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4}


def config(**settings) -> RouterConfig:
    return RouterConfig(text_config=TEXT, id2label=dict(enumerate(AGENTS)), **settings)


def cv_point(name: str, kind: str, reward: float, cost: float, latency: float, weights=(None, None)) -> dict:
    return {
        "name": name, "kind": kind, "cost_weight": weights[0], "latency_weight": weights[1], "reward": reward,
        "reward_std_repeats": 0.01, "reward_std_folds": 0.05, "delta_reward": reward - 0.9, "delta_se": 0.02,
        "cost_per_1k": cost, "cost_std_repeats": 0.0, "latency_s": latency, "latency_std_repeats": 0.0,
        "share": {a: 0.2 for a in AGENTS},
    }  # fmt: skip


def frontier(*points: dict) -> dict:
    return {
        "agents": AGENTS, "rows": 46, "folds": 5, "repeats": 3, "cv_seed": 0, "search": {"generations": 20},
        "grid": [{"cost_weight": 0, "latency_weight": 0}], "reference": "always frontier_a", "points": list(points),
        "aiq": {}, "aiq_window_cost_per_1k": [0.0, 1.0],
    }  # fmt: skip


def test_the_card_is_rendered_from_the_template():
    report = TrainingReport(model_id="head-x", n_total=46, n_train=35, n_test=11, test_reward=0.61, baselines={})
    card = render_card(config(), report, "org/model", "v2")
    front = card.split("---\n")[1]
    assert 'base_model: "org/model"' in front and "pipeline_tag: text-classification" in front
    assert "# head-x" in card and "Trained on 35 of 46 labelled tasks" in card and "reward 0.6100" in card
    assert "at revision `v2`" in card and card.rstrip().endswith(CARD_END)
    assert "$" not in card  # every placeholder filled
    local = render_card(config(), TrainingReport(), "/models/local-copy", None)
    assert "base_model" not in local.split("---\n")[1]  # a local path is not a Hub model
    assert "## Figures" not in local  # nothing measured, nothing claimed


def test_a_new_card_keeps_what_the_readme_held_after_the_previous_one():
    first = render_card(config(), TrainingReport(model_id="one"), "org/model", None)
    readme = first + "\n# The project\n\nDocumentation.\n"
    second = merge_card(render_card(config(), TrainingReport(model_id="two"), "org/model", None), readme)
    assert "# two" in second and "# one" not in second and second.endswith("\n# The project\n\nDocumentation.\n")
    assert merge_card("card", "a README without the marker") == "card"


def test_a_one_head_card_shows_the_router_next_to_the_fixed_agents():
    stored = frontier(
        cv_point("router lc0_ll0", "router", 0.87, 0.11, 12.0, (0, 0)),
        cv_point("router lc0_ll0 [plain]", "router_form", 0.85, 0.11, 12.0, (0, 0)),
        cv_point("always frontier_a", "fixed", 0.9, 0.1, 20.0),
        cv_point("oracle (first best)", "oracle", 0.95, 0.12, 20.0),
    )
    card = render_card(config(), TrainingReport.from_dict({"frontier": stored}, "report"), "org/model", None)
    assert "## Figures" in card and "3x repeated 5-fold" in card
    row = "| router (router lc0_ll0) | 0.8700 ± 0.0100 | -0.0300 ± 0.0200 | 0.8500 | 0.1100 (110%) | 12.00 (60%) |"
    assert row in card
    assert "| always frontier_a | 0.9000 ± 0.0100 |" in card and "oracle (first best)" not in card
    assert "operating_point=" not in card  # one head: nothing to choose


def test_the_card_lists_every_operating_point_and_marks_the_default():
    figures = PointFigures.from_dict(cv_point("x", "router", 0.88, 0.1, 10.0), "cv")
    points = {
        "quality": PointReport(cost_weight=0, latency_weight=0, cv=figures, cv_plain=figures),
        "cheap": PointReport(cost_weight=2, latency_weight=0),
    }
    stored = frontier(
        cv_point("router lc0_ll0", "router", 0.88, 0.1, 10.0, (0, 0)),
        cv_point("always frontier_a", "fixed", 0.9, 0.1, 20.0),
    )
    report = TrainingReport.from_dict({"frontier": stored}, "report")
    report.operating_points = points
    settings = {name: {"cost_weight": p.cost_weight, "latency_weight": p.latency_weight} for name, p in points.items()}
    card = render_card(config(operating_points=settings, operating_point="cheap"), report, "org/model", None)
    assert "| `quality`: cost 0, latency 0 | 0.8800 ± 0.0100 | -0.0200 ± 0.0200 | 0.8800 |" in card
    assert "| `cheap` (default): cost 2, latency 0 | n/a |" in card  # measured nothing: claims nothing
    assert 'operating_point="cheap"' in card
    assert "holds only the 2 heads, one per operating point (2 x 165 values)" in card


def test_the_guard_section_shows_what_the_guard_measured_and_who_answers_flagged_queries():
    guard = GuardReport(threshold=1.5, fallback_agent="frontier_b", calibration_kept_share=0.98, evaluation={})
    guarded = config(ood_threshold=1.5, ood_fallback_agent="frontier_b")
    card = render_card(guarded, TrainingReport(ood_guard=guard), "org/model", None)
    assert "## Out-of-distribution guard" in card and "score above 1.5000 is flagged" in card
    assert "go to a fallback agent: `frontier_b`." in card
    _, rule, values = card.split("| kept: calibration prompts |")[1].splitlines()[:3]
    assert rule == "| ---: |" and values == "| 0.9800 |"  # one column per figure measured
    assert "AUROC" not in card  # not measured
    assert "## Out-of-distribution guard" not in render_card(config(), TrainingReport(), "org/model", None)


def test_the_card_stays_short():
    guard = GuardReport(threshold=1.5, fallback_agent="frontier_b", calibration_kept_share=0.98)
    stored = frontier(
        cv_point("router lc0_ll0", "router", 0.87, 0.11, 12.0, (0, 0)),
        cv_point("always frontier_a", "fixed", 0.9, 0.1, 20.0),
    )
    report = TrainingReport.from_dict({"frontier": stored, "n_train": 35, "n_test": 11, "test_reward": 0.8}, "r")
    report.ood_guard = guard
    card = render_card(config(ood_threshold=1.5, ood_fallback_agent="frontier_b"), report, "org/model", None)
    assert len(card.splitlines()) <= 70


def in_short(card: str) -> str:
    return next(line for line in card.splitlines() if line.startswith("In short: "))


def test_the_summary_sentence_says_what_the_table_supports():
    """The cheapest router point at equal quality may cost more than the reference: then the card says
    that no point at equal quality costs less, and names the cheapest one; when one does cost less, it
    says that. Read against the card's own table rows."""
    settings = {
        "quality": {"cost_weight": 0, "latency_weight": 0},
        "balanced": {"cost_weight": 0.2, "latency_weight": 0},
    }

    def card_for(quality_cost: float, balanced_cost: float, balanced_reward: float) -> str:
        points = {
            "quality": cv_point("router lc0_ll0", "router", 0.89, quality_cost, 15.0, (0, 0)),
            "balanced": cv_point("router lc0.2_ll0", "router", balanced_reward, balanced_cost, 8.0, (0.2, 0)),
        }
        stored = frontier(*points.values(), cv_point("always frontier_a", "fixed", 0.9, 0.1, 20.0))
        report = TrainingReport.from_dict({"frontier": stored}, "report")
        report.operating_points = {
            name: PointReport(
                cost_weight=s["cost_weight"],
                latency_weight=s["latency_weight"],
                cv=PointFigures.from_dict(points[name], "cv"),
            )
            for name, s in settings.items()
        }
        return render_card(config(operating_points=settings, operating_point="balanced"), report, "org/model", None)

    # quality (Δ -0.01 ± 0.02) is at equal quality but at 107% of the reference's cost; balanced is cheaper but
    # 0.05 below, outside the paired se: no point at equal quality costs less (the README card's case)
    pricier = card_for(0.107, 0.06, 0.85)
    assert "| 0.1070 (107%) |" in pricier
    assert in_short(pricier).startswith(
        "In short: no router point at equal quality with always frontier_a (within the paired se of the reward-only "
        "point) costs less than it; the cheapest of them is quality;"
    )
    cheaper = card_for(0.107, 0.06, 0.89)
    assert "| 0.0600 (60%) |" in cheaper
    assert in_short(cheaper).startswith(
        "In short: the cheapest router point at equal quality with always frontier_a (within the paired se of the "
        "reward-only point) is balanced, which costs less than it;"
    )
