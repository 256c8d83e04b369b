"""Quality per dollar and per second: repeated k-fold cross-validation of cost-aware routers over a
grid of trade-off weights, the baselines on the same folds, the non-dominated frontier, an area-
under-frontier summary, plots, and the choice of an operating point by nested cross-validation.

    grid     the trade-offs and the search each router point runs
    cv       policies scored on held-out rows: the statistics below, baselines, nested CV, in-sample
    pareto   dominance, the frontier, its area and the headline
    gap      the share of the quality gap recovered per cost: RouteLLM's APGR and CPT, and any pool's
    report   the table and the JSON
    plots    the PNGs
    `benchgen-router frontier` is the analysis as a command (benchgen_router/cli/frontier.py)

Every router point is the ordinary search (`search_head`) run on the utility matrix
U = R - cost_weight * C - latency_weight * L of the training folds (units in costs.py: C in USD per
1,000 queries, L in seconds); its picks on the held-out fold are scored on the held-out rows' true
reward, cost and latency.

Statistics, defined once here and used by every table:
- Each repeat is one seeded shuffle into k folds, so every row is held out exactly once per repeat.
  `reward` is the mean over repeats of that repeat's mean held-out reward (all rows pooled).
- `reward_std_repeats`: standard deviation (ddof=1) over repeats of the repeat means: how much the
  result moves with the fold assignment (and hence the training sets). A fixed agent has 0 here.
- `reward_std_folds`: standard deviation (ddof=1) over all repeats x folds of the per-fold means:
  the noise of one fold-sized test set.
- `delta_reward` / `delta_se`: the paired difference to the reference policy (the best fixed agent
  on all rows, "always frontier_a" on the pilot): per task, the difference averaged over repeats;
  `delta_se` is the standard error of its mean over tasks (std ddof=1 / sqrt(rows)), the sampling
  error of the task set itself, which is what "equal quality" has to be judged against.
- cost and latency: mean per query over held-out picks, cost in USD per 1,000 queries.
- `share`: fraction of held-out queries sent to each agent.
"""

from __future__ import annotations

from benchgen_router.frontier.cv import (
    DEFAULT_CV_SEED,
    DEFAULT_FOLDS,
    DEFAULT_KNN_KS,
    DEFAULT_REPEATS,
    IN_SAMPLE_SEARCH,
    CVPoint,
    FrontierResult,
    TargetResult,
    TrainedHead,
    best_fixed_agent,
    cross_validate_frontier,
    evaluate_policies,
    fold_assignments,
    knn_picks,
    nested_target_cv,
    select_tradeoff,
    train_heads_over_grid,
)
from benchgen_router.frontier.gap import (
    GapCurve,
    GapFigures,
    PoolGap,
    frontier_gap,
    oracle_curve,
    score_curve,
    threshold_sweep,
    two_agent_gap,
)
from benchgen_router.frontier.grid import (
    DEFAULT_COST_WEIGHTS,
    DEFAULT_LATENCY_WEIGHTS,
    DEFAULT_MIXED_WEIGHTS,
    DEFAULT_SEARCH,
    Searcher,
    Tradeoff,
    check_search_options,
    default_grid,
    make_searcher,
    parse_grid,
    regularised_utility,
    run_search,
    search_settings,
)
from benchgen_router.frontier.pareto import (
    FRONTIER_KINDS,
    aiq_window,
    area_under_frontier,
    cheapest_within,
    cost_to_reach,
    dominates,
    frontier_value,
    headline,
    headline_text,
    mark_frontier,
    non_dominated,
    reachable_frontier,
)
from benchgen_router.frontier.plots import (
    plot_frontier,
    plot_gap_curves,
    plot_gap_panels,
    plot_policies,
)
from benchgen_router.frontier.report import (
    format_frontier,
    format_gap,
    frontier_from_dict,
    frontier_to_dict,
)

__all__ = [
    "DEFAULT_COST_WEIGHTS",
    "DEFAULT_CV_SEED",
    "DEFAULT_FOLDS",
    "DEFAULT_KNN_KS",
    "DEFAULT_LATENCY_WEIGHTS",
    "DEFAULT_MIXED_WEIGHTS",
    "DEFAULT_REPEATS",
    "DEFAULT_SEARCH",
    "FRONTIER_KINDS",
    "IN_SAMPLE_SEARCH",
    "CVPoint",
    "FrontierResult",
    "GapCurve",
    "GapFigures",
    "PoolGap",
    "Searcher",
    "TargetResult",
    "Tradeoff",
    "TrainedHead",
    "aiq_window",
    "area_under_frontier",
    "best_fixed_agent",
    "cheapest_within",
    "check_search_options",
    "cost_to_reach",
    "cross_validate_frontier",
    "default_grid",
    "dominates",
    "evaluate_policies",
    "fold_assignments",
    "format_frontier",
    "format_gap",
    "frontier_from_dict",
    "frontier_gap",
    "frontier_to_dict",
    "frontier_value",
    "headline",
    "headline_text",
    "knn_picks",
    "make_searcher",
    "mark_frontier",
    "nested_target_cv",
    "non_dominated",
    "oracle_curve",
    "parse_grid",
    "plot_frontier",
    "plot_gap_curves",
    "plot_gap_panels",
    "plot_policies",
    "reachable_frontier",
    "regularised_utility",
    "run_search",
    "score_curve",
    "search_settings",
    "select_tradeoff",
    "threshold_sweep",
    "train_heads_over_grid",
    "two_agent_gap",
]
