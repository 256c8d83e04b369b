"""How docs/ood-guard.md compared the Mahalanobis guard with other scores and poolings: the guard's
score on unit rows (OAS, Ledoit-Wolf, raw rows) and cosine kNN, on repeated seeded 60/20/20 splits of
the pilot prompts (fit / calibration / test), against the packaged out-of-distribution queries;
then the same score on the question alone (its tokens pooled, or its text embedded in a second
pass). From the project root:

    python scripts/mahalanobis_study.py --seeds 100
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchgen_router import ood
from benchgen_router.files import read_jsonl
from benchgen_router.forms import INSTRUCTIONS, LABELS
from benchgen_router.loading import load_router
from benchgen_router.routing import run_router

PILOT = Path(__file__).resolve().parents[1].parent / "shared" / "benchgen-pilot"
KEEP = ood.DEFAULT_KEEP_SHARE
PLAIN_GROUPS = ood.PLAIN_OOD_GROUPS
HARD_GROUPS = ood.BENCHMARK_STYLE_OOD_GROUPS


def as_rows(embeddings: np.ndarray, what: str = "embeddings") -> np.ndarray:
    return np.asarray(embeddings, dtype=np.float64)


def embed_everything() -> dict[str, np.ndarray | list[str]]:
    """Default-router embeddings of every pilot prompt and every OOD query, in one pass each."""
    tasks = read_jsonl(PILOT / "tasks.v1.jsonl", "tasks")
    queries, groups = ood.read_ood_queries()
    model, tokenizer = load_router(None)
    started = time.perf_counter()
    pilot_logits, pilot = run_router(model, tokenizer, [task["prompt"] for task in tasks])
    pilot_seconds = time.perf_counter() - started
    ood_logits, outside = run_router(model, tokenizer, queries)
    return {
        "pilot": pilot,
        "ood": outside,
        "groups": groups,
        "tasks": tasks,
        "pilot_seconds": pilot_seconds,
        "pilot_picks": pilot_logits.argmax(1),
        "ood_picks": ood_logits.argmax(1),
    }


def knn_cosine_scores(reference: np.ndarray, embeddings: np.ndarray, k: int = 5) -> np.ndarray:
    """Mean cosine distance (1 - cosine similarity) of each row to its k nearest reference rows."""
    ref = ood.unit_rows(reference)
    queries = ood.unit_rows(embeddings)
    if not 1 <= k <= len(ref):
        raise ValueError(f"k must lie between 1 and the {len(ref)} reference embeddings; got {k}.")
    distances = 1.0 - queries @ ref.T
    nearest = np.partition(distances, k - 1, axis=1)[:, :k]
    return nearest.mean(axis=1)


def fit_guard_split(
    embeddings: np.ndarray,
    keep_share: float = ood.DEFAULT_KEEP_SHARE,
    calibration_share: float = 0.3,
    seed: int = 0,
    shrinkage: str = "oas",
    metadata: Mapping[str, str] | None = None,
) -> ood.OODGuard:
    """ood.fit_guard() on a seeded split of one set of in-distribution embeddings: calibration_share of the
    rows calibrate, the rest fit."""
    if not 0.0 < calibration_share < 1.0:
        raise ValueError(f"calibration share must lie strictly between 0 and 1; got {calibration_share}.")
    rows = np.asarray(embeddings, dtype=np.float64)
    fit_rows, calibration_rows = ood.split_indices(len(rows), (1.0 - calibration_share, calibration_share), seed)
    info = {"split_seed": str(seed), "calibration_share": f"{calibration_share}", **(metadata or {})}
    return ood.fit_guard(rows[fit_rows], rows[calibration_rows], keep_share, shrinkage, info)


SCORE_METHODS = ("mahalanobis", "mahalanobis_lw", "mahalanobis_raw", "knn1", "knn5", "knn10")


def make_scorer(method: str, fit_embeddings: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """A score function fitted on in-distribution rows (higher = further out). 'mahalanobis' is the
    guard's score (unit rows, OAS); 'mahalanobis_lw' the same with Ledoit-Wolf; 'mahalanobis_raw'
    skips the unit scaling; 'knnK' is knn_cosine_scores() with k = K against the fit rows."""
    if method.startswith("knn") and method[3:].isdigit():
        reference, k = ood.unit_rows(fit_embeddings), int(method[3:])
        return lambda rows: knn_cosine_scores(reference, rows, k)
    if method not in ("mahalanobis", "mahalanobis_lw", "mahalanobis_raw"):
        raise ValueError(f"unknown score method '{method}'; use one of {', '.join(SCORE_METHODS)} (any knnK).")
    prepare = as_rows if method == "mahalanobis_raw" else (lambda rows, what="": ood.unit_rows(rows))
    fit = prepare(fit_embeddings, "fit embeddings")
    covariance, _ = ood.shrunk_covariance(fit, "ledoit_wolf" if method == "mahalanobis_lw" else "oas")
    mean, precision = fit.mean(axis=0), ood.precision_from_covariance(covariance)
    return lambda rows: ood.mahalanobis_scores(prepare(rows, "embeddings"), mean, precision)


@dataclass
class SplitEvaluation:
    """Per split (one entry per seed): the share of test in-distribution rows kept, and per OOD group
    the AUROC against those rows and the share flagged at the calibrated threshold."""

    kept: np.ndarray
    thresholds: np.ndarray
    auroc: dict[str, np.ndarray]
    flagged: dict[str, np.ndarray]
    rewritten_kept: np.ndarray | None = None


def evaluate_splits(
    id_embeddings: np.ndarray,
    ood_embeddings: np.ndarray,
    ood_groups: Sequence[str],
    method: str = "mahalanobis",
    seeds: Sequence[int] = tuple(range(20)),
    shares: tuple[float, float, float] = (0.6, 0.2, 0.2),
    keep_share: float = ood.DEFAULT_KEEP_SHARE,
    rewritten_embeddings: np.ndarray | None = None,
) -> SplitEvaluation:
    """For each seed: split the in-distribution rows into fit / calibration / test parts (shares),
    fit the score on the first, calibrate the threshold on the second (ood.conformal_threshold()), and
    measure on the third and on every OOD group. rewritten_embeddings, when given, are the same
    in-distribution prompts written another way (row for row); their test rows' kept share is kept too."""
    groups = np.asarray(ood_groups)
    if len(groups) != len(ood_embeddings):
        raise ValueError(f"{len(ood_embeddings)} OOD embeddings but {len(groups)} group names; give one per row.")
    names = list(dict.fromkeys(groups.tolist()))
    kept, thresholds, rewritten_kept = [], [], []
    auroc_by_group: dict[str, list[float]] = {name: [] for name in names}
    flagged_by_group: dict[str, list[float]] = {name: [] for name in names}
    for seed in seeds:
        fit_rows, calibration_rows, test_rows = ood.split_indices(len(id_embeddings), shares, seed)
        score = make_scorer(method, id_embeddings[fit_rows])
        threshold = ood.conformal_threshold(score(id_embeddings[calibration_rows]), keep_share)
        test_scores, ood_scores = score(id_embeddings[test_rows]), score(ood_embeddings)
        kept.append(float(np.mean(test_scores <= threshold)))
        thresholds.append(threshold)
        if rewritten_embeddings is not None:
            rewritten_kept.append(float(np.mean(score(rewritten_embeddings[test_rows]) <= threshold)))
        for name in names:
            group_scores = ood_scores[groups == name]
            auroc_by_group[name].append(ood.auroc(test_scores, group_scores))
            flagged_by_group[name].append(float(np.mean(group_scores > threshold)))
    return SplitEvaluation(
        kept=np.array(kept),
        thresholds=np.array(thresholds),
        auroc={name: np.array(values) for name, values in auroc_by_group.items()},
        flagged={name: np.array(values) for name, values in flagged_by_group.items()},
        rewritten_kept=np.array(rewritten_kept) if rewritten_embeddings is not None else None,
    )


# Every pilot prompt (tasks.v1.jsonl) is a label, the question, a blank line and one of these
# instruction paragraphs. Mean pooling over the whole prompt is dominated by the wrapper, so a foreign
# or off-domain question inside it looks in-distribution; pooling only the question's tokens does not
# (docs/ood-guard.md). Only these exact strings are removed: a user's own last paragraph stays.
def content_span(text: str) -> tuple[int, int]:
    """(start, end) character offsets of the question inside a known answer-format wrapper: after a
    known label, before a known final paragraph (preceded by a blank line); (0, len) without either,
    and never an empty span."""

    end = len(text.rstrip())
    for paragraph in INSTRUCTIONS:
        if text[:end].endswith("\n\n" + paragraph):
            end = len(text[: end - len(paragraph)].rstrip())
            break
    start = next((len(label) for label in LABELS if text.startswith(label)), 0)
    if not text[start:end].strip():  # only a wrapper: keep everything rather than nothing
        return 0, len(text.rstrip())
    return start, end


def _mean_cost_per_query(score, rows: np.ndarray, repeats: int = 5) -> float:
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        score(rows)
        timings.append(time.perf_counter() - started)
    return float(np.median(timings)) / len(rows)


def question_only(text: str) -> str:
    start, end = content_span(text)
    return text[start:end]


def question_pooled_embeddings(model, tokenizer, texts: list[str], batch_size: int = 16) -> np.ndarray:
    """Mean of the backbone's last hidden states over the tokens of the question only (content_span()),
    in the same pass as the whole prompt: the wrapper still gives context but is not averaged in.
    BERT-style (unpacked) backbones only, as the default router's."""
    import torch

    pooled = np.zeros((len(texts), model.config.embedding_dim), dtype=np.float32)
    order = np.argsort([len(text) for text in texts], kind="stable")
    with torch.inference_mode():
        for first in range(0, len(texts), batch_size):
            rows = order[first : first + batch_size]
            encoded = tokenizer(
                [texts[row] for row in rows],
                truncation=True,
                max_length=model.config.truncation_length,
                padding=True,
                return_offsets_mapping=True,
                return_tensors="pt",
            )
            offsets = encoded.pop("offset_mapping")
            hidden = model.backbone(**encoded).last_hidden_state.float()
            for position, row in enumerate(rows):
                start, end = content_span(texts[row])
                # special tokens have empty (0, 0) offsets and fall outside every span
                inside = (encoded["attention_mask"][position] == 1) & (offsets[position, :, 1] > start)
                inside &= offsets[position, :, 0] < end
                pooled[row] = hidden[position][inside].mean(dim=0).numpy()
    return pooled


def _print_method_row(label: str, ev: SplitEvaluation, stored: str, cost: str) -> None:
    plain = [ev.flagged[group].mean() for group in PLAIN_GROUPS]
    hard = " | ".join(f"{ev.flagged[g].mean():.3f} ({ev.auroc[g].mean():.3f})" for g in HARD_GROUPS)
    reworded = f"{ev.rewritten_kept.mean():.3f}" if ev.rewritten_kept is not None else "="
    print(
        f"| {label} | {ev.kept.mean():.3f} / {ev.kept.min():.3f} | {np.mean(plain):.3f} / {min(plain):.3f} | "
        f"{hard} | {reworded} | {stored} | {cost} |"
    )


def _print_group_table(label: str, ev: SplitEvaluation, groups: list[str]) -> None:
    quantiles = np.percentile(ev.kept, [5, 50, 95]).round(3).tolist()
    print(f"\n{label}: kept share over the splits: 5/50/95% quantiles {quantiles}, sd {ev.kept.std():.3f}\n")
    print("| group | queries | AUROC mean (min) | flagged mean (min) |\n|---|---|---|---|")
    for name in dict.fromkeys(groups):
        print(
            f"| {name} | {groups.count(name)} | {ev.auroc[name].mean():.3f} ({ev.auroc[name].min():.3f}) | "
            f"{ev.flagged[name].mean():.3f} ({ev.flagged[name].min():.3f}) |"
        )


def report(seeds: int) -> None:
    data = embed_everything()
    pilot, outside, groups, tasks = data["pilot"], data["ood"], data["groups"], data["tasks"]
    print(f"embedded {len(pilot)} pilot prompts in {data['pilot_seconds']:.1f} s")
    prompts = [task["prompt"] for task in tasks]
    queries, _ = ood.read_ood_queries()
    model, tokenizer = load_router(None)
    _, pilot_questions = run_router(model, tokenizer, [question_only(prompt) for prompt in prompts])
    _, ood_questions = run_router(model, tokenizer, [question_only(query) for query in queries])
    pooled_pilot = question_pooled_embeddings(model, tokenizer, prompts)
    pooled_ood = question_pooled_embeddings(model, tokenizer, queries)
    pooled_pilot_questions = question_pooled_embeddings(model, tokenizer, [question_only(p) for p in prompts])

    splits = range(seeds)
    dim = pilot.shape[1]
    fit_rows = ood.split_indices(len(pilot), (0.6, 0.2, 0.2), 0)[0]
    print(f"\n{seeds} seeded splits 60/20/20 (fit/calibration/test), keep share {KEEP}; hard groups: flagged (AUROC)\n")
    print(
        "| method | kept (mean / min) | plain flagged (mean / worst group) | "
        + " | ".join(HARD_GROUPS)
        + " | pilot questions without wrapper kept | stored bytes (float32) | score µs/query |"
    )
    print("|" + "---|" * (7 + len(HARD_GROUPS)))
    evaluations = {}
    for method in ("mahalanobis", "mahalanobis_lw", "mahalanobis_raw", "knn1", "knn5", "knn10"):
        ev = evaluate_splits(pilot, outside, groups, method, splits, rewritten_embeddings=pilot_questions)
        evaluations[method] = ev
        stored = 4 * (len(fit_rows) * dim + 1) if method.startswith("knn") else 4 * (dim + dim * dim + 1)
        cost = _mean_cost_per_query(make_scorer(method, pilot[fit_rows]), np.tile(pilot, (2, 1)))
        _print_method_row(method, ev, f"{stored:,}", f"{cost * 1e6:.1f}")
    pooled = evaluate_splits(
        pooled_pilot, pooled_ood, groups, "mahalanobis", splits, rewritten_embeddings=pooled_pilot_questions
    )
    _print_method_row("mahalanobis, question tokens pooled (same pass)", pooled, "same", "same + pooling")
    second = evaluate_splits(pilot_questions, ood_questions, groups, "mahalanobis", splits)
    _print_method_row("mahalanobis, question text embedded (second pass)", second, "same", "same + a backbone pass")

    _print_group_table(
        "chosen: mahalanobis (unit rows, OAS) of the router's embedding", evaluations["mahalanobis"], groups
    )
    _print_group_table("remedy: the same on question tokens pooled", pooled, groups)

    shipped = fit_guard_split(pilot, KEEP)
    print(
        f"\nguard on all {len(pilot)} prompts (fit_guard_split, seed 0): threshold {shipped.threshold:.4f}, "
        f"OAS weight {shipped.metadata['shrinkage_weight']}, n_fit {shipped.metadata['n_fit']}, "
        f"n_calibration {shipped.metadata['n_calibration']}, flags {shipped.flags(outside).mean():.3f} of the OOD set"
    )
    agent_names = list(model.config.id2label.values())
    plain = np.isin(groups, PLAIN_GROUPS)
    for label, picks in (("pilot prompts", data["pilot_picks"]), ("plain OOD queries", data["ood_picks"][plain])):
        counts = np.bincount(picks, minlength=len(agent_names)).tolist()
        print(f"router's picks on the {len(picks)} {label}: {dict(zip(agent_names, counts, strict=True))}")

    rewards = read_jsonl(PILOT / "rewards.jsonl", "rewards")
    agents = rewards[0]["agent_order"]
    train = [row for row in rewards if row["split"] != "test"]
    train_ids = {row["task_id"] for row in train}
    table = np.array([row["mean_reward"] for row in train])
    calls = [
        call
        for row in read_jsonl(PILOT / "rewards.v1-pilot.jsonl", "pilot calls")
        if row["task_id"] in train_ids
        for call in row["calls"]
    ]
    costs = np.array([np.mean([call["cost_usd"] for call in calls if call["agent"] == agent]) for agent in agents])
    print(f"\nfallback on the {len(train)} training rows (split != test):")
    for agent, reward, cost in zip(agents, table.mean(0), costs, strict=True):
        print(f"  {agent}: mean reward {reward:.4f}, mean cost per call {cost * 1e6:.1f} µUSD")
    print(f"  best fixed agent: {agents[ood.fallback_agent(table)]}")
    for tolerance in (0.0, 0.02, 0.05, 0.1):
        print(f"  cheapest within {tolerance}: {agents[ood.fallback_agent(table, costs, tolerance)]}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Print the measured tables of docs/ood-guard.md.")
    parser.add_argument("--seeds", type=int, default=100, help="seeded splits (default: %(default)s)")
    arguments = parser.parse_args()
    if not (PILOT / "tasks.v1.jsonl").exists():
        sys.exit(f"pilot data not found at {PILOT}")
    report(arguments.seeds)
