"""What a training run prints: the search, the held-out table, the CV estimate or the frontier, the guard."""

from __future__ import annotations

from typing import Any

from benchgen_router.ood import group_lines
from benchgen_router.release.report import TrainingReport
from benchgen_router.training.run import TrainResult


def run_summary(result: TrainResult, ensemble_seeds: list[int] | None = None) -> str:
    from benchgen_router.evaluation.metrics import format_cross_validation, format_evaluation

    report, head = result.report, result.head
    default = report.default_operating_point
    runs = f"an ensemble of {len(ensemble_seeds)} seeds, " if ensemble_seeds else ""
    lines = [
        f"train reward {head.train_reward:.4f} after {head.generations_run} generations "
        f"({head.library}, population {head.popsize}, {runs}{head.seconds:.1f} s)",
        format_evaluation(
            report.evaluation, "held-out evaluation" + (f" of operating point {default}" if default else "")
        ),
    ]
    if report.cross_validation is not None:
        lines.append(format_cross_validation(report.cross_validation.to_dict()))
    if report.frontier is not None:
        lines += frontier_lines(report)
    if report.ood_guard is not None:
        lines.append(format_guard(report.ood_guard.to_dict()))
    return "\n".join(lines)


def frontier_lines(report: TrainingReport) -> list[str]:
    from benchgen_router.frontier import format_frontier, headline, headline_text

    lines = [format_frontier(report.frontier, knn_ks=(5,)), headline_text(headline(report.frontier))]
    for name, point in report.operating_points.items():
        held = point.held_out
        lines.append(
            f"operating point {name} (cost weight {point.cost_weight:g}, latency weight "
            f"{point.latency_weight:g}): held out ({held['rows']} rows) reward {held['reward']:.4f}, "
            f"{held['cost_per_1k']:.4f} USD per 1,000 queries, {held['latency_s']:.2f} s"
        )
    target, default = report.target_mode, report.default_operating_point
    if target is not None:
        nested = target["nested_cv"]["point"]
        lines.append(
            f"target mode (eps {target['eps']:g}): chose '{target['chosen']}'; the rule's nested-CV estimate "
            f"({target['nested_cv']['outer']} outer, {target['nested_cv']['inner']} inner): reward "
            f"{nested['reward']:.4f} ± {nested['reward_std_repeats']:.4f}, {nested['cost_per_1k']:.4f} USD per "
            f"1,000 queries, {nested['latency_s']:.2f} s"
        )
    if default is not None:
        lines.append(f"default operating point: {default}")
    return lines


def format_guard(record: dict[str, Any]) -> str:
    """The guard's calibration (and its measurement on the OOD set) as printed lines."""
    fitted = (
        "in-distribution texts (task prompt views and typed questions)" if "n_outside" in record else "task prompts"
    )
    lines = [
        f"out-of-distribution guard: threshold {record['threshold']:.4f}, fallback {record['fallback_agent']}; "
        f"fitted on {record['n_fit']} {fitted}; of {record['n_calibration']} task prompts held out it "
        f"keeps {record['calibration_kept_share']:.3f} (target {record['keep_share']})"
    ]
    if "plain_calibration_kept_share" in record:
        lines.append(
            f"  and {record['plain_calibration_kept_share']:.3f} of {record['n_plain_calibration']} held-out "
            f"in-domain questions (target {record['plain_keep_share']}); fitted against {record['n_outside']} "
            "outside queries"
        )
    if "plain_questions_kept_share" in record:
        lines.append(f"  plain in-domain questions (packaged set) kept: {record['plain_questions_kept_share']:.3f}")
    for form in ("formatted", "plain"):
        if f"labelled_{form}_flagged_share" in record:
            lines.append(f"  labelled tasks {form}: flagged {record[f'labelled_{form}_flagged_share']:.3f} (in-sample)")
    evaluation = record.get("evaluation")
    if evaluation:
        lines.append(
            f"on {evaluation['ood_queries']} OOD queries ({evaluation['ood_queries_file']}): AUROC "
            f"{evaluation['auroc']:.3f}, flagged {evaluation['ood_flagged_share']:.3f}"
        )
        lines += group_lines(evaluation["groups"])
    return "\n".join(lines)
