"""How routers treat the forms in which questions reach them: benchmark-formatted pilot prompts, the
same prompts as plain questions, plain in-domain questions as users type them, and OOD queries.

For each router folder: the guard's flagged share per form and per OOD group, its AUROC of plain
questions against each OOD group, how many pilot picks change when the wrapper is removed, and the
pick for the seed's example. Run from the project root (docs/ood-guard.md records its output):

    python scripts/format_study.py OLD_ROUTER_DIR NEW_ROUTER_DIR
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import numpy as np

from benchgen_router import ood
from benchgen_router.files import read_jsonl
from benchgen_router.forms import in_form
from benchgen_router.loading import load_router
from benchgen_router.routing import route_queries

PILOT = Path("../shared/benchgen-pilot/tasks.v1.jsonl")
SEED_EXAMPLE = "What is the derivative of x^3 + 2x?"
NO_TARGET = ("benchmark_style_templated", "benchmark_style_plain")  # questions on general topics: reported only


def study(folder: str) -> None:
    model, tokenizer = load_router(folder)
    prompts = [task["prompt"] for task in read_jsonl(PILOT, "tasks")]
    plain_questions, _ = ood.read_ood_queries(ood.PACKAGED_PLAIN_QUERIES, "plain query set")
    outside, groups = ood.read_ood_queries()
    groups = np.array(groups)
    formatted = route_queries(model, tokenizer, in_form(prompts, "formatted"))
    plain = route_queries(model, tokenizer, in_form(prompts, "plain"))
    typed = route_queries(model, tokenizer, plain_questions)
    away = route_queries(model, tokenizer, outside)
    seed = route_queries(model, tokenizer, [SEED_EXAMPLE])
    agents = model.config.agent_order
    print(f"## {folder}")
    print(f"seed example: {agents[int(seed.picks[0])]} (flagged {bool(seed.out_of_distribution[0])})")
    print(f"pilot prompts flagged, formatted: {formatted.out_of_distribution.mean():.3f}")
    print(f"pilot prompts flagged, plain: {plain.out_of_distribution.mean():.3f}")
    print(f"pilot picks changed by removing the wrapper: {(formatted.picks != plain.picks).mean():.3f}")
    print(f"plain in-domain questions kept: {1 - typed.out_of_distribution.mean():.3f} of {len(plain_questions)}")
    print(f"  picks of plain questions: {dict(Counter(agents[i] for i in typed.picks))}")
    target = ~np.isin(groups, NO_TARGET)
    print(
        f"OOD flagged: {away.out_of_distribution[target].mean():.3f} of {target.sum()} (target groups), "
        f"{away.out_of_distribution.mean():.3f} of {len(groups)} (all)"
    )
    print(f"AUROC plain questions vs target OOD: {ood.auroc(typed.ood_scores, away.ood_scores[target]):.3f}")
    print("| group | queries | flagged | AUROC vs plain questions |")
    print("| --- | ---: | ---: | ---: |")
    for group in dict.fromkeys(groups):
        rows = groups == group
        flagged = away.out_of_distribution[rows].mean()
        print(f"| {group} | {rows.sum()} | {flagged:.3f} | {ood.auroc(typed.ood_scores, away.ood_scores[rows]):.3f} |")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("routers", nargs="+", help="router folders")
    for folder in parser.parse_args().routers:
        study(folder)


if __name__ == "__main__":
    main()
