"""benchgen_router.frontier: cost-aware training through the unchanged search, the repeated CV over a
trade-off grid with its baselines, the frontier and its area, nested target mode, multi-head
training, output formats and bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchgen_router import frontier as fr
from benchgen_router.costs import CostData, load_cost_data
from benchgen_router.errors import InputError
from benchgen_router.head import head_picks
from benchgen_router.training.search import search_head
from helpers import PILOT, cli, run_tool

FAST = {"generations": 15, "seed": 3}
needs_pilot = pytest.mark.skipif(
    not (PILOT / "rewards.v1-pilot.jsonl").exists(), reason=f"real pilot data not found at {PILOT} (CI has it)"
)


def synthetic(rows: int = 40, dim: int = 6, seed: int = 0) -> tuple[np.ndarray, CostData]:
    """Three agents: 'pricey' and 'cheap' both answer everything (reward 1); 'wrong', the cheapest and
    fastest, fails one cluster and is half right on the other. Costs and latencies are per agent. The
    clusters are tight, so held-out rows look like training rows and CV checks the mechanism."""
    rng = np.random.default_rng(seed)
    cluster = np.arange(rows) % 2
    embeddings = rng.normal(scale=3, size=(2, dim))[cluster] + rng.normal(scale=0.05, size=(rows, dim))
    rewards = np.ones((rows, 3))
    rewards[:, 2] = 0.5 * cluster
    cost_usd = np.tile([2e-4, 5e-5, 1e-5], (rows, 1))
    latency = np.tile([10.0, 2.0, 1.0], (rows, 1))
    data = CostData(
        ["pricey", "cheap", "wrong"], [f"t{i}" for i in range(rows)], rewards, cost_usd, latency, np.full((rows, 3), 3)
    )
    return embeddings.astype(np.float32), data


def test_with_a_cost_weight_the_router_picks_the_cheaper_of_two_equally_good_agents():
    embeddings, data = synthetic()
    theta = search_head(embeddings, fr.Tradeoff(1.0, 0.0).utility(data), **FAST).theta
    picks = head_picks(theta, embeddings, 3, 0)
    assert (picks == 1).all()  # 'cheap': same reward as 'pricey', a fifth of the cost
    result = fr.cross_validate_frontier(
        embeddings,
        data,
        [fr.Tradeoff(0.0, 0.0), fr.Tradeoff(1.0, 0.0)],
        folds=4,
        repeats=2,
        search_kwargs=FAST,
        knn_ks=(3,),
    )
    costly = result.point("router lc1_ll0")
    assert costly.share["cheap"] == 1.0 and costly.reward == 1.0
    assert costly.cost_per_1k == pytest.approx(0.05)
    assert result.point("knn3 lc1_ll0").share["cheap"] == 1.0


def test_a_latency_weight_prefers_the_faster_of_two_equally_good_agents():
    embeddings, data = synthetic()
    data.cost_usd[:] = 1e-4  # equal costs: only latency separates pricey (10 s) from cheap (2 s)
    theta = search_head(embeddings, fr.Tradeoff(0.0, 0.01).utility(data), **FAST).theta
    assert (head_picks(theta, embeddings, 3, 0) == 1).all()


def test_weight_zero_is_the_reward_search_bit_for_bit():
    embeddings, data = synthetic()
    utility = fr.Tradeoff().utility(data)
    assert utility is data.rewards
    reference = search_head(embeddings, data.rewards, **FAST).theta
    heads = fr.train_heads_over_grid(embeddings, data, [fr.Tradeoff(), fr.Tradeoff(0.5, 0.0)], FAST)
    assert heads[0].name == "lc0_ll0" and heads[0].cv_point is None
    assert heads[0].theta.dtype == np.float64 and np.array_equal(heads[0].theta, reference)
    assert not np.array_equal(heads[1].theta, reference)


def test_train_heads_over_grid_carries_each_heads_cv_point():
    embeddings, data = synthetic()
    grid = [fr.Tradeoff(), fr.Tradeoff(1.0, 0.0)]
    cv = fr.cross_validate_frontier(embeddings, data, grid, folds=3, repeats=1, search_kwargs=FAST, knn_ks=())
    heads = fr.train_heads_over_grid(embeddings, data, grid, FAST, cv)
    assert [h.cv_point["name"] for h in heads] == ["router lc0_ll0", "router lc1_ll0"]
    assert heads[1].cv_point["share"]["cheap"] == 1.0
    json.dumps([h.cv_point for h in heads])
    with pytest.raises(InputError, match="no point for trade-off lc2_ll0"):
        fr.train_heads_over_grid(embeddings, data, [fr.Tradeoff(2.0, 0.0)], FAST, cv)


def test_baselines_and_statistics_on_the_same_rows():
    embeddings, data = synthetic(rows=30)
    data.rewards[:, 0] = np.linspace(0, 1, 30)  # pricey is no longer always right
    result = fr.cross_validate_frontier(
        embeddings, data, [fr.Tradeoff()], folds=3, repeats=3, search_kwargs=FAST, knn_ks=()
    )
    for j, agent in enumerate(data.agents):
        point = result.point(f"always {agent}")
        assert point.reward == pytest.approx(data.rewards[:, j].mean())
        assert point.reward_std_repeats == pytest.approx(0.0, abs=1e-12)  # every row once per repeat
        assert point.cost_per_1k == pytest.approx(data.cost_per_1k[:, j].mean())
        assert point.share[agent] == 1.0
    assert result.reference == "always cheap"  # tied with pricey... no: cheap is right everywhere
    assert result.point("uniform random").reward == pytest.approx(data.rewards.mean())
    assert result.point("oracle (first best)").reward == pytest.approx(data.rewards.max(axis=1).mean())
    oracle = result.point("oracle (cheapest best)")
    assert oracle.share["cheap"] == 1.0  # pricey is as good but dearer; wrong is never best
    assert not oracle.deployable and not oracle.cost_frontier
    reference = result.point(result.reference)
    assert reference.delta_reward == 0.0 and reference.delta_se == 0.0


def test_reference_and_best_fixed_on_training_folds_break_reward_ties_by_cost():
    rewards = np.array([[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    assert fr.best_fixed_agent(rewards[[0, 0]], np.array([[2.0, 1.0, 0.5], [2.0, 1.0, 0.5]])) == 1
    assert fr.best_fixed_agent(rewards[:1], np.array([[1.0, 2.0, 0.5]])) == 0


def test_fold_assignments_hold_every_row_out_once_per_repeat_and_are_seeded():
    assignment = fr.fold_assignments(23, 5, 4, seed=7)
    assert assignment.shape == (4, 23)
    for repeat in assignment:
        assert sorted(np.bincount(repeat)) == [4, 4, 5, 5, 5]
    np.testing.assert_array_equal(assignment, fr.fold_assignments(23, 5, 4, seed=7))
    assert not np.array_equal(assignment[0], assignment[1])
    with pytest.raises(InputError, match="needs 2 to 23 folds"):
        fr.fold_assignments(23, 1, 1, 0)
    with pytest.raises(InputError, match="at least 1 repeat"):
        fr.fold_assignments(23, 5, 0, 0)


def test_knn_averages_the_utility_rows_of_the_nearest_training_rows():
    train = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]])
    utility = np.array([[1.0, 0.0], [0.0, 0.5], [0.0, 1.0]])
    test = np.array([[5.0, 0.1], [0.1, 3.0]])  # cosine ignores the length
    np.testing.assert_array_equal(fr.knn_picks(train, utility, test, k=1), [0, 1])
    np.testing.assert_array_equal(fr.knn_picks(train, utility, test, k=2), [0, 1])  # (1, .25) and (0, .75)
    np.testing.assert_array_equal(fr.knn_picks(train, utility, test, k=3), [1, 1])  # mean (.33, .5)


def test_non_dominated_points():
    points = [(1.0, 0.5), (2.0, 0.9), (3.0, 0.8), (1.5, 0.5), (2.0, 0.9), (0.5, 0.2)]
    assert fr.non_dominated(points) == [True, True, False, False, True, True]
    # the same reward summed in another order differs in the last bit: a tie, not a domination
    assert fr.non_dominated([(1.0, 0.8840579710144927), (2.0, 0.8840579710144928)]) == [True, False]
    assert fr.non_dominated([(1.0, 0.5), (1.0, 0.5 + 1e-15)]) == [True, True]


def test_area_under_frontier_matches_a_hand_computation():
    points = [(1.0, 0.5), (2.0, 0.9), (3.0, 0.8), (1.5, 0.55)]
    # hull: (1, .5) -> (2, .9), then flat; (1.5, .55) lies below the chord (.7), (3, .8) below the flat
    assert fr.reachable_frontier(points) == [(1.0, 0.5), (2.0, 0.9)]
    # window [1, 3]: trapezoid (.5 + .9) / 2 * 1 + .9 * 1 = 1.6, over a width of 2
    assert fr.area_under_frontier(points, 1.0, 3.0) == pytest.approx(0.8)
    # window [0, 3]: nothing is reachable below cost 1, so the same area over a width of 3
    assert fr.area_under_frontier(points, 0.0, 3.0) == pytest.approx(1.6 / 3)
    # window [1.5, 2.5]: f(1.5) = .7, f(2) = .9, f(2.5) = .9 -> (.8 * .5 + .9 * .5) / 1
    assert fr.area_under_frontier(points, 1.5, 2.5) == pytest.approx(0.85)
    # a single point: 0 left of it, its reward right of it
    assert fr.area_under_frontier([(2.0, 0.6)], 1.0, 3.0) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="empty cost window"):
        fr.area_under_frontier(points, 2.0, 2.0)


def test_frontier_flags_are_exactly_the_non_dominated_deployable_points():
    embeddings, data = synthetic(rows=30)
    data.rewards[:, 0] = np.linspace(0, 1, 30) > 0.2
    grid = [fr.Tradeoff(), fr.Tradeoff(2.0, 0.0), fr.Tradeoff(0.0, 0.05)]
    result = fr.cross_validate_frontier(embeddings, data, grid, folds=3, repeats=2, search_kwargs=FAST, knn_ks=(1,))
    deployable = [p for p in result.points if p.kind in fr.FRONTIER_KINDS]
    assert all(not p.cost_frontier for p in result.points if p.kind not in fr.FRONTIER_KINDS)
    for point in deployable:
        beaten = any(
            q.cost_per_1k <= point.cost_per_1k
            and q.reward >= point.reward
            and (q.cost_per_1k < point.cost_per_1k or q.reward > point.reward)
            for q in deployable
        )
        assert point.cost_frontier == (not beaten)
    assert any(p.cost_frontier for p in deployable) and any(p.latency_frontier for p in deployable)
    assert set(result.aiq) == {
        "fixed agents",
        "router + fixed agents",
        "knn1 + fixed agents",
        "oracle + fixed agents (in-sample)",
    }
    for name, value in result.aiq.items():
        assert value >= result.aiq["fixed agents"] - 1e-12, name  # adding points never lowers the area
    fixed = [(p.cost_per_1k, p.reward) for p in result.of_kind("fixed")]
    assert result.aiq["fixed agents"] == pytest.approx(fr.area_under_frontier(fixed, *result.aiq_window))


def test_headline_savings_and_dominance():
    embeddings, data = synthetic()
    result = fr.cross_validate_frontier(
        embeddings, data, [fr.Tradeoff(), fr.Tradeoff(1.0, 0.0)], folds=4, repeats=1, search_kwargs=FAST, knn_ks=()
    )
    summary = fr.headline(result, eps=0.0)
    assert summary["reference"] == "always cheap"  # cheap is right everywhere and cheaper than pricey
    best = summary["cheapest_router_by_cost"]
    assert best["name"] == "router lc1_ll0" and best["cost_saving"] == pytest.approx(0.0)
    assert "router lc1_ll0" in summary["fixed_agents_dominated_by_a_router"]["always pricey"]
    assert summary["router_dominates_every_fixed_agent"] is False  # 'wrong' is cheaper than any router
    assert fr.cheapest_within(result.of_kind("router"), 2.0, 0.0) is None


def test_nested_target_mode_never_sees_the_outer_test_rows():
    embeddings, data = synthetic(rows=24)
    ids = np.arange(len(data), dtype=np.float32)
    tagged = np.column_stack([embeddings, ids / 1000])  # a last column, too small to matter, names each row
    seen: list[set[int]] = []

    def spy(train_embeddings: np.ndarray, utility: np.ndarray) -> np.ndarray:
        seen.append(set(np.rint(train_embeddings[:, -1] * 1000).astype(int).tolist()))
        return search_head(train_embeddings, utility, **FAST).theta

    grid = [fr.Tradeoff(), fr.Tradeoff(1.0, 0.0)]
    result = fr.nested_target_cv(
        tagged,
        data,
        eps=0.01,
        grid=grid,
        outer_folds=3,
        outer_repeats=1,
        inner_folds=2,
        inner_repeats=1,
        seed=5,
        searcher=spy,
    )
    outer = fr.fold_assignments(len(data), 3, 1, seed=5)[0]
    per_fold = 2 * len(grid) + 1  # inner folds x grid, then the final search on the outer training rows
    assert len(seen) == 3 * per_fold
    for fold in range(3):
        outer_train = set(np.flatnonzero(outer != fold).tolist())
        block = seen[fold * per_fold : (fold + 1) * per_fold]
        assert all(rows <= outer_train for rows in block)
        assert block[-1] == outer_train
    assert result.chosen == ["lc1_ll0"] * 3  # same reward as the best fixed agent at a fifth of the cost
    assert result.point.share["cheap"] == 1.0 and result.point.extra["chosen"] == {"lc1_ll0": 3}


def test_select_tradeoff_falls_back_to_the_best_router_when_none_reaches_the_target():
    embeddings, data = synthetic()
    data.rewards[:, 1] = 0.0  # only pricey is right everywhere; wrong is right on half
    result = fr.cross_validate_frontier(
        embeddings, data, [fr.Tradeoff(), fr.Tradeoff(5.0, 0.0)], folds=4, repeats=1, search_kwargs=FAST, knn_ks=()
    )
    assert fr.select_tradeoff(result, eps=0.0).name == "lc0_ll0"  # the cost weight gives up reward
    assert fr.select_tradeoff(result, eps=0.6).name == "lc5_ll0"  # half the reward is within 0.6


def test_remedies_seed_ensemble_and_shrink_are_one_linear_head_and_off_by_default():
    embeddings, data = synthetic()
    search, _ = fr.make_searcher({**FAST, "ensemble_seeds": [1, 2]})
    expected = (
        search_head(embeddings, data.rewards, **{**FAST, "seed": 1}).theta
        + search_head(embeddings, data.rewards, **{**FAST, "seed": 2}).theta
    ) / 2
    np.testing.assert_allclose(search(embeddings, data.rewards), expected)
    shrunk, _ = fr.make_searcher({**FAST, "shrink": 0.5})
    target = 0.5 * data.rewards + 0.5 * data.rewards.mean(axis=0)
    np.testing.assert_array_equal(shrunk(embeddings, data.rewards), search_head(embeddings, target, **FAST).theta)
    assert fr.regularised_utility(data.rewards, 0.0) is data.rewards
    plain, _ = fr.make_searcher(FAST)
    np.testing.assert_array_equal(plain(embeddings, data.rewards), search_head(embeddings, data.rewards, **FAST).theta)
    for kwargs, message in (
        ({"hidden_dim": 4, "ensemble_seeds": [1]}, "linear heads only"),
        ({"ensemble_seeds": []}, "must be a non-empty list of integers"),
        ({"shrink": 1.0}, r"shrink 1.0 must be a number in \[0, 1\)"),
    ):
        with pytest.raises(InputError, match=message):
            fr.make_searcher(kwargs)


def test_grid_parsing_and_bad_input():
    assert [t.name for t in fr.parse_grid("0, 0.5,1,0.5")] == ["lc0_ll0", "lc0.5_ll0", "lc1_ll0"]
    assert fr.parse_grid("0:0.01,2:0")[0] == fr.Tradeoff(0.0, 0.01)
    for text, message in (
        ("a", "trade-off 'a' is not a number"),
        ("1:2:3", "trade-off '1:2:3' is not a number"),
        ("", "grid is empty"),
        ("-1", r"cost weight -1.0 must be a number from 0 to 1e\+06"),
        ("1e308", r"cost weight 1e\+308 must be a number from 0 to 1e\+06"),
        ("0:inf", "latency weight inf must be"),
    ):
        with pytest.raises(InputError, match=message):
            fr.parse_grid(text)
    embeddings, data = synthetic()
    with pytest.raises(InputError, match="39 embeddings for 40 labelled rows"):
        fr.cross_validate_frontier(embeddings[:-1], data, [fr.Tradeoff()], folds=2, repeats=1)
    with pytest.raises(InputError, match="grid is empty"):
        fr.cross_validate_frontier(embeddings, data, [], folds=2, repeats=1)


def test_frontier_gap_places_the_cv_router_line_between_the_cheapest_and_the_best_agent():
    embeddings, data = synthetic()
    result = fr.cross_validate_frontier(
        embeddings, data, [fr.Tradeoff(0.0), fr.Tradeoff(2.0)], folds=2, repeats=1, search_kwargs=FAST, knn_ks=(1,)
    )
    gap = fr.frontier_gap(result, data.rewards, data.cost_per_1k)
    pool = gap["pool"]
    # 'wrong' is the cheapest (reward 0.25), 'cheap' the best (1.0, cheaper than 'pricey')
    assert (pool["cheapest"], pool["best"]) == ("wrong", "cheap")
    low, high = data.cost_per_1k[0, 2], data.cost_per_1k[0, 1]
    routers = result.of_kind("router")
    xs = sorted([0.0, 1.0] + [(p.cost_per_1k - low) / (high - low) for p in routers])
    inside = [x for x in xs if 0 <= x <= 1]
    assert list(gap["curves"][0].cost[(gap["curves"][0].cost >= 0) & (gap["curves"][0].cost <= 1)]) == pytest.approx(
        inside
    )
    # the oracle sends the half-right rows' wrong answers to 'cheap': it recovers the gap at once
    assert pool["policies"]["oracle"]["apgr"] > pool["policies"]["random"]["apgr"] == pytest.approx(0.5)
    assert pool["policies"]["oracle"]["cost_to_recover_80"] < high


def test_table_dict_and_plots(tmp_path):
    embeddings, data = synthetic(rows=20)
    grid = [fr.Tradeoff(), fr.Tradeoff(1.0, 0.0), fr.Tradeoff(0.0, 0.05)]
    result = fr.cross_validate_frontier(embeddings, data, grid, folds=2, repeats=2, search_kwargs=FAST, knn_ks=(1,))
    table = fr.format_frontier(result, knn_ks=(1,))
    for name in (
        "router lc1_ll0",
        "knn1 lc0_ll0",
        "always pricey",
        "best fixed (train folds)",
        "oracle (cheapest best)",
    ):
        assert name in table
    assert "knn1" not in fr.format_frontier(result)
    as_dict = json.loads(json.dumps(fr.frontier_to_dict(result)))
    assert as_dict["units"]["cost_weight"] == "reward per (USD per 1,000 queries)"
    assert {p["name"] for p in as_dict["points"]} == {p.name for p in result.points}
    assert as_dict["headline"]["reference"] == result.reference
    back = fr.frontier_from_dict(as_dict)
    assert fr.format_frontier(back, knn_ks=(1,)) == table
    with pytest.raises(InputError, match="stored frontier is incomplete"):
        fr.frontier_from_dict({"points": []})
    fr.plot_frontier(result, tmp_path / "cost.png", tmp_path / "latency.png", knn_k=1)
    for name in ("cost.png", "latency.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@needs_pilot
def test_pilot_baselines_in_the_cv_match_the_data():
    data = load_cost_data(PILOT / "rewards.v1-pilot.jsonl", PILOT / "rewards.jsonl", PILOT / "agents.json")
    embeddings = np.random.default_rng(0).normal(size=(len(data), 8)).astype(np.float32)  # baselines ignore them
    result = fr.cross_validate_frontier(
        embeddings, data, [fr.Tradeoff()], folds=5, repeats=2, search_kwargs={"generations": 2}, knn_ks=()
    )
    assert result.reference == "always frontier_a"  # tied with frontier_b on reward, cheaper
    summary = data.summary()
    for agent, figures in summary["agents"].items():
        point = result.point(f"always {agent}")
        assert point.reward == pytest.approx(figures["reward"])
        assert point.latency_s == pytest.approx(figures["latency_s"])
    oracle = result.point("oracle (cheapest best)")
    assert oracle.cost_per_1k == pytest.approx(summary["oracle_cheapest_of_best"]["cost_per_1k_usd"])
    assert result.point("always open_cheap_reasoning").cost_frontier


def _pilot_like_files(folder, rows: int = 12):
    """rewards, tasks and raw calls files in the pilot schemas for two agents."""
    from helpers import call_record, calls_row, make_queries

    agents = ["big", "small"]
    rewards, tasks, calls = [], [], []
    for i, prompt in enumerate(make_queries(rows, seed=1)):
        correct = [True, i % 3 != 0]
        records = [
            call_record(agent, ok, price, wait)
            for agent, ok, price, wait in zip(agents, correct, (2e-4, 2e-5), (9000, 1000), strict=True)
        ]
        calls.append(calls_row(f"t{i}", agents, records))
        rewards.append({key: calls[-1][key] for key in ("task_id", "agent_order", "mean_reward")})
        tasks.append({"task_id": f"t{i}", "prompt": prompt, "split": "train"})
    paths = []
    for name, content in (("rewards.jsonl", rewards), ("tasks.jsonl", tasks), ("calls.jsonl", calls)):
        path = folder / name
        path.write_text("".join(json.dumps(r) + "\n" for r in content), encoding="utf-8")
        paths.append(path)
    return paths


def test_analysis_command_end_to_end(backbone_dir, tmp_path, capsys):
    rewards, tasks, calls = _pilot_like_files(tmp_path)
    common = ["--rewards", str(rewards), "--tasks", str(tasks), "--calls", str(calls), "--backbone", str(backbone_dir)]
    code = cli(
        "frontier",
        *common,
        "--grid",
        "0,1",
        "--folds",
        "2",
        "--repeats",
        "1",
        "--generations",
        "3",
        "--knn",
        "1",
        "--target-eps",
        "0.5",
        "--outer-repeats",
        "1",
        "--inner-repeats",
        "1",
        "--json",
        str(tmp_path / "f.json"),
        "--plots",
        str(tmp_path / "f"),
        "--plot-knn",
        "1",
        "--target-box",
        "0.01,0.6,0.4",
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "router lc1_ll0" in out and "always small" in out and "target mode eps=0.5" in out
    stored = json.loads((tmp_path / "f.json").read_text())
    assert stored["rows"] == 12 and stored["target"]["eps"] == 0.5
    assert (tmp_path / "f-cost.png").stat().st_size > 0 and (tmp_path / "f-latency.png").stat().st_size > 0
    assert (tmp_path / "f-gap.png").read_bytes()[:4] == b"\x89PNG"
    gap = stored["routing_gap"]["pool"]
    assert set(gap["policies"]) == {"router (CV)", "kNN k=1 (CV)", "random", "oracle"}
    assert gap["policies"]["random"]["apgr"] == pytest.approx(0.5)
    assert "quality against cost, gap from the cheapest agent" in out

    lines = calls.read_text().splitlines()
    calls.write_text("\n".join(lines[:-1]) + "\n")
    assert cli("frontier", *common, "--repeats", "1", "--folds", "2") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: 1 labelled tasks have no row in the calls file") and "\n" not in err


def test_evaluate_policies_scores_fixed_routers_in_sample_against_the_cv_baselines(tmp_path):
    _, data = synthetic(rows=12)
    data.rewards[:, 0] = np.linspace(0, 1, 12)
    rows = np.arange(12)
    routers = {"router a": rows % 3, "router b": np.ones(12, dtype=int)}
    result = fr.evaluate_policies(data, routers, {"router a": (0.5, 0.01)})
    assert [p.name for p in result.points[:2]] == ["router a", "router b"] and result.repeats == result.folds == 1
    for name, picks in routers.items():
        point = result.point(name)
        assert point.reward == pytest.approx(data.rewards[rows, picks].mean())
        assert point.cost_per_1k == pytest.approx(data.cost_per_1k[rows, picks].mean())
        assert point.latency_s == pytest.approx(data.latency_s[rows, picks].mean())
        assert point.share == pytest.approx({a: float((picks == j).mean()) for j, a in enumerate(data.agents)})
        assert point.reward_std_repeats == point.reward_std_folds == 0.0
    assert (result.point("router a").cost_weight, result.point("router a").latency_weight) == (0.5, 0.01)
    assert result.point("router b").cost_weight is None
    # the baselines are the CV's own: a fixed agent, random and the oracles do not depend on the folds
    cv = fr.cross_validate_frontier(
        np.eye(12), data, [fr.Tradeoff()], folds=3, repeats=1, search_kwargs=FAST, knn_ks=()
    )
    assert result.reference == cv.reference
    for point in result.points[2:]:
        other = cv.point(point.name)
        for key in ("reward", "delta_reward", "delta_se", "cost_per_1k", "latency_s", "share"):
            assert getattr(point, key) == pytest.approx(getattr(other, key), abs=1e-12), (point.name, key)
    assert not result.of_kind("best_fixed_train") and "best fixed (train folds)" not in result.choices
    candidates = [p for p in result.points if p.kind in fr.FRONTIER_KINDS]
    flags = fr.non_dominated([(p.cost_per_1k, p.reward) for p in candidates])
    assert [p.cost_frontier for p in candidates] == flags
    fixed = [(p.cost_per_1k, p.reward) for p in result.of_kind("fixed")]
    b = result.point("router b")
    assert result.aiq["router b + fixed agents"] == pytest.approx(
        fr.area_under_frontier([*fixed, (b.cost_per_1k, b.reward)], *result.aiq_window)
    )
    assert list(result.aiq)[:4] == [
        "fixed agents",
        "router + fixed agents",
        "router a + fixed agents",
        "router b + fixed agents",
    ]
    table = fr.format_frontier(result, title="in-sample, no CV")
    assert table.splitlines()[0] == "in-sample, no CV" and fr.format_frontier(cv).splitlines()[0].startswith("1x ")
    json.dumps(fr.frontier_to_dict(result))
    fr.plot_policies(result, tmp_path / "cost.png", tmp_path / "latency.png", title="test")
    for name in ("cost.png", "latency.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="agent indices"):
        fr.evaluate_policies(data, {"router": np.full(12, 3)})
    with pytest.raises(ValueError, match="repeat a baseline's name"):
        fr.evaluate_policies(data, {"uniform random": rows % 3})


def test_agents_of_one_cost_have_no_area_and_the_table_says_so():
    embeddings, data = synthetic(rows=12)
    same = CostData(
        data.agents, data.task_ids, data.rewards, np.full_like(data.cost_usd, 1e-4), data.latency_s, data.calls
    )
    result = fr.cross_validate_frontier(
        embeddings, same, [fr.Tradeoff()], folds=2, repeats=1, search_kwargs=FAST, knn_ks=()
    )
    assert result.aiq == {}
    assert fr.format_frontier(result).splitlines()[-1] == (
        "AIQ: none (every fixed agent costs 0.1000 USD/1k, so there is no cost range)"
    )


def test_the_module_entry_point_is_the_same_command():
    result = run_tool("benchgen_router.frontier", "--help")
    assert result.returncode == 0 and "--target-eps" in result.stdout and "Exit codes" in result.stdout
