"""frontier/pareto.py's headline on degenerate but valid input: a pool whose calls all took 0 ms (or
cost nothing) has no saving to report against the reference, and `evaluate --calls` and `train --calls
--cv-folds` say so instead of dividing by zero."""

from __future__ import annotations

import json

import pytest

from benchgen_router.frontier.pareto import headline_text
from helpers import AGENTS, call_record, calls_row, cli, synthetic_rows, write_jsonl


def zero_latency_files(folder):
    """Rewards, tasks and calls of 14 tasks whose every call took 0 ms (a replayed or cached pool) and
    was answered correctly, so that every router point is at equal quality with the reference."""
    rewards, tasks = synthetic_rows(14, seed=3)
    calls = []
    for row in rewards:
        made = [call_record(agent, True, 1e-4 * (j + 1), 0.0) for j, agent in enumerate(AGENTS) for _ in range(3)]
        calls.append(calls_row(row["task_id"], AGENTS, made))
        row["mean_reward"] = calls[-1]["mean_reward"]
    return (
        write_jsonl(folder / "rewards.jsonl", rewards),
        write_jsonl(folder / "tasks.jsonl", tasks),
        write_jsonl(folder / "calls.jsonl", calls),
    )


def test_evaluate_calls_with_every_latency_zero(converted, tmp_path, capsys):
    folder, _ = converted[0]
    rewards, tasks, calls = zero_latency_files(tmp_path)
    out = tmp_path / "evaluation.json"
    args = ["--model", folder, "--rewards", rewards, "--tasks", tasks, "--calls", calls, "--output-json", out]
    code = cli("evaluate", "--no-progress", *map(str, args))
    err = capsys.readouterr().err
    assert code == 0, err
    stored = json.loads(out.read_text())["cost_frontier"]
    assert all(point["latency_s"] == 0 for point in stored["points"])
    best = stored["headline"]["cheapest_router_by_cost"]
    # every point is at equal quality; the latency saving is undefined against 0 s, the cost saving is not
    assert best["latency_saving"] is None and best["cost_saving"] == pytest.approx(1 - best["cost_per_1k"] / 0.1)


def test_train_calls_cv_folds_with_every_latency_zero(backbone_dir, tmp_path, capsys):
    rewards, tasks, calls = zero_latency_files(tmp_path)
    args = ["--rewards", rewards, "--tasks", tasks, "--calls", calls, "--backbone", backbone_dir]
    args += ["--output-dir", tmp_path / "out", "--cv-folds", "2", "--cv-repeats", "1", "--generations", "2"]
    code = cli("train", "--no-cache", "--no-progress", *map(str, args))
    assert code == 0, capsys.readouterr().err


@pytest.mark.parametrize("figures", [True, False])
def test_a_saving_against_nothing_is_not_a_figure(figures):
    best = {
        "name": "router lc0_ll0", "reward": 0.9, "delta_reward": 0.0, "delta_se": 0.01, "cost_per_1k": 0.1,
        "latency_s": 0.0, "cost_saving": 0.5, "latency_saving": None,
    }  # fmt: skip
    summary = {"reference": "always a", "eps": 0.01, "cheapest_router_by_cost": best}
    text = headline_text(summary, figures=figures)
    assert "router lc0_ll0" in text and "None" not in text
    if figures:
        assert "at 50% of its cost and no share of its latency (which is 0);" in text


# ---------------------------------------------------------------------------------------------
# RouterBench's AIQ (Hu et al., arXiv 2403.12031): AIQ = 1 / (c_max - c_min) * integral over [c_min, c_max]
# of the router's non-decreasing convex hull R~(c), 0 below its cheapest point.


def test_aiq_on_a_hand_worked_example():
    """Points (1, 0.5), (2, 0.55), (3, 0.9), (5, 0.8) over the window [0, 4], worked by hand:
    - the hull: (2, 0.55) lies under the chord from (1, 0.5) to (3, 0.9), whose value at 2 is 0.7, so the
      hull runs (1, 0.5) -> (3, 0.9); (5, 0.8) is past the best point, so the hull is flat at 0.9 from 3;
    - the area: 0 on [0, 1]; a trapezoid (0.5 + 0.9) / 2 * 2 = 1.4 on [1, 3]; 0.9 * 1 = 0.9 on [3, 4];
    - AIQ = (1.4 + 0.9) / 4 = 0.575."""
    from benchgen_router.frontier.pareto import aiq_window, area_under_frontier, cost_to_reach, reachable_frontier

    points = [(1.0, 0.5), (2.0, 0.55), (3.0, 0.9), (5.0, 0.8)]
    assert reachable_frontier(points) == [(1.0, 0.5), (3.0, 0.9)]
    assert area_under_frontier(points, 0.0, 4.0) == pytest.approx(0.575)
    # The shared window ends where the latest-peaking hull reaches its best: 3 here, 4 with (4, 0.95).
    assert aiq_window([points]) == (0.0, 3.0)
    assert aiq_window([points, [(0.5, 0.2), (4.0, 0.95)]]) == (0.0, 4.0)
    # Matching an accuracy of 0.7 on the hull: halfway from (1, 0.5) to (3, 0.9), at cost 2.
    assert cost_to_reach(points, 0.7) == pytest.approx(2.0)
    assert cost_to_reach(points, 0.4) == 1.0 and cost_to_reach(points, 0.95) is None


def routerbench_hull(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """RouterBench's get_non_descreasing_convex_hull_of (withmartian/routerbench, evaluation/AIQ.py), written
    here from its description: sort by cost; raise every interior point to the highest chord over it between
    two other points; keep the dearest point if no chord tops it; prepend the cheapest point; drop every point
    below its predecessor (the curve stops at its best point)."""
    ordered = sorted(points)
    xs, ys = [x for x, _ in ordered], [y for _, y in ordered]
    raised = list(ys)
    for i in range(len(xs)):
        for j in range(i + 1, len(xs)):
            for k in range(len(xs)):
                if xs[i] < xs[k] < xs[j]:
                    chord = ys[i] + (ys[j] - ys[i]) * (xs[k] - xs[i]) / (xs[j] - xs[i])
                    raised[k] = max(raised[k], chord)
    hull = [(xs[k], raised[k]) for k in range(1, len(xs) - 1)]
    if ys[-1] >= raised[-2]:
        hull.append((xs[-1], ys[-1]))
    hull = sorted([(xs[0], ys[0]), *hull])
    kept = [hull[0]]
    for point in hull[1:]:
        if point[1] >= kept[-1][1]:
            kept.append(point)
    return kept


def routerbench_aiq(curves: list[list[tuple[float, float]]]) -> list[float]:
    """RouterBench's calc_AIQ, written here from its description: each curve's hull extended flat to the
    largest hull cost of all the curves, integrated with the trapezoid rule and divided by that cost."""
    hulls = [routerbench_hull(points) for points in curves]
    end = max(hull[-1][0] for hull in hulls)
    scores = []
    for hull in hulls:
        xs, ys = [x for x, _ in hull] + [end], [y for _, y in hull] + [hull[-1][1]]
        area = sum((xs[i + 1] - xs[i]) * (ys[i] + ys[i + 1]) / 2 for i in range(len(xs) - 1))
        scores.append(area / end)
    return scores


def test_aiq_matches_routerbench_computation_on_random_curves():
    """On random routers (3 to 8 points, distinct costs), area_under_frontier over aiq_window equals
    RouterBench's own computation of AIQ, point for point."""
    import numpy as np

    from benchgen_router.frontier.pareto import aiq_window, area_under_frontier

    rng = np.random.default_rng(7)
    for _ in range(200):
        curves = []
        for _ in range(rng.integers(1, 4)):
            costs = rng.choice(np.arange(1, 40), size=rng.integers(3, 9), replace=False) / 10
            curves.append([(float(c), float(q)) for c, q in zip(costs, rng.random(len(costs)), strict=True)])
        window = aiq_window(curves)
        ours = [area_under_frontier(points, *window) for points in curves]
        assert ours == pytest.approx(routerbench_aiq(curves), abs=1e-12)
