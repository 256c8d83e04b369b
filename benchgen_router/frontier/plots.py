"""The frontier as pictures: reward against cost and against latency, one PNG per axis (matplotlib)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchgen_router.files import atomic_output
from benchgen_router.frontier.cv import CVPoint, FrontierResult


@dataclass(frozen=True)
class Axis:
    """One x axis of the frontier: the CVPoint attribute it plots and the names that go with it."""

    attribute: str  # CVPoint field on the x axis
    flag: str  # CVPoint field marking the non-dominated frontier on it
    label: str
    cap: str  # the target box's key for it
    plane: str  # the `limits` key for it


COST = Axis("cost_per_1k", "cost_frontier", "mean cost (USD per 1,000 queries)", "cost_cap", "cost")
LATENCY = Axis("latency_s", "latency_frontier", "mean latency per query (s)", "latency_cap", "latency")
CHEAPEST_BEST = "oracle (cheapest best)"


def plot_frontier(
    result: FrontierResult,
    cost_png: str | Path,
    latency_png: str | Path,
    knn_k: int | None = None,
    title: str = "",
    compare: Sequence[tuple[str, Sequence[CVPoint]]] = (),
    target: dict[str, float] | None = None,
    limits: dict[str, tuple[float, float, float, float]] | None = None,
) -> None:
    """A CV grid's trade-off lines against cost and against latency; `compare` adds router curves,
    `target` a box (reward_floor, cost_cap, latency_cap), `limits` zooms ("cost"/"latency" -> x0, x1, y0, y1)."""
    for png, axis in ((cost_png, COST), (latency_png, LATENCY)):
        plot_frontier_axis(result, png, axis, knn_k, title, compare, target, limits)


def plot_frontier_axis(
    result: FrontierResult,
    png: str | Path,
    axis: Axis,
    knn_k: int | None = None,
    title: str = "",
    compare: Sequence[tuple[str, Sequence[CVPoint]]] = (),
    target: dict[str, float] | None = None,
    limits: dict[str, tuple[float, float, float, float]] | None = None,
) -> None:
    fig, ax = _new_plot()
    _draw_router_families(ax, result.of_kind("router"), axis.attribute)
    _draw_compared(ax, compare, axis.attribute)
    if knn_k is not None:
        _draw_knn(ax, result, knn_k, axis.attribute)
    _draw_labelled_points(ax, result.of_kind("fixed"), axis.attribute)
    for kind, marker in (("best_fixed_train", "v"), ("random", "P")):
        for p in result.of_kind(kind):
            ax.plot(getattr(p, axis.attribute), p.reward, marker, color="gray", ms=6, label=p.name)
    _draw_cheapest_best(ax, result, axis.attribute, "oracle, cheapest of best (in-sample)")
    _draw_frontier(ax, result.points, axis.attribute, axis.flag)
    if target:
        ax.axhline(target["reward_floor"], color="tab:green", ls="--", lw=0.8, label="target")
        ax.axvline(target[axis.cap], color="tab:green", ls="--", lw=0.8)
    if limits and axis.plane in limits:
        x_low, x_high, y_low, y_high = limits[axis.plane]
        ax.set_xlim(x_low, x_high)
        ax.set_ylim(y_low, y_high)
    _save_plot(
        fig,
        ax,
        png,
        axis.label,
        "mean reward (held-out, repeated CV)",
        title or f"{result.repeats}x{result.folds}-fold CV, {result.rows} rows",
    )


def plot_policies(result: FrontierResult, cost_png: str | Path, latency_png: str | Path, title: str = "") -> None:
    """An evaluate_policies result against cost and latency: each router is one policy scored once, so
    it is a labelled point, not a line with error bars as in plot_frontier."""
    for png, axis in ((cost_png, COST), (latency_png, LATENCY)):
        plot_policies_axis(result, png, axis, title)


def plot_policies_axis(result: FrontierResult, png: str | Path, axis: Axis, title: str = "") -> None:
    fig, ax = _new_plot()
    for kind, marker, color, legend in (("router", "o", "tab:blue", "router"), ("fixed", "D", "black", "fixed agent")):
        points = result.of_kind(kind)
        _draw_labelled_points(
            ax, points, axis.attribute, marker=marker, color=color, size=7, legend=legend, colored_names=True
        )
    for p in result.of_kind("random"):
        ax.plot(getattr(p, axis.attribute), p.reward, "P", color="gray", ms=6, label=p.name)
    _draw_cheapest_best(ax, result, axis.attribute, "oracle, cheapest of best")
    _draw_frontier(ax, result.points, axis.attribute, axis.flag)
    _save_plot(
        fig,
        ax,
        png,
        axis.label,
        "mean reward (in-sample, these rows)",
        title or f"fixed routers in-sample on {result.rows} rows (no CV)",
    )


def _new_plot() -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")  # no display: the plots are only written to files
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(9, 6), dpi=120)


def _draw_router_families(ax: Any, routers: Sequence[CVPoint], attribute: str) -> None:
    """One line per kind of trade-off weight, error bars over repeats, each point labelled with its weight."""
    families = [
        ("router, cost weight", "o-", "tab:blue", [p for p in routers if not p.latency_weight]),
        ("router, latency weight", "s--", "tab:purple", [p for p in routers if p.latency_weight and not p.cost_weight]),
        ("router, both weights", "^:", "tab:cyan", [p for p in routers if p.latency_weight and p.cost_weight]),
    ]
    for family, style, color, members in families:
        if not members:
            continue
        xs, ys = [getattr(p, attribute) for p in members], [p.reward for p in members]
        errors = [p.reward_std_repeats for p in members]
        ax.errorbar(xs, ys, yerr=errors, fmt=style, color=color, ms=4, capsize=2, lw=1, label=family)
        for p, x, y in zip(members, xs, ys, strict=True):
            weight = p.latency_weight if p.latency_weight and not p.cost_weight else p.cost_weight
            ax.annotate(f"{weight:g}", (x, y), textcoords="offset points", xytext=(3, 3), fontsize=6, color=color)


def _draw_compared(ax: Any, compare: Sequence[tuple[str, Sequence[CVPoint]]], attribute: str) -> None:
    for (name, members), color in zip(compare, ("tab:olive", "tab:brown", "tab:pink"), strict=False):
        members = sorted(members, key=lambda p: (p.latency_weight or 0.0, p.cost_weight or 0.0))
        xs, ys = [getattr(p, attribute) for p in members], [p.reward for p in members]
        ax.plot(xs, ys, "d-", color=color, ms=4, lw=1, alpha=0.8, label=name)


def _draw_knn(ax: Any, result: FrontierResult, knn_k: int, attribute: str) -> None:
    knn = [p for p in result.of_kind("knn") if p.name.startswith(f"knn{knn_k} ") and not p.latency_weight]
    if knn:
        xs, ys = [getattr(p, attribute) for p in knn], [p.reward for p in knn]
        ax.plot(xs, ys, "x-", color="tab:orange", ms=4, lw=1, label=f"kNN (k={knn_k}), cost weight")


def _draw_labelled_points(
    ax: Any,
    points: Sequence[CVPoint],
    attribute: str,
    *,
    marker: str = "D",
    color: str = "black",
    size: int = 6,
    legend: str | None = None,
    colored_names: bool = False,
) -> None:
    """Points named beside them ("always " dropped); `legend` names the first one in the legend."""
    for number, p in enumerate(points):
        x = getattr(p, attribute)
        ax.plot(x, p.reward, marker, color=color, ms=size, label=legend if number == 0 else None)
        name_color = {"color": color} if colored_names else {}
        ax.annotate(
            p.name.removeprefix("always "),
            (x, p.reward),
            textcoords="offset points",
            xytext=(5, -10),
            fontsize=8,
            **name_color,
        )


def _draw_cheapest_best(ax: Any, result: FrontierResult, attribute: str, label: str) -> None:
    for p in result.of_kind("oracle"):
        if p.name == CHEAPEST_BEST:
            ax.plot(getattr(p, attribute), p.reward, "*", color="tab:green", ms=12, label=label)


def _draw_frontier(ax: Any, points: Sequence[CVPoint], attribute: str, flag: str) -> None:
    """The non-dominated frontier (points with `flag` set) as a step line."""
    line = sorted((getattr(p, attribute), p.reward) for p in points if getattr(p, flag))
    xs, ys = [x for x, _ in line], [y for _, y in line]
    ax.step(xs, ys, where="post", color="tab:red", lw=1.5, alpha=0.5, label="non-dominated frontier")


def _save_plot(fig: Any, ax: Any, png: str | Path, xlabel: str, ylabel: str, title: str) -> None:
    """Label and lay out one plot, write it atomically (no half-written PNG), and free it."""
    import matplotlib.pyplot as plt

    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    with atomic_output(png, "wb") as handle:
        fig.savefig(handle, format="png")
    plt.close(fig)


GapLine = tuple[str, Any, Any]  # (label, x values, y values)


def plot_gap_curves(panels: Sequence[tuple[str, Sequence[Any], Any]], png: str | Path, title: str = "") -> None:
    """evaluate's gap panels, (title, [GapCurve], its PoolGap): mean quality against cost in the gap's
    own unit (two agents: the share of calls to the better agent), the router beside random and the oracle."""
    drawn = [(name, [(c.name, gap.in_cost_unit(c.cost), c.quality) for c in curves]) for name, curves, gap in panels]
    unit = " / ".join(gap.cost_unit for _, _, gap in panels)
    plot_gap_panels(drawn, png, f"mean cost ({unit})", "mean reward", title)


def plot_gap_panels(
    panels: Sequence[tuple[str, Sequence[GapLine]]], png: str | Path, xlabel: str, ylabel: str, title: str = ""
) -> None:
    """Gap-recovered curves (frontier.gap), one panel per (title, lines) side by side: random, a
    straight line, in gray dashes and the oracle dotted in black; each router its own colour."""
    plot_curve_panels([(panel_title, lines, ()) for panel_title, lines in panels], png, xlabel, ylabel, title)


def plot_curve_panels(
    panels: Sequence[tuple[str, Sequence[GapLine], Sequence[tuple[str, float, float]]]],
    png: str | Path,
    xlabel: str,
    ylabel: str,
    title: str = "",
    log_x: bool = False,
    columns: int | None = None,
    limits: Sequence[tuple[float, float, float, float] | None] | None = None,
) -> None:
    """Curves, one panel per (title, lines, marks), `columns` to a row (default: all in one row): lines named
    "random" or "zero router" in gray dashes, "oracle" dotted in black, each other its own colour, except
    that "NAME, ..." lines share NAME's colour and take a line style each; marks are labelled points (single
    models), the label shown when it is not empty. `limits` (x0, x1, y0, y1) zooms a panel (None: whole)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: the plots are only written to files
    import matplotlib.pyplot as plt

    columns = columns or len(panels)
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(6.5 * columns, 5.5 * rows), dpi=110, squeeze=False)
    # a router keeps its colour (and a variant its style) across the panels
    routers = iter(("tab:blue", "tab:orange", "tab:purple", "tab:red", "tab:brown", "tab:pink", "tab:olive"))
    colors: dict[str, Any] = {}
    styles: dict[str, Any] = {}
    for index, (panel_title, lines, marks) in enumerate(panels):
        ax = axes[index // columns][index % columns]
        for label, xs, ys in lines:
            style, color = {"random": ("--", "gray"), "zero router": ("--", "gray"), "oracle": (":", "black")}.get(
                label, (None, None)
            )
            if color is None:  # a router: one colour per name before the comma, one style per variant after it
                family, _, variant = label.partition(", ")
                if family not in colors:
                    colors[family] = next(routers, None)
                if variant not in styles:
                    styles[variant] = ("-", "-.", (0, (5, 1)), (0, (1, 1)))[len(styles) % 4]
                color, style = colors[family], styles[variant]
            ax.plot(xs, ys, linestyle=style, color=color, lw=1.4, label=label)
        if marks:
            ax.plot([x for _, x, _ in marks], [y for _, _, y in marks], "D", color="black", ms=3, label="single model")
            for label, x, y in marks:
                if label:
                    ax.annotate(label, (x, y), fontsize=6, xytext=(3, -8), textcoords="offset points")
        if log_x:
            from matplotlib.ticker import NullFormatter

            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())  # labels at every minor tick of a zoom overlap
        if limits and limits[index]:
            x0, x1, y0, y1 = limits[index]
            ax.set_xlim(x0, x1)
            ax.set_ylim(y0, y1)
        ax.set_title(panel_title, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    for index in range(len(panels), rows * columns):  # an odd panel count leaves one cell empty
        axes[index // columns][index % columns].axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    with atomic_output(png, "wb") as handle:
        fig.savefig(handle, format="png")
    plt.close(fig)
