"""The frontier as pictures: reward against cost and against latency, written as PNG (matplotlib).
PNGs are written atomically."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchgen_router.files import atomic_output
from benchgen_router.frontier.cv import CVPoint, FrontierResult


def plot_policies(result: FrontierResult, cost_png: str | Path, latency_png: str | Path, title: str = "") -> None:
    """Reward vs cost and reward vs latency of an evaluate_policies result. plot_frontier draws a CV
    grid's trade-off lines with error bars over repeats; here each router is one fixed policy scored
    once, so routers and fixed agents are labelled points, with uniform random, the cheapest-of-best
    oracle and the non-dominated frontier. PNGs written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for png, axis, flag, label in (
        (cost_png, "cost_per_1k", "cost_frontier", "mean cost (USD per 1,000 queries)"),
        (latency_png, "latency_s", "latency_frontier", "mean latency per query (s)"),
    ):
        fig, ax = plt.subplots(figsize=(9, 6), dpi=120)
        for kind, marker, color, legend in (
            ("router", "o", "tab:blue", "router"),
            ("fixed", "D", "black", "fixed agent"),
        ):
            for number, p in enumerate(result.of_kind(kind)):
                x = getattr(p, axis)
                ax.plot(x, p.reward, marker, color=color, ms=7, label=legend if number == 0 else None)
                ax.annotate(
                    p.name.removeprefix("always "),
                    (x, p.reward),
                    textcoords="offset points",
                    xytext=(5, -10),
                    fontsize=8,
                    color=color,
                )
        for p in result.of_kind("random"):
            ax.plot(getattr(p, axis), p.reward, "P", color="gray", ms=6, label=p.name)
        for p in result.of_kind("oracle"):
            if p.name == "oracle (cheapest best)":
                ax.plot(getattr(p, axis), p.reward, "*", color="tab:green", ms=12, label="oracle, cheapest of best")
        _draw_frontier(ax, result.points, axis, flag)
        _save_plot(
            fig,
            ax,
            png,
            label,
            "mean reward (in-sample, these rows)",
            title or f"fixed routers in-sample on {result.rows} rows (no CV)",
        )


def _draw_frontier(ax: Any, points: Sequence[CVPoint], axis: str, flag: str) -> None:
    """The non-dominated frontier (points with `flag` set) as a step line over `axis`."""
    line = sorted((getattr(p, axis), p.reward) for p in points if getattr(p, flag))
    ax.step(
        [x for x, _ in line],
        [y for _, y in line],
        where="post",
        color="tab:red",
        lw=1.5,
        alpha=0.5,
        label="non-dominated frontier",
    )


def _save_plot(fig: Any, ax: Any, png: str | Path, xlabel: str, ylabel: str, title: str) -> None:
    """Label, lay out and write one plot as PNG, atomically, and free it."""
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
    """Reward vs cost and reward vs latency: fixed agents as labelled points, the router's trade-off
    lines (std over repeats as error bars, each point labelled with its weight), optionally one kNN
    line and further router curves (`compare`: label and points, e.g. another search setting), the
    in-sample oracle, the non-dominated frontier over FRONTIER_KINDS, and optionally a target box
    (`target`: reward_floor, cost_cap, latency_cap) as dashed lines. `limits` zooms in: "cost" or
    "latency" -> (x min, x max, reward min, reward max). PNGs written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for png, axis, flag, label, cap, plane in (
        (cost_png, "cost_per_1k", "cost_frontier", "mean cost (USD per 1,000 queries)", "cost_cap", "cost"),
        (latency_png, "latency_s", "latency_frontier", "mean latency per query (s)", "latency_cap", "latency"),
    ):
        fig, ax = plt.subplots(figsize=(9, 6), dpi=120)
        routers = result.of_kind("router")
        families = [
            ("router, cost weight", "o-", "tab:blue", [p for p in routers if not p.latency_weight]),
            (
                "router, latency weight",
                "s--",
                "tab:purple",
                [p for p in routers if p.latency_weight and not p.cost_weight],
            ),
            ("router, both weights", "^:", "tab:cyan", [p for p in routers if p.latency_weight and p.cost_weight]),
        ]
        for family, style, color, members in families:
            if not members:
                continue
            xs, ys = [getattr(p, axis) for p in members], [p.reward for p in members]
            ax.errorbar(
                xs,
                ys,
                yerr=[p.reward_std_repeats for p in members],
                fmt=style,
                color=color,
                ms=4,
                capsize=2,
                lw=1,
                label=family,
            )
            for p, x, y in zip(members, xs, ys, strict=True):
                weight = p.latency_weight if p.latency_weight and not p.cost_weight else p.cost_weight
                ax.annotate(f"{weight:g}", (x, y), textcoords="offset points", xytext=(3, 3), fontsize=6, color=color)
        for (name, members), color in zip(compare, ("tab:olive", "tab:brown", "tab:pink"), strict=False):
            members = sorted(members, key=lambda p: (p.latency_weight or 0.0, p.cost_weight or 0.0))
            ax.plot(
                [getattr(p, axis) for p in members],
                [p.reward for p in members],
                "d-",
                color=color,
                ms=4,
                lw=1,
                alpha=0.8,
                label=name,
            )
        if knn_k is not None:
            knn = [p for p in result.of_kind("knn") if p.name.startswith(f"knn{knn_k} ") and not p.latency_weight]
            if knn:
                ax.plot(
                    [getattr(p, axis) for p in knn],
                    [p.reward for p in knn],
                    "x-",
                    color="tab:orange",
                    ms=4,
                    lw=1,
                    label=f"kNN (k={knn_k}), cost weight",
                )
        for p in result.of_kind("fixed"):
            ax.plot(getattr(p, axis), p.reward, "D", color="black", ms=6)
            ax.annotate(
                p.name.removeprefix("always "),
                (getattr(p, axis), p.reward),
                textcoords="offset points",
                xytext=(5, -10),
                fontsize=8,
            )
        for kind, marker in (("best_fixed_train", "v"), ("random", "P")):
            for p in result.of_kind(kind):
                ax.plot(getattr(p, axis), p.reward, marker, color="gray", ms=6, label=p.name)
        for p in result.of_kind("oracle"):
            if p.name == "oracle (cheapest best)":
                ax.plot(
                    getattr(p, axis),
                    p.reward,
                    "*",
                    color="tab:green",
                    ms=12,
                    label="oracle, cheapest of best (in-sample)",
                )
        _draw_frontier(ax, result.points, axis, flag)
        if target:
            ax.axhline(target["reward_floor"], color="tab:green", ls="--", lw=0.8, label="target")
            ax.axvline(target[cap], color="tab:green", ls="--", lw=0.8)
        if limits and plane in limits:
            x_low, x_high, y_low, y_high = limits[plane]
            ax.set_xlim(x_low, x_high)
            ax.set_ylim(y_low, y_high)
        _save_plot(
            fig,
            ax,
            png,
            label,
            "mean reward (held-out, repeated CV)",
            title or f"{result.repeats}x{result.folds}-fold CV, {result.rows} rows",
        )
