"""A routing-value result as Markdown tables, plain JSON and PNG curves. Every figure is held out: the
mean and standard deviation (ddof 1) over the folds of one kind."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchgen_router.bench.value.routers import ROUTER_NAMES
from benchgen_router.bench.value.run import FoldResult, ValueConfig, ValueResult
from benchgen_router.frontier.pareto import frontier_value, reachable_frontier

KINDS = ("k-fold", "groups-out")
RULE_NAMES = {"lambda": "lambda swept", "tolerance": "tolerance swept"}
REFERENCES = ("zero router", "oracle")
MARGIN_NAMES = {"cmaes_margin": "CMA-ES reward-only head, margin swept", "random": "random"}


def curve_name(key: str) -> str:
    """ "probability/lambda" -> "probability head, lambda swept"; references keep their names."""
    router, _, rule = key.partition("/")
    if router in REFERENCES:
        return router
    return f"{ROUTER_NAMES.get(router, router)}, {RULE_NAMES[rule]}" if rule else ROUTER_NAMES.get(router, router)


def _spread(values: Sequence[float]) -> tuple[float, float]:
    array = np.asarray(values, dtype=float)
    return float(array.mean()), float(array.std(ddof=1)) if len(array) > 1 else 0.0


def _curve_keys(folds: Sequence[FoldResult]) -> list[str]:
    keys = dict.fromkeys(key for fold in folds for key in fold.figures if key not in REFERENCES)
    return [*keys, *REFERENCES]


def summary(result: ValueResult, kind: str) -> dict[str, Any]:
    """Per curve over the folds of `kind`: folds, the cost share at the reference's accuracy (mean and std
    over the folds that reach it, and how many do), best accuracy, AIQ and AIQ minus the zero router's
    (paired per fold), and seconds fitting and scoring."""
    folds = [fold for fold in result.folds if fold.kind == kind]
    out: dict[str, Any] = {}
    for key in _curve_keys(folds):
        runs = [fold for fold in folds if key in fold.figures]
        if not runs:
            continue
        shares = [fold.figures[key].share for fold in runs if fold.figures[key].share is not None]
        record: dict[str, Any] = {"folds": len(runs), "reached": len(shares)}
        if shares:
            record["share"], record["share_std"] = _spread(shares)
        record["best"], record["best_std"] = _spread([fold.figures[key].best for fold in runs])
        record["aiq"], record["aiq_std"] = _spread([fold.figures[key].aiq for fold in runs])
        paired = [fold.figures[key].aiq - fold.figures["zero router"].aiq for fold in runs]
        record["aiq_gain"], record["aiq_gain_std"] = _spread(paired)
        router = key.partition("/")[0]
        record["seconds"] = float(sum(fold.seconds.get(router, 0.0) for fold in runs))
        out[key] = record
    notes = sorted({note for fold in folds for note in fold.notes.values()})
    return {"curves": out, "notes": notes, "folds": len(folds)}


def _share_cell(record: dict[str, Any]) -> str:
    if record["reached"] == 0:
        return "never"
    cell = f"{100 * record['share']:.1f}% ± {100 * record['share_std']:.1f}"
    return cell if record["reached"] == record["folds"] else f"{cell} ({record['reached']} of {record['folds']} folds)"


def format_result(result: ValueResult) -> str:
    """The Markdown tables: per split kind, every curve's figures; the single models; the probability
    head's rules (tolerance settings and usd-per-1k budgets); with two agents, RouteLLM's figures."""
    unit = result.cost_unit
    lines: list[str] = []
    for kind in KINDS:
        folds = [fold for fold in result.folds if fold.kind == kind]
        if not folds:
            continue
        table = summary(result, kind)
        references = sorted({fold.reference for fold in folds})
        lines += [
            f"### {result.matrix}, {kind} ({len(folds)} folds; {result.rows} tasks, {len(result.agents)} agents)",
            "",
            f"Reference (the single model best on each fold's training rows): {', '.join(references)}.",
            "",
            "| router | folds | cost share at the reference's accuracy | best accuracy | AIQ | AIQ - zero router "
            "| fit+score s |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for key, record in table["curves"].items():
            gain = "" if key == "zero router" else f"{record['aiq_gain']:+.4f} ± {record['aiq_gain_std']:.4f}"
            lines.append(
                f"| {curve_name(key)} | {record['folds']} | {_share_cell(record)} | "
                f"{record['best']:.4f} ± {record['best_std']:.4f} | {record['aiq']:.4f} ± {record['aiq_std']:.4f} | "
                f"{gain} | {record['seconds']:.0f} |"
            )
        lines += [f"- {note}" for note in table["notes"]]
        lines.append("")
        lines += _rules_tables(folds, result)
        if folds[0].gap:
            lines += _routellm_table(folds)
        lines += _paired_table(folds)
    lines += _singles_table(result, unit)
    return "\n".join(lines)


def _singles_table(result: ValueResult, unit: str) -> list[str]:
    folds = [fold for fold in result.folds if fold.kind == "k-fold"] or result.folds
    rows = []
    for agent in result.agents:
        cost, accuracy = (
            _spread([fold.singles[agent][0] for fold in folds]),
            _spread([fold.singles[agent][1] for fold in folds]),
        )
        rows.append((accuracy[0], f"| {agent} | {accuracy[0]:.4f} ± {accuracy[1]:.4f} | {cost[0]:.4f} |"))
    return [
        f"### Single models ({folds[0].kind} folds, held out)",
        "",
        f"| model | accuracy | {unit} |",
        "| --- | ---: | ---: |",
        *[row for _, row in sorted(rows, key=lambda item: -item[0])],
        "",
    ]


def _rules_tables(folds: Sequence[FoldResult], result: ValueResult) -> list[str]:
    """The probability head at each tolerance, and each usd-per-1k budget asked against the spend."""
    lines: list[str] = []
    tolerance = [fold.curves["probability/tolerance"] for fold in folds if "probability/tolerance" in fold.curves]
    if tolerance:
        lines += [
            "Probability head, `tolerance=T` (the cheapest agent within T of the most likely):",
            "",
            "| T | accuracy | cost share of the reference's |",
            "| ---: | ---: | ---: |",
        ]
        for index, value in enumerate(result.config.tolerances):
            accuracy = _spread([points[index][1] for points in tolerance])
            share = _spread(
                [points[index][0] / fold.reference_point[0] for points, fold in zip(tolerance, folds, strict=False)]
            )
            lines.append(
                f"| {value:g} | {accuracy[0]:.4f} ± {accuracy[1]:.4f} | {100 * share[0]:.1f}% ± {100 * share[1]:.1f} |"
            )
        lines.append("")
    budgets = [fold.budgets for fold in folds if fold.budgets]
    if budgets:
        lines += [
            "Probability head, `usd-per-1k=Y` (calibrated on the training rows), Y a share of the reference's cost:",
            "",
            "| Y, share | asked | spent | spent / asked | accuracy |",
            "| ---: | ---: | ---: | ---: | ---: |",
        ]
        for index, share in enumerate(result.config.budgets):
            asked = _spread([rows[index]["asked"] for rows in budgets])
            spent = _spread([rows[index]["spent"] for rows in budgets])
            ratio = _spread([rows[index]["spent"] / rows[index]["asked"] for rows in budgets])
            accuracy = _spread([rows[index]["accuracy"] for rows in budgets])
            lines.append(
                f"| {share:g} | {asked[0]:.4f} | {spent[0]:.4f} ± {spent[1]:.4f} | {ratio[0]:.3f} ± {ratio[1]:.3f} | "
                f"{accuracy[0]:.4f} ± {accuracy[1]:.4f} |"
            )
        lines.append("")
    return lines


def _routellm_table(folds: Sequence[FoldResult]) -> list[str]:
    usable = [fold for fold in folds if "figures" in fold.gap]
    if not usable:
        return [f"RouteLLM's figures: {folds[0].gap.get('note')}", ""]
    names = dict.fromkeys(name for fold in usable for name in fold.gap["figures"])
    lines = ["RouteLLM's figures (two agents):", "", "| router | folds | APGR | CPT(50%) | CPT(80%) |"]
    lines.append("| --- | ---: | ---: | ---: | ---: |")
    for name in names:
        runs = [fold.gap["figures"][name] for fold in usable if name in fold.gap["figures"]]
        apgr, cpt50, cpt80 = (_spread([run[key] for run in runs]) for key in ("apgr", "cpt_50", "cpt_80"))
        label = {"cmaes_margin": "CMA-ES reward-only head, margin swept", "random": "random"}.get(
            name, curve_name(name)
        )
        lines.append(
            f"| {label} | {len(runs)} | {apgr[0]:.3f} ± {apgr[1]:.3f} | {100 * cpt50[0]:.1f}% ± {100 * cpt50[1]:.1f} "
            f"| {100 * cpt80[0]:.1f}% ± {100 * cpt80[1]:.1f} |"
        )
    return [*lines, ""]


def paired_differences(folds: Sequence[FoldResult], baseline: str = "probability") -> dict[str, dict[str, Any]]:
    """Each other router's figures minus `baseline`'s on the same fold (its curve of the same rule), mean and
    std over the folds both ran: whether a router beats the baseline beyond the folds' spread, with the
    folds' shared difficulty taken out. Keys: aiq, best, and with two agents apgr and cpt_50."""
    out: dict[str, dict[str, Any]] = {}
    for key in _curve_keys(folds):
        router, _, rule = key.partition("/")
        base = f"{baseline}/{rule}" if rule else baseline
        if router in (baseline, *REFERENCES):
            continue
        runs = [fold for fold in folds if key in fold.figures and base in fold.figures]
        if not runs:
            continue
        record: dict[str, Any] = {"folds": len(runs)}
        for field in ("aiq", "best"):
            diffs = [getattr(fold.figures[key], field) - getattr(fold.figures[base], field) for fold in runs]
            record[field] = _spread(diffs)
        gaps = [fold.gap["figures"] for fold in runs if "figures" in fold.gap]
        gaps = [figures for figures in gaps if router in figures and baseline in figures]
        if rule == "lambda" and gaps:  # RouteLLM's sweep has no rule: once per router
            for field in ("apgr", "cpt_50"):
                record[field] = _spread([figures[router][field] - figures[baseline][field] for figures in gaps])
        out[key] = record
    return out


def _paired_table(folds: Sequence[FoldResult]) -> list[str]:
    paired = paired_differences(folds)
    if not paired:
        return []
    two_agents = any("apgr" in record for record in paired.values())
    header = "| router | folds | AIQ | best accuracy |" + (" APGR | CPT(50%) |" if two_agents else "")
    lines = ["Beside the probability head, paired per fold (the router's figure minus the head's):", "", header]
    lines.append("| --- | ---: | ---: | ---: |" + (" ---: | ---: |" if two_agents else ""))
    for key, record in paired.items():
        cells = [f"{record[field][0]:+.4f} ± {record[field][1]:.4f}" for field in ("aiq", "best")]
        if two_agents:
            cells.append(f"{record['apgr'][0]:+.3f} ± {record['apgr'][1]:.3f}" if "apgr" in record else "")
            cpt = record.get("cpt_50")
            cells.append(f"{100 * cpt[0]:+.1f} ± {100 * cpt[1]:.1f} points" if cpt else "")
        lines.append(f"| {curve_name(key)} | {record['folds']} | {' | '.join(cells)} |")
    return [*lines, ""]


def result_to_dict(result: ValueResult) -> dict[str, Any]:
    """The settings, each kind's summary and every fold's points and figures, as plain JSON types."""
    config = result.config
    return {
        "matrix": result.matrix,
        "agents": result.agents,
        "rows": result.rows,
        "cost_unit": result.cost_unit,
        "seconds": result.seconds,
        "settings": {
            key: (list(value) if isinstance(value, tuple) else value)
            for key, value in vars(config).items()
            if key not in ("cache_dir", "progress")
        },
        "summary": {kind: summary(result, kind) for kind in KINDS if any(f.kind == kind for f in result.folds)},
        "folds": [
            {
                "kind": fold.kind,
                "repeat": fold.repeat,
                "fold": fold.fold,
                "rows": fold.rows,
                "reference": fold.reference,
                "reference_point": list(fold.reference_point),
                "window": list(fold.window),
                "singles": {agent: list(point) for agent, point in fold.singles.items()},
                "curves": {key: [list(point) for point in points] for key, points in fold.curves.items()},
                "figures": {key: figures.to_dict() for key, figures in fold.figures.items()},
                "notes": fold.notes,
                "budgets": fold.budgets,
                "seconds": fold.seconds,
                "routellm": {key: value for key, value in fold.gap.items() if key != "curves"},
            }
            for fold in result.folds
        ],
    }


def mean_curve(folds: Sequence[FoldResult], key: str, grid: np.ndarray) -> np.ndarray | None:
    """The mean over folds of each fold's non-decreasing convex hull of the curve's points, at the costs
    in `grid`; NaN below the dearest of the folds' cheapest points, where some fold reaches nothing."""
    runs = [fold.curves[key] for fold in folds if key in fold.curves]
    if not runs:
        return None
    hulls = [reachable_frontier(points) for points in runs]
    start = max(hull[0][0] for hull in hulls)
    values = [[frontier_value(hull, x) for x in grid] for hull in hulls]
    return np.where(grid >= start, np.mean(np.asarray(values, dtype=float), axis=0), np.nan)


def plot_result(result: ValueResult, png: str | Path, labelled: int = 4) -> None:
    """Accuracy against cost per 1,000 queries (log scale, or linear where a model costs nothing), a column per
    split kind: each curve's mean held-out hull, the zero router dashed, the oracle dotted, each single model a
    point (the `labelled` most accurate named); below, the same zoomed on the routers, from the reference's
    accuracy less 0.08 up."""
    from benchgen_router.frontier.plots import plot_curve_panels

    everything = np.array([cost for fold in result.folds for cost, _ in fold.singles.values()])
    # Prices spread over decades read on a log scale; a free model (RouteLLM's weak one) has no place on it.
    log_x = bool(everything.min() > 0)
    grid = (
        np.geomspace(everything.min() * 0.8, everything.max(), 200) if log_x else np.linspace(0, everything.max(), 200)
    )
    panels, zooms = [], []
    for kind in KINDS:
        folds = [fold for fold in result.folds if fold.kind == kind]
        if not folds:
            continue
        keys = [key for key in _curve_keys(folds) if any(key in fold.curves for fold in folds)]
        curves = {key: mean_curve(folds, key, grid) for key in keys}
        lines = [(curve_name(key), grid, curve) for key, curve in curves.items()]
        means = {
            agent: (np.mean([f.singles[agent][0] for f in folds]), np.mean([f.singles[agent][1] for f in folds]))
            for agent in result.agents
        }
        named = sorted(means, key=lambda agent: -means[agent][1])[:labelled]
        marks = [(agent if agent in named else "", *means[agent]) for agent in result.agents]
        title = f"{result.matrix}, {kind} ({len(folds)} folds)"
        panels.append((title, lines, marks))
        reference = float(np.mean([fold.reference_point[1] for fold in folds]))
        top = max(float(np.nanmax(curve)) for key, curve in curves.items() if key != "oracle")
        cheapest_named = min(means[agent][0] for agent in named)
        zooms.append(
            ((f"{title}, zoomed", lines, marks), (cheapest_named * 0.7, grid[-1], reference - 0.08, top + 0.015))
        )
    plot_curve_panels(
        panels + [panel for panel, _ in zooms],
        png,
        f"{result.cost_unit} (log scale)" if log_x else result.cost_unit,
        "accuracy (held out, mean over folds)",
        log_x=log_x,
        columns=len(panels),
        limits=[None] * len(panels) + [limit for _, limit in zooms],
    )


def result_from_dict(record: dict[str, Any]) -> ValueResult:
    """A result as result_to_dict stored it (value.json), to render its tables and curves again."""
    from benchgen_router.bench.value.metrics import CurveFigures

    settings = {key: tuple(value) if isinstance(value, list) else value for key, value in record["settings"].items()}
    folds = [
        FoldResult(
            kind=fold["kind"],
            repeat=fold["repeat"],
            fold=fold["fold"],
            rows=fold["rows"],
            reference=fold["reference"],
            reference_point=tuple(fold["reference_point"]),
            singles={agent: tuple(point) for agent, point in fold["singles"].items()},
            curves={key: [tuple(point) for point in points] for key, points in fold["curves"].items()},
            figures={
                key: CurveFigures(value["share_at_reference"], value["best_accuracy"], value["aiq"])
                for key, value in fold["figures"].items()
            },
            window=tuple(fold["window"]),
            notes=fold["notes"],
            budgets=fold["budgets"],
            seconds=fold["seconds"],
            gap=fold.get("routellm", {}),
        )
        for fold in record["folds"]
    ]
    config = ValueConfig(**settings)
    return ValueResult(
        record["matrix"], record["agents"], record["rows"], record["cost_unit"], config, folds, record["seconds"]
    )


def plot_gap(result: ValueResult, png: str | Path) -> None:
    """A pool of two: each router's mean held-out performance gap recovered against the share of strong
    calls (RouteLLM's curves), one panel per split kind, random dashed and the oracle dotted."""
    from benchgen_router.frontier.plots import plot_gap_panels

    grid = np.linspace(0, 1, 101)
    panels = []
    for kind in KINDS:
        folds = [fold for fold in result.folds if fold.kind == kind and "curves" in fold.gap]
        if not folds:
            continue
        names = dict.fromkeys(name for fold in folds for name in fold.gap["curves"])
        lines = []
        for name in names:
            runs = [fold for fold in folds if name in fold.gap["curves"]]
            recovered = [
                (np.interp(grid, *fold.gap["curves"][name]) - fold.gap["weak"])
                / (fold.gap["strong"] - fold.gap["weak"])
                for fold in runs
            ]
            lines.append((MARGIN_NAMES.get(name, curve_name(name)), grid, np.mean(recovered, axis=0)))
        lines.append(("random", np.array([0.0, 1.0]), np.array([0.0, 1.0])))
        panels.append((f"{result.matrix}, {kind} ({len(folds)} folds)", lines))
    if panels:
        plot_gap_panels(
            panels, png, "share of strong-model calls", "performance gap recovered (held out, mean over folds)"
        )
