"""Which out-of-distribution guard keeps in-domain questions in any form and flags the rest.

Compares guards on repeated seeded splits with the default router's backbone (all-MiniLM-L6-v2):
each split fits on 70% of the pilot prompts (their guard views), half of the typed in-domain fit
questions and 70% of the outside fit queries, calibrates as the trainer does (the larger of the
thresholds keeping 95% of held-out prompts and 90% of held-out typed questions), and measures on
the held-out prompts, the held-out outside queries (dev) and the two sets that are never fitted on
(plain_queries.jsonl, ood_queries.jsonl). docs/ood-guard.md records its output. From the project root:

    python scripts/guard_study.py --splits 10
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
import torch
from mahalanobis_study import knn_cosine_scores

from benchgen_router import ood
from benchgen_router.embeddings import default_cache_dir, embed_prompts
from benchgen_router.files import read_jsonl
from benchgen_router.forms import PILOT_QUERY_FORMAT, guard_views
from benchgen_router.model_code import canonical_query

PILOT = "../shared/benchgen-pilot/tasks.v1.jsonl"
BACKBONE = "sentence-transformers/all-MiniLM-L6-v2"
AGENTS = ["frontier_a", "frontier_b", "frontier_c", "open_mid", "open_cheap_reasoning"]
NO_TARGET = ("benchmark_style_templated", "benchmark_style_plain")
Scorer = Callable[[np.ndarray], np.ndarray]


def embed(texts: list[str]) -> np.ndarray:
    vectors = embed_prompts(texts, BACKBONE, AGENTS, truncation_length=512, cache_dir=default_cache_dir()).vectors
    return ood.unit_rows(vectors)


def distance_scorer(inside: np.ndarray) -> Scorer:
    covariance, _ = ood.shrunk_covariance(inside)
    mean, precision = inside.mean(axis=0), ood.precision_from_covariance(covariance)
    return lambda rows: ood.mahalanobis_scores(rows, mean, precision)


def logistic_scorer(inside: np.ndarray, outside: np.ndarray, with_distance: bool) -> Scorer:
    if with_distance:
        guard = ood.fit_discriminative_guard(inside, outside, {"fit": (inside, 0.5)})
        return guard.scores
    weights, bias = ood.logistic_regression(
        np.vstack([inside, outside]), np.r_[np.zeros(len(inside)), np.ones(len(outside))].astype(bool), ood.DEFAULT_L2
    )
    return lambda rows: rows @ weights + bias


def mlp_scorer(inside: np.ndarray, outside: np.ndarray, hidden: int = 64) -> Scorer:
    distance = distance_scorer(inside)
    features = lambda rows: np.hstack([rows, distance(rows)[:, None] / rows.shape[1]])  # noqa: E731
    torch.manual_seed(0)
    x = torch.tensor(features(np.vstack([inside, outside])), dtype=torch.float32)
    y = torch.tensor(np.r_[np.zeros(len(inside)), np.ones(len(outside))], dtype=torch.float32)
    weight = torch.where(y == 1, 0.5 / y.mean(), 0.5 / (1 - y.mean()))
    net = torch.nn.Sequential(torch.nn.Linear(x.shape[1], hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))
    optimiser = torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=1e-2)
    for _ in range(400):
        optimiser.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(net(x).squeeze(-1), y, weight=weight)
        loss.backward()
        optimiser.step()
    return lambda rows: net(torch.tensor(features(rows), dtype=torch.float32)).squeeze(-1).detach().numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--splits", type=int, default=10)
    args = parser.parse_args()
    prompts = [task["prompt"] for task in read_jsonl(PILOT, "tasks")]
    views = [guard_views(prompt, PILOT_QUERY_FORMAT) for prompt in prompts]
    owners = np.repeat(np.arange(len(prompts)), [len(v) for v in views])
    given, canonical = embed(prompts), embed([canonical_query(p, PILOT_QUERY_FORMAT) for p in prompts])
    view_rows = embed([view for prompt_views in views for view in prompt_views])
    inside_fit = embed(ood.read_ood_queries(ood.PACKAGED_GUARD_INSIDE, "in-domain set")[0])
    outside_fit = embed(ood.read_ood_queries(ood.PACKAGED_GUARD_OUTSIDE, "outside set")[0])
    typed = embed(ood.read_ood_queries(ood.PACKAGED_PLAIN_QUERIES, "plain set")[0])
    queries, groups = ood.read_ood_queries()
    groups = np.array(groups)
    target = ~np.isin(groups, NO_TARGET)
    away = {"given": embed(queries), "canonical": embed([canonical_query(q, PILOT_QUERY_FORMAT) for q in queries])}

    methods = {
        "mahalanobis, prompts as given (the previous guard)": ("given", lambda i, o: distance_scorer(i)),
        "mahalanobis, canonical views": ("views", lambda i, o: distance_scorer(i)),
        "knn5 cosine, canonical views": ("views", lambda i, o: lambda rows: knn_cosine_scores(i, rows, 5)),
        "logistic, embedding only": ("views", lambda i, o: logistic_scorer(i, o, False)),
        "logistic, embedding + distance (shipped)": ("views", lambda i, o: logistic_scorer(i, o, True)),
        "MLP 64, embedding + distance": ("views", lambda i, o: mlp_scorer(i, o)),
    }
    header = (
        "| guard | pilot kept, formatted | pilot kept, plain | plain questions kept | OOD flagged (target) "
        "| worst target group | AUROC plain questions vs OOD | dev: held-out outside flagged |"
    )
    print(header + "\n|" + " --- |" * 8)
    for name, (kind, make) in methods.items():
        rows = []
        for split in range(args.splits):
            rng = np.random.default_rng(split)
            fit, held = ood.split_indices(len(prompts), (0.7, 0.3), split)
            questions = rng.permutation(len(inside_fit))
            q_fit, q_cal = questions[: len(questions) // 2], questions[len(questions) // 2 :]
            outside_order = rng.permutation(len(outside_fit))
            o_fit, o_dev = (
                outside_order[: int(0.7 * len(outside_order))],
                outside_order[int(0.7 * len(outside_order)) :],
            )
            if kind == "given":
                inside, prompt_rows, ood_rows, plain_rows = given[fit], given, away["given"], canonical
            else:
                inside = np.vstack([view_rows[np.isin(owners, fit)], inside_fit[q_fit]])
                prompt_rows, ood_rows, plain_rows = canonical, away["canonical"], canonical
            score = make(inside, outside_fit[o_fit])
            threshold = max(
                ood.conformal_threshold(score(prompt_rows[held]), 0.95),
                ood.conformal_threshold(score(inside_fit[q_cal]), 0.90) if kind != "given" else -np.inf,
            )
            flagged = score(ood_rows) > threshold
            rows.append(
                [
                    (score(prompt_rows[held]) <= threshold).mean(),
                    (score(plain_rows[held]) <= threshold).mean(),
                    (score(typed) <= threshold).mean(),
                    flagged[target].mean(),
                    min(flagged[groups == g].mean() for g in set(groups[target])),
                    ood.auroc(score(typed), score(ood_rows)[target]),
                    (score(outside_fit[o_dev]) > threshold).mean(),
                ]
            )
        mean = np.mean(rows, axis=0)
        print(f"| {name} | " + " | ".join(f"{value:.3f}" for value in mean) + " |", flush=True)


if __name__ == "__main__":
    main()
