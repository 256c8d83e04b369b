"""What an outcome matrix lets a router learn: where the oracle's accuracy comes from, and how well the
embedding, the task group, or both predict each model's correctness held out (docs/benchmarks/mmlu-pro.md).

    python scripts/outcome_signal.py --data mmlu-pro/ --reference gemini-1.5-pro-002 --second gemini-1.5-flash-002

- the oracle (any model right) against the reference's accuracy; on the questions the reference misses,
  how often the other models are right (the second model named, and on average); the oracle of the five
  most accurate models; the best single model per group, chosen in-sample;
- held-out AUROC of each model's correctness on the first repeat of `bench value`'s 5 folds (same seed):
  the group's training accuracy, the probability head over the embedding (the package's embedding cache,
  the default router's backbone), and the head over the embedding with the group one-hot beside it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def auroc(scores: np.ndarray, labels: np.ndarray) -> float:
    """The probability that a random positive outscores a random negative (ties count half)."""
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    start = 0
    while start < len(scores):  # average ranks over ties
        end = start
        while end + 1 < len(scores) and sorted_scores[end + 1] == sorted_scores[start]:
            end += 1
        ranks[order[start : end + 1]] = (start + end) / 2 + 1
        start = end + 1
    positive = labels > 0.5
    n1, n0 = positive.sum(), (~positive).sum()
    return float((ranks[positive].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="an imported folder (tasks, rewards, calls)")
    parser.add_argument("--reference", required=True, help="the model to route around (the best single one)")
    parser.add_argument("--second", required=True, help="a cheaper model to look at beside it")
    parser.add_argument("--folds", type=int, default=5)
    args = parser.parse_args()
    from benchgen_router.bench.value import read_imported_folder
    from benchgen_router.bench.value.run import DEFAULT_BACKBONE
    from benchgen_router.embeddings import default_cache_dir, embed_prompts
    from benchgen_router.frontier.cv import fold_assignments
    from benchgen_router.hardware import cpu_summary
    from benchgen_router.training.probability import fit_probability_head

    matrix = read_imported_folder(args.data)
    rewards, groups = matrix.rewards, np.asarray(matrix.groups)
    best, second = matrix.agents.index(args.reference), matrix.agents.index(args.second)
    missed = rewards[:, best] == 0
    others = np.delete(rewards[missed], best, axis=1)
    top = np.argsort(-rewards.mean(axis=0), kind="stable")[:5]
    in_sample = {group: rewards[groups == group].mean(axis=0).argmax() for group in np.unique(groups)}
    print(f"CPU: {cpu_summary()}; {len(matrix)} tasks, {len(matrix.agents)} models, {len(in_sample)} groups")
    print(f"oracle {rewards.max(axis=1).mean():.4f}; {args.reference} {rewards[:, best].mean():.4f}")
    anyone, second_right = rewards[missed].max(axis=1).mean(), rewards[missed, second].mean()
    print(f"on the {missed.mean():.1%} {args.reference} misses: some other model right {anyone:.4f}, ", end="")
    print(f"the others on average {others.mean():.4f}, {args.second} {second_right:.4f}")
    names = ", ".join(matrix.agents[j] for j in top)
    print(f"oracle of the five most accurate ({names}): {rewards[:, top].max(axis=1).mean():.4f}")
    per_group = np.mean([rewards[i, in_sample[group]] for i, group in enumerate(groups)])
    print(f"best single model per group, in-sample: {per_group:.4f}")

    embeddings = embed_prompts(
        list(matrix.prompts), DEFAULT_BACKBONE, ["router"], cache_dir=default_cache_dir()
    ).vectors
    onehot = (groups[:, None] == np.unique(groups)[None, :]).astype(np.float32)
    folds = fold_assignments(len(matrix), args.folds, 1, 0)[0]
    rows: dict[str, list[tuple[float, float, float]]] = {"group": [], "embedding": [], "both": []}
    for fold in range(args.folds):
        test, train = folds == fold, folds != fold
        table = {group: rewards[train & (groups == group)].mean(axis=0) for group in np.unique(groups)}
        predicted = {
            "group": np.stack([table[group] for group in groups[test]]),
            "embedding": fit_probability_head(embeddings[train], rewards[train], seed=0).predict(embeddings[test]),
        }
        both = np.hstack([embeddings, 3 * onehot])  # the one-hot on the embedding's scale
        predicted["both"] = fit_probability_head(both[train], rewards[train], seed=0).predict(both[test])
        for name, probabilities in predicted.items():
            per_model = [auroc(probabilities[:, j], rewards[test, j]) for j in range(rewards.shape[1])]
            rows[name].append((float(np.mean(per_model)), per_model[best], per_model[second]))
    print(f"\n| predictor | mean over the models | {args.reference} | {args.second} |\n| --- | ---: | ---: | ---: |")
    for name, values in rows.items():
        array = np.asarray(values)
        cells = " | ".join(f"{array[:, k].mean():.3f} ± {array[:, k].std(ddof=1):.3f}" for k in range(3))
        print(f"| {name} | {cells} |")


if __name__ == "__main__":
    main()
