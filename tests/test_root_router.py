"""The committed router at the repository root (the Hub model folder): it loads offline with no
override, its card is the root README, it routes every pilot prompt exactly as recorded when it was
trained, in either form, and its guard keeps what users type and flags the rest.

Regenerate it only on purpose (a new head, a new backbone package, a change in the embedding code),
from the repository root, then review the figures in the card:

    bash scripts/regenerate-default-router.sh   # retrains, exports, rewrites tests/data/default_router_picks.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from benchgen_router.loading import load_router
from benchgen_router.model_code import default_router_dir
from benchgen_router.release.card import CARD_END
from benchgen_router.release.folder import HUB_FILES
from benchgen_router.release.report import REPORT_FILE, read_report
from benchgen_router.routing import route_queries
from helpers import AGENTS, NO_PILOT, PILOT, PROJECT_ROOT, route_pilot_prompts

PICKS_FILE = Path(__file__).resolve().parent / "data" / "default_router_picks.json"


def test_the_root_is_the_router_and_its_readme_is_the_card():
    root = default_router_dir()
    assert root == PROJECT_ROOT  # a clone: the repository root itself
    model, _ = load_router(None)
    assert model.config.agent_order == AGENTS and model.config.embedding_dim == 384
    recorded = json.loads((root / "config.json").read_text(encoding="utf-8"))
    assert recorded["backbone_name_or_path"] == "sentence-transformers/all-MiniLM-L6-v2"
    readme = (root / "README.md").read_text(encoding="utf-8")
    front = readme.split("---\n")[1]
    for line in ("library_name: transformers", "pipeline_tag: text-classification", "license:", "tags:"):
        assert line in front
    assert 'base_model: "sentence-transformers/all-MiniLM-L6-v2"' in front
    card, docs = readme.split(CARD_END)
    assert "a demonstration, not the release" in card and "Qwen/Qwen3-1.7B" in card
    report = read_report(root / REPORT_FILE)
    assert model.config.training == report.summary() and len((root / "config.json").read_bytes()) < 16_000
    assert (report.n_train, report.n_test) == (35, 11)
    assert (report.frontier.repeats, report.frontier.folds) == (10, 5)
    for figure in (report.test_reward, report.baselines["best_fixed_agent"]):
        assert f"{figure:.4f}" in card
    # the cost-aware default the card claims, and every point's cross-validated figures on it
    assert model.config.operating_point == report.default_operating_point == "balanced"
    assert (
        set(model.config.operating_points) == set(report.operating_points) == {"quality", "balanced", "economy", "fast"}
    )
    for name, point in report.operating_points.items():
        row = f"{point.cv.reward:.4f} ± {point.cv.reward_std_repeats:.4f} | {point.cv.delta_reward:+.4f}"
        assert f"{row} ± {point.cv.delta_se:.4f} | {point.cv_plain.reward:.4f} |" in card, name
    assert len(card.splitlines()) <= 85
    assert "benchgen-router route" in docs and "python -m pytest" in docs  # the project's documentation


def test_pushing_the_root_uploads_the_model_files_not_the_tooling():
    from fnmatch import fnmatch

    pushed = {p.name for p in PROJECT_ROOT.iterdir() if p.is_file() and any(fnmatch(p.name, h) for h in HUB_FILES)}
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md", "modeling_router.py"} <= pushed
    assert not pushed & {"pyproject.toml", "constraints.txt", "bench_gpu.sh"}
    assert not [p for p in PROJECT_ROOT.iterdir() if p.is_dir() and any(fnmatch(p.name, h) for h in HUB_FILES)]


@pytest.mark.slow
@pytest.mark.skipif(not (PILOT / "tasks.v1.jsonl").exists(), reason=NO_PILOT)
def test_default_router_picks_on_every_pilot_prompt_are_the_recorded_ones(pilot_routed):
    recorded = json.loads(PICKS_FILE.read_text(encoding="utf-8"))
    assert len(recorded) == 1110 and set(recorded.values()) <= set(AGENTS)
    picks, _ = pilot_routed["formatted"]
    changed = {task: (recorded.get(task), pick) for task, pick in picks.items() if recorded.get(task) != pick}
    assert not changed, f"{len(changed)} of {len(picks)} picks changed, e.g. {list(changed.items())[:3]}"
    plain, _ = pilot_routed["plain"]  # the same questions without their label and instruction
    assert plain == picks


@pytest.mark.slow
@pytest.mark.skipif(not (PILOT / "tasks.v1.jsonl").exists(), reason=NO_PILOT)
def test_the_guard_keeps_what_users_type_and_flags_the_rest(committed_router, pilot_routed):
    """The committed router on sets it was never fitted on: plain in-domain questions kept >= 90%,
    pilot prompts kept >= 95% in either form, OOD queries flagged >= 90% (the groups with a target:
    all but the benchmark-style questions on general topics), and each point's fallback answers."""
    from benchgen_router import ood

    model, tokenizer = committed_router
    questions, _ = ood.read_ood_queries(ood.PACKAGED_PLAIN_QUERIES, "plain query set")
    assert len(questions) >= 150
    assert route_queries(model, tokenizer, questions).out_of_distribution.mean() <= 0.10
    for form, (_, routed) in pilot_routed.items():
        assert routed.out_of_distribution.mean() <= 0.05, form
    queries, groups = ood.read_ood_queries()
    target = [group not in ("benchmark_style_templated", "benchmark_style_plain") for group in groups]
    outside = [query for query, keep in zip(queries, target, strict=True) if keep]
    flagged = route_queries(model, tokenizer, outside, operating_points="economy")
    assert flagged.out_of_distribution.mean() >= 0.90
    assert {AGENTS[i] for i in flagged.picks[flagged.out_of_distribution]} == {"open_cheap_reasoning"}
    seed_example = route_queries(model, tokenizer, ["What is the derivative of x^3 + 2x?"])
    assert not seed_example.out_of_distribution[0]


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit(f"usage: python {sys.argv[0]} --record   (rewrites {PICKS_FILE} from the committed router)")
    PICKS_FILE.parent.mkdir(parents=True, exist_ok=True)
    PICKS_FILE.write_text(json.dumps(route_pilot_prompts()[0], indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {PICKS_FILE}")
