"""Evaluating routing decisions: the library behind `benchgen-router evaluate`.

    from benchgen_router.evaluation import EvaluateConfig, evaluate
    report = evaluate(EvaluateConfig(rewards="rewards.jsonl", tasks="tasks.v1.jsonl"))

The modules: run (evaluate: a router routed over reward data at each operating point, placed against
the fixed agents) and metrics (the reference baselines, the evaluation table, how both are printed).
The names below load lazily, so the metrics (numpy only) import nothing else.
"""

from __future__ import annotations

from benchgen_router.moved import lazy_names

_METRICS = "benchgen_router.evaluation.metrics"
_RUN = "benchgen_router.evaluation.run"
_LAZY = {
    "baselines": _METRICS,
    "evaluate_picks": _METRICS,
    "format_cross_validation": _METRICS,
    "format_evaluation": _METRICS,
    "IN_SAMPLE_NOTE": _RUN,
    "EvaluateConfig": _RUN,
    "EvaluateReport": _RUN,
    "evaluate": _RUN,
    "in_pool_order": _RUN,
    "place_against_fixed_agents": _RUN,
    "point_name": _RUN,
    "routing_gap": _RUN,
    "two_agent_costs": _RUN,
}
__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_names(__name__, _LAZY)
