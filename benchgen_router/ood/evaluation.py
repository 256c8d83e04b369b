"""How well a guard separates: AUROC overall and per query group, and the shares flagged and kept.

AUROC is reported next to the flagged shares because it does not depend on the threshold: it says
whether a group can be told apart at all, the shares whether the calibrated threshold does so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from benchgen_router.errors import InputError


def auroc(in_scores: np.ndarray, out_scores: np.ndarray) -> float:
    """Area under the ROC curve for telling out-of-distribution (higher score) from in-distribution:
    P(out > in) + P(equal) / 2, by the rank-sum (Mann-Whitney) identity with tied scores given their
    mean rank, so ties count half without comparing every pair."""
    inside = np.asarray(in_scores, dtype=np.float64).ravel()
    outside = np.asarray(out_scores, dtype=np.float64).ravel()
    if len(inside) == 0 or len(outside) == 0:
        raise InputError("AUROC needs at least one in-distribution and one out-of-distribution score.")
    pooled = np.concatenate([inside, outside])
    _, group, counts = np.unique(pooled, return_inverse=True, return_counts=True)
    # the values of a tie group take ranks after those of all smaller values; each gets their mean
    mean_rank = np.cumsum(counts) - counts + (counts + 1) / 2.0
    rank_sum = mean_rank[group][len(inside) :].sum()
    return float((rank_sum - len(outside) * (len(outside) + 1) / 2) / (len(inside) * len(outside)))


def evaluate_guard(
    threshold: float,
    in_scores: np.ndarray,
    ood_scores: np.ndarray,
    ood_groups: Sequence[str],
    in_rows: str,
) -> dict[str, object]:
    """The guard's figures from its scores of in-distribution rows and of OOD queries: AUROC overall
    and per group, the share flagged per group at the threshold, the share of in-distribution rows
    kept. `in_rows` names those rows in the record, as they differ between trainer and evaluator."""
    inside = np.asarray(in_scores, dtype=np.float64)
    outside = np.asarray(ood_scores, dtype=np.float64)
    groups = np.asarray(list(ood_groups))
    per_group = {}
    for group in dict.fromkeys(ood_groups):
        scores = outside[groups == group]
        per_group[str(group)] = {
            "queries": len(scores),
            "auroc": auroc(inside, scores),
            "flagged_share": float((scores > threshold).mean()),
        }
    return {
        "threshold": float(threshold),
        "in_distribution_rows": in_rows,
        "in_distribution_count": len(inside),
        "in_distribution_kept_share": float((inside <= threshold).mean()),
        "ood_queries": len(outside),
        "ood_flagged_share": float((outside > threshold).mean()),
        "auroc": auroc(inside, outside),
        "groups": per_group,
    }


def group_lines(groups: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One printed line per OOD group: its size, the share flagged and the AUROC against in-distribution."""
    return [
        f"  {group:<28} {figures['queries']:>3} queries  flagged {figures['flagged_share']:.3f}  "
        f"AUROC {figures['auroc']:.3f}"
        for group, figures in groups.items()
    ]
