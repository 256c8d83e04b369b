"""The model card (a router folder's README.md), rendered from its config and its typed training report.

Each figure appears once; the full tables stay in training_report.json beside the card.
"""

from __future__ import annotations

import json
import re
import string
from pathlib import Path
from typing import Any

from benchgen_router.frontier.cv import FrontierResult
from benchgen_router.frontier.pareto import headline, headline_text
from benchgen_router.head import head_param_count
from benchgen_router.release.report import GuardReport, PointFigures, TrainingReport

CARD_TEMPLATE = Path(__file__).resolve().parent / "model_card.md"
CARD_END = "<!-- end of router card -->"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
INLINE_POOL = 8  # a pool this size or smaller is listed in a sentence; a larger one in a table
QUERY_LINE = (
    "Before embedding, a query loses the benchmark wrapper the head was trained with (config.json's "
    "`query_format`; `config.canonical_query` applies it, the pipeline does so itself), so a plain question "
    "and its formatted prompt get one decision.\n"
)


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _percent(value: float, of: float) -> str:
    return f"{100 * value / of:.0f}%" if of else "n/a"


def _picks(share: dict[str, float], agents: list[str]) -> str:
    """A policy's picks in %: one number per agent in pool order for a small pool; for a larger one, the
    agents it sends 1% or more of the queries to, most first, and the rest together."""
    if len(agents) <= INLINE_POOL:
        return "/".join(f"{100 * share.get(agent, 0.0):.0f}" for agent in agents)
    named = sorted((agent for agent in agents if share.get(agent, 0.0) >= 0.01), key=lambda a: -share[a])
    rest = 1.0 - sum(share[agent] for agent in named)
    parts = [f"{agent} {100 * share[agent]:.0f}" for agent in named]
    return ", ".join(parts + ([f"others {100 * rest:.0f}"] if rest >= 0.005 else []))


def _figures_row(label: str, point: Any, plain: PointFigures | None, reference: Any, agents: list[str]) -> str:
    """One table row of cross-validated figures; `point` is a PointFigures or a frontier CVPoint."""
    picks = _picks(point.share, agents)
    return (
        f"| {label} | {point.reward:.4f} ± {point.reward_std_repeats:.4f} | "
        f"{point.delta_reward:+.4f} ± {point.delta_se:.4f} | {_number(plain.reward if plain else None)} | "
        f"{point.cost_per_1k:.4f} ({_percent(point.cost_per_1k, reference.cost_per_1k)}) | "
        f"{point.latency_s:.2f} ({_percent(point.latency_s, reference.latency_s)}) | {picks} |"
    )


def _weights(point: Any) -> tuple[float, float]:
    """An operating point's (cost, latency) weights, from a report's PointReport or config.json's dict."""
    if isinstance(point, dict):
        return point.get("cost_weight", 0.0), point.get("latency_weight", 0.0)
    return point.cost_weight, point.latency_weight


def _points_rows(config: Any, report: TrainingReport, frontier: FrontierResult) -> list[str]:
    reference = frontier.point(frontier.reference)
    rows = []
    if report.operating_points:
        ordered = sorted(report.operating_points.items(), key=lambda item: _weights(item[1]))
        for name, point in ordered:
            default = " (default)" if name == config.operating_point else ""
            label = f"`{name}`{default}: cost {point.cost_weight:g}, latency {point.latency_weight:g}"
            if point.cv is None:
                rows.append(f"| {label} | n/a | n/a | n/a | n/a | n/a | |")  # measured nothing: claims nothing
            else:
                rows.append(_figures_row(label, point.cv, point.cv_plain, reference, config.agent_order))
    else:
        for point in frontier.of_kind("router"):
            plain = next((p for p in frontier.of_kind("router_form") if p.name == f"{point.name} [plain]"), None)
            rows.append(_figures_row(f"router ({point.name})", point, plain, reference, config.agent_order))
    return rows + [_figures_row(p.name, p, None, reference, config.agent_order) for p in frontier.of_kind("fixed")]


def _picks_legend(agents: list[str]) -> str:
    if len(agents) <= INLINE_POOL:
        return "/".join(agents)
    return "the agents sent 1% of the queries or more, and the others together"


def figures_section(config: Any, report: TrainingReport) -> str:
    """What the run measured: the held-out split in one line, then the cross-validated table."""
    heading = ["", "## Figures", ""]
    lines = list(heading)
    if report.test_reward is not None:
        baselines = report.baselines or {}
        lines += [
            f"Trained on {report.n_train} of {report.n_total} labelled tasks (`{report.rewards_dataset}`). On the "
            f"{report.n_test} held-out tasks: reward {_number(report.test_reward)}, best fixed agent "
            f"{_number(baselines.get('best_fixed_agent'))}, oracle {_number(baselines.get('oracle'))}.",
            "",
        ]
    frontier = report.frontier
    if frontier is None:
        cv = report.cross_validation
        if cv:
            lines += [
                f"{cv.folds}-fold CV reward: router {cv.router_mean:.4f} ± {cv.router_std:.4f}, best fixed "
                f"agent {_number(cv.best_fixed_mean)}.",
                "",
            ]
        return "" if lines == heading else "\n".join(lines)  # nothing measured, nothing claimed
    lines += [
        f"{frontier.repeats}x repeated {frontier.folds}-fold cross-validation over the {frontier.rows} tasks, every "
        "head retrained on each training fold. Reward ± its std over repeats; Δ ± se: the paired difference to "
        f'`{frontier.reference}` (the best fixed agent) and its standard error, against which "equal quality" is '
        "judged; *plain*: the same heads on the tasks as users type them; USD per 1,000 queries and seconds per "
        f"query (share of the reference's); picks in % ({_picks_legend(config.agent_order)}).",
        "",
        "| policy | reward ± rep | Δ ± se | plain | USD / 1k | latency s | picks % |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
        *_points_rows(config, report, frontier),
        "",
    ]
    names = {f"router lc{p.cost_weight:g}_ll{p.latency_weight:g}": n for n, p in report.operating_points.items()}
    lines += [f"In short: {headline_text(headline(frontier), names, figures=False)}.", ""]
    if report.target_mode is not None:
        nested = report.target_mode["nested_cv"]["point"]
        lines += [
            f"The default was chosen by target mode (eps {report.target_mode['eps']}): {report.target_mode['rule']}. "
            f"In nested CV that rule reaches {nested['reward']:.4f} ± {nested['reward_std_repeats']:.4f} at "
            f"{nested['cost_per_1k']:.4f} USD per 1,000 queries.",
            "",
        ]
    if report.operating_points:
        default = config.operating_point
        lines += [
            f'Each point is its own head; `{default}` answers when none is named: `model(**batch, operating_point="'
            f'{default}")`, `pipeline(..., model_kwargs={{"operating_point": "{default}"}})`, `benchgen-router route '
            f"--operating-point {default}`.",
            "",
        ]
    return "\n".join(lines)


def _guard_method(config: Any) -> str:
    if config.ood_discriminative:
        return (
            "a logistic score of the unit-length embedding and its Mahalanobis distance to in-distribution "
            "texts, fitted on the task prompts, shorter views of them and typed in-domain questions against "
            "outside queries"
        )
    return "the squared Mahalanobis distance of the unit-length embedding to the in-distribution prompts"


def guard_section(config: Any, guard: GuardReport | None) -> str:
    """The out-of-distribution guard: how it decides, who answers flagged queries, what it measured."""
    if config.ood_threshold is None:
        return ""
    # in the figures table's order (config.json stores the points sorted by name)
    points = sorted(config.operating_points.items(), key=lambda item: _weights(item[1]))
    by_point = "".join(f"; at `{name}`, `{config.fallback_agent(name)}`" for name, _ in points)
    rule = f", {guard.fallback_rule}" if guard and guard.fallback_rule else ""
    lines = [
        "## Out-of-distribution guard",
        "",
        "Queries unlike the prompts the head was trained for (another language, another domain) get a close to "
        "arbitrary pick from the head, so the router flags them.",
        f"Its score is {_guard_method(config)}; a score above {config.ood_threshold:.4f} is flagged.",
        f"Flagged queries go to a fallback agent{rule}: `{config.ood_fallback_agent}`{by_point}.",
        "",
    ]
    figures = []
    if guard is not None:
        evaluation = guard.evaluation or {}
        figures = [
            ("kept: calibration prompts", guard.calibration_kept_share),
            ("kept: held-out typed questions", guard.plain_calibration_kept_share),
            ("kept: plain questions, never fitted", guard.plain_questions_kept_share),
            ("flagged: labelled tasks", guard.labelled_formatted_flagged_share),
            ("flagged: the same, plain", guard.labelled_plain_flagged_share),
            (f"AUROC vs {evaluation.get('ood_queries', 'the')} OOD queries", evaluation.get("auroc")),
        ]
        figures = [(label, value) for label, value in figures if value is not None]
    if figures:  # one row: the guard's figures side by side
        lines += [
            "| " + " | ".join(label for label, _ in figures) + " |",
            "|" + " ---: |" * len(figures),
            "| " + " | ".join(f"{value:.4f}" for _, value in figures) + " |",
            "",
        ]
    lines += [
        "`model(**inputs)` returns `ood_scores`, `out_of_distribution` and `picks` (the decision, fallback "
        "applied), and every entry point returns that decision.",
        "`from_pretrained(..., ood_guard=False)` switches the guard off.",
    ]
    return "\n".join(lines) + "\n"


def render_card(
    config: Any,
    report: TrainingReport,
    backbone: str,
    revision: str | None,
    note: str | None = None,
    repo: str = "<this repo>",
) -> str:
    """README.md of a router folder: Hub metadata (YAML front matter) and what a user needs to know."""
    agents = config.agent_order
    n_params = head_param_count(config.head_input_dim, len(agents), config.head_hidden_dim)
    if config.head_hidden_dim == 0:
        head_kind = "linear (logits = embedding @ W + b)"
    else:
        head_kind = f"an MLP (a tanh hidden layer of {config.head_hidden_dim})"
    if config.operating_points:
        head_kind += ", one per operating point"
    at_revision = f" at revision `{revision}`" if revision else ""
    points = len(config.operating_points)
    calibrated = " and the budget rules' calibration" if config.calibration_shapes else ""
    if config.neighbour_outcomes:  # the head reads the outcomes of the training queries nearest a query
        calibrated += (
            f", and the {config.neighbour_rows:,} training queries' embeddings and rewards from which the head "
            f"reads, per agent, how the {config.neighbour_outcomes} nearest a query fared"
        )
    if config.bundled_backbone:
        weights_line = (
            f"`model.safetensors` holds the backbone and the head{calibrated}: the folder loads with no other "
            "repository."
        )
    else:
        held = f"the {points} heads, one per operating point ({points} x {n_params:,} values)" if points else None
        weights_line = (
            f"`model.safetensors` holds only {held or f'the head ({n_params:,} values)'}{calibrated}; the backbone's "
            f"weights load from `{backbone}`{at_revision} through the normal Hub cache."
        )
    values = {
        **_head_description(config, report),
        # JSON strings are valid YAML scalars, so any id is quoted safely; a path is not a Hub model.
        "base_model_line": f"base_model: {json.dumps(backbone)}" if _HUB_ID.match(backbone) else "",
        "title": " ".join((report.model_id or "BenchGen Router Lite").split()),  # one line, whatever it holds
        "backbone": backbone,
        "backbone_state": "fine-tuned" if "finetune" in report.extra else "frozen",  # train --finetune
        "embedding_dim": config.embedding_dim,
        "pooled": (
            "masked means of every hidden state, the input embeddings' and each layer's, side by side"
            if config.pooling == "every-layer"
            else "masked mean of the last hidden state"
        ),
        "n_agents": len(agents),
        "head_kind": head_kind,
        "n_params": f"{n_params:,}",
        "weights_line": weights_line,
        "pool": _pool(config),
        "repo": repo,
        "truncation_length": config.truncation_length,
        "query_line": QUERY_LINE if config.query_format else "",
        "card_note": f"\n{note.strip()}\n" if note and note.strip() else "",
        "figures_section": figures_section(config, report),
        "guard_section": ("\n" if config.ood_threshold is not None else "") + guard_section(config, report.ood_guard),
    }
    card = string.Template(CARD_TEMPLATE.read_text(encoding="utf-8")).substitute(values)
    return re.sub(r"\n\n+(?=license:)", "\n", card)  # no blank line where base_model was left out


def _head_description(config: Any, report: TrainingReport) -> dict[str, str]:
    """What the head does and how it was trained, in the card's words for its kind; and its domain."""
    dataset = f"`{report.rewards_dataset}`" if report.rewards_dataset else "its labelled tasks"
    domain = f"queries like the labelled tasks of {dataset} it was trained on"
    if config.head_kind == "probability":
        return {
            "method_tag": "probability-head",
            "head_role": (
                f"predicts, for each of the {len(config.id2label)} agents of a pool, the probability that it answers "
                "the query correctly; a trade-off rule chosen per request picks the agent (with none, the most "
                "likely one)"
            ),
            "training_line": (
                "one logistic regression per agent (a linear layer and a sigmoid), its L2 strength chosen by "
                "cross-validation, trained on each agent's measured correctness"
            ),
            "tradeoff_usage": (
                'router("What is 2 + 2?", tradeoff="tolerance=0.02")  # the cheapest agent within 0.02 of the most '
                "likely\n"
                'model(**batch, tradeoff="usd-per-1k=0.5")  # or lambda=L, budget=X, budget=X@AGENT\n'
            ),
            "domain": domain,
        }
    return {
        "method_tag": "cma-es",
        "head_role": f"scores the {len(config.id2label)} agents of a pool; the highest-scoring agent should answer",
        "training_line": "trained gradient-free with separable CMA-ES against a measured reward matrix",
        "tradeoff_usage": "",
        "domain": domain,
    }


def _pool(config: Any) -> str:
    """The pool: a sentence for a small one, a table (with each agent's expected cost, when known) for a large one."""
    agents = config.agent_order
    if len(agents) <= INLINE_POOL:
        return ": " + ", ".join(f"{i} `{agent}`" for i, agent in enumerate(agents)) + "."
    costs = config.agent_costs_per_1k
    header = "| # | agent |" + (" USD per 1,000 queries |" if costs else "")
    rule = "| ---: | --- |" + (" ---: |" if costs else "")
    rows = [f"| {i} | `{agent}` |" + (f" {costs[i]:.4g} |" if costs else "") for i, agent in enumerate(agents)]
    return ":\n\n" + "\n".join([header, rule, *rows]) + "\n"


def merge_card(card: str, existing: str | None) -> str:
    """The new card, followed by whatever the folder's README kept after the previous card's end
    marker (the repository root's README carries the project's documentation there)."""
    if existing and CARD_END in existing:
        return card.rstrip("\n") + existing.split(CARD_END, 1)[1]
    return card
