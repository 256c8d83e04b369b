"""The committed default router (default_router/): it loads with no network through
router_utils.load_router(None) and routes every pilot prompt exactly as recorded when it was trained.

Regenerate it only on purpose (a new head, a new backbone package, a change in the embedding code),
from the project root, then review the figures in the card's demonstration section:

    sed -n '/^## About this default router/,$p' default_router/README.md > /tmp/default-router-note.md
    python train_head.py --rewards ../shared/benchgen-pilot/rewards.jsonl \\
        --tasks ../shared/benchgen-pilot/tasks.v1.jsonl --rewards-id benchgen/router-pilot \\
        --backbone "$(python -c 'import router_utils; print(router_utils.default_router_backbone())')" \\
        --backbone-id sentence-transformers/all-MiniLM-L6-v2 --model-id benchgen-router-lite-demo-minilm \\
        --output-dir /tmp/default-router-run --export default_router --card-note @/tmp/default-router-note.md
    python tests/test_default_router.py --record   # rewrites tests/data/default_router_picks.json
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from router_utils import DEFAULT_ROUTER_DIR, load_router, read_jsonl, run_router

from helpers import AGENTS, PILOT  # also when run as a script: offline, private HF_HOME

PICKS_FILE = Path(__file__).resolve().parent / "data" / "default_router_picks.json"


def route_pilot_prompts() -> dict[str, str]:
    """task_id -> agent id picked by the default router, for every prompt of the pilot task pool."""
    tasks = read_jsonl(PILOT / "tasks.v1.jsonl", "tasks")
    model, tokenizer = load_router(None)
    logits, _ = run_router(model, tokenizer, [task["prompt"] for task in tasks], batch_size=32)
    return {task["task_id"]: model.config.id2label[int(i)] for task, i in zip(tasks, logits.argmax(1), strict=True)}


def test_default_router_loads_offline_and_is_the_demonstration():
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    model, tokenizer = load_router(None)
    assert model.config.agent_order == AGENTS and model.config.embedding_dim == 384
    # the id it records is the Hub model's; load_router(None) reads it from the installed package instead
    recorded = json.loads((DEFAULT_ROUTER_DIR / "config.json").read_text(encoding="utf-8"))
    assert recorded["backbone_name_or_path"] == "sentence-transformers/all-MiniLM-L6-v2"
    logits, _ = run_router(model, tokenizer, ["What is the derivative of x^3 + 2x?", "Name the capital of France."])
    assert logits.shape == (2, 5)
    card = (DEFAULT_ROUTER_DIR / "README.md").read_text(encoding="utf-8")
    assert "a demonstration, not the release" in card and "Qwen/Qwen3-1.7B" in card
    training = model.config.training
    assert (training["n_train"], training["n_test"]) == (35, 11) and training["cross_validation"]["folds"] == 5
    for figure in (
        training["test_reward"],
        training["baselines"]["best_fixed_agent"],
        training["cross_validation"]["router_mean"],
    ):
        assert f"{figure:.4f}" in card
    # the converted folder only: never the pilot data
    assert {p.name for p in DEFAULT_ROUTER_DIR.iterdir()} == {
        "README.md",
        "config.json",
        "configuration_router.py",
        "modeling_router.py",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    }


@pytest.mark.skipif(not (PILOT / "tasks.v1.jsonl").exists(), reason=f"pilot data not found at {PILOT} (CI has it)")
def test_default_router_picks_on_every_pilot_prompt_are_the_recorded_ones():
    recorded = json.loads(PICKS_FILE.read_text(encoding="utf-8"))
    assert len(recorded) == 1110 and set(recorded.values()) <= set(AGENTS)
    picks = route_pilot_prompts()
    changed = {task: (recorded.get(task), pick) for task, pick in picks.items() if recorded.get(task) != pick}
    assert not changed, f"{len(changed)} of {len(picks)} picks changed, e.g. {list(changed.items())[:3]}"


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit(f"usage: python {sys.argv[0]} --record   (rewrites {PICKS_FILE} from the committed default router)")
    PICKS_FILE.parent.mkdir(parents=True, exist_ok=True)
    PICKS_FILE.write_text(json.dumps(route_pilot_prompts(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {PICKS_FILE}")
