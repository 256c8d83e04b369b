"""`benchgen-router evaluate`: a converted router checked against reward data prints the trainer's table,
whatever the column order of the rewards, and refuses rewards for another pool."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchgen_router import frontier as fr
from helpers import (
    AGENTS,
    NO_PILOT,
    PILOT,
    call_record,
    calls_row,
    cli,
    make_queries,
    run_tool,
    synthetic_rows,
    write_jsonl,
)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, backbone_dir):
    """A router trained and exported on 30 synthetic tasks (8 held out), with its data files."""
    folder = tmp_path_factory.mktemp("evaluate")
    rng = np.random.default_rng(9)
    rewards, tasks = [], []
    for i, prompt in enumerate(make_queries(30, seed=21)):
        split = "test" if i % 4 == 0 else "train"
        rewards.append(
            {
                "task_id": f"q{i}",
                "agent_order": AGENTS,
                "split": split,
                "mean_reward": [float(v) for v in rng.choice([0, 1 / 3, 2 / 3, 1], size=5)],
            }
        )
        tasks.append({"task_id": f"q{i}", "prompt": prompt, "split": split})
    files = {
        "rewards": write_jsonl(folder / "rewards.jsonl", rewards),
        "tasks": write_jsonl(folder / "tasks.jsonl", tasks),
    }
    assert (
        cli(
            "train",
            *[
                "--rewards",
                str(files["rewards"]),
                "--tasks",
                str(files["tasks"]),
                "--backbone",
                str(backbone_dir),
                "--output-dir",
                str(folder / "out"),
                "--export",
                str(folder / "router"),
                "--generations",
                "15",
                "--cv-folds",
                "0",
                "--no-cache",
                "--no-progress",
            ],
        )
        == 0
    )
    manifest = json.loads((folder / "out" / "manifest.json").read_text())
    return folder, files, manifest, rewards, tasks


def evaluate(folder: Path, rewards: Path, tasks: Path, backbone: Path, *extra: str) -> dict:
    out = folder / f"evaluation-{len(list(folder.glob('evaluation-*')))}.json"
    code = cli(
        "evaluate",
        *[
            "--model",
            str(folder / "router"),
            "--rewards",
            str(rewards),
            "--tasks",
            str(tasks),
            "--backbone",
            str(backbone),
            "--output-json",
            str(out),
            "--no-progress",
            *extra,
        ],
    )
    assert code == 0
    return json.loads(out.read_text())


def test_evaluation_of_the_export_equals_the_trainers_held_out_table(trained, backbone_dir, capsys):
    folder, files, manifest, _, _ = trained
    capsys.readouterr()
    result = evaluate(folder, files["rewards"], files["tasks"], backbone_dir, "--split", "test")
    expected = manifest["evaluation"]
    assert result["rows"] == manifest["n_test"] == 8
    assert result["picks"] == expected["picks"]
    for key in ("router", "best_fixed_agent", "random_agent", "oracle"):
        assert result[key] == pytest.approx(expected[key], abs=1e-12)
    assert result["best_fixed_agent_id"] == expected["best_fixed_agent_id"]
    printed = capsys.readouterr().out
    assert "on split 'test' (8 rows)" in printed and f"{expected['router']:.4f}" in printed


def test_every_row_by_default_and_any_column_order(trained, backbone_dir, tmp_path):
    folder, files, _, rewards, _ = trained
    everything = evaluate(folder, files["rewards"], files["tasks"], backbone_dir)
    assert everything["rows"] == 30 and sum(everything["picks"].values()) == 30
    order = [4, 2, 0, 3, 1]  # the same measurements with the pool listed in another order
    shuffled = [
        {**row, "agent_order": [AGENTS[i] for i in order], "mean_reward": [row["mean_reward"][i] for i in order]}
        for row in rewards
    ]
    again = evaluate(folder, write_jsonl(tmp_path / "shuffled.jsonl", shuffled), files["tasks"], backbone_dir)
    assert again["picks"] == everything["picks"]
    for key in ("router", "best_fixed_agent", "random_agent", "oracle", "headroom_share"):
        assert again[key] == pytest.approx(everything[key], abs=1e-12)


def test_rewards_for_another_pool_or_split_are_refused(trained, backbone_dir, tmp_path, capsys):
    folder, files, _, rewards, _ = trained
    other_pool = [{**row, "agent_order": [*AGENTS[:4], "someone_else"]} for row in rewards]
    args = ["--model", str(folder / "router"), "--tasks", str(files["tasks"]), "--backbone", str(backbone_dir)]
    capsys.readouterr()
    assert cli("evaluate", *[*args, "--rewards", str(write_jsonl(tmp_path / "other.jsonl", other_pool))]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("error: the router's pool ") and "someone_else" in line
    assert cli("evaluate", *[*args, "--rewards", str(files["rewards"]), "--split", "validation"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: no joined row has split 'validation' (splits present: ['test', 'train'])."
    )


@pytest.mark.slow
def test_cli_prints_the_table_and_exits_0(trained, backbone_dir):
    folder, files, manifest, _, _ = trained
    result = run_tool(
        "evaluate",
        "--model",
        folder / "router",
        "--rewards",
        files["rewards"],
        "--tasks",
        files["tasks"],
        "--backbone",
        backbone_dir,
        "--split",
        "test",
        "--no-progress",
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"evaluation of {folder / 'router'} on split 'test' (8 rows)"  # stdout is the table only
    assert lines[3].split() == ["router", f"{manifest['evaluation']['router']:.4f}"]
    # one table as the data gives the prompts, one as plain questions (label and instruction removed)
    assert sum(int(line.split()[-1]) for line in lines if line.startswith("picks: ")) == 2 * 8
    assert f"evaluation of {folder / 'router'} on split 'test', plain questions (8 rows)" in lines


# ---------------------------------------------------------------------------------------------
# --calls: the router's own cost and latency point against the baselines, in-sample

# per-call cost (USD) and latency (ms) levels per agent; each call varies around them
COST_LEVEL = dict(zip(AGENTS, (1.2e-4, 1.3e-4, 5e-5, 1e-5, 6e-5), strict=True))
LATENCY_LEVEL = dict(zip(AGENTS, (20_000, 15_000, 7_000, 3_000, 4_000), strict=True))
POOL = [
    {"agent_id": agent, "price_per_1m_prompt_usd": 0.1 * (j + 1), "price_per_1m_output_usd": 0.4 * (j + 1)}
    for j, agent in enumerate(AGENTS)
]


def cost_rows(count: int = 14, seed: int = 5) -> tuple[list[dict], list[dict], list[dict]]:
    """(rewards, tasks, raw calls) that belong together: every agent makes 3 calls per task and its
    labelled reward is the share of them graded correct, as cost_data_from_calls checks."""
    rewards, tasks = synthetic_rows(count, seed)
    rng = np.random.default_rng(seed)
    calls = []
    for row in rewards:
        correct = rng.integers(0, 4, size=len(AGENTS))
        made = [
            call_record(
                agent,
                bool(n < k),
                float(COST_LEVEL[agent] * rng.uniform(0.5, 1.5)),
                float(LATENCY_LEVEL[agent] * rng.uniform(0.5, 1.5)),
                int(rng.integers(50, 500)),
                int(rng.integers(10, 2000)),
            )
            for agent, k in zip(AGENTS, correct, strict=True)
            for n in range(3)
        ]
        calls.append(calls_row(row["task_id"], AGENTS, made))
        row["mean_reward"] = calls[-1]["mean_reward"]
    return rewards, tasks, calls


@pytest.fixture(scope="module")
def cost_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("evaluate-costs")
    rewards, tasks, calls = cost_rows()
    return {
        "folder": folder,
        "rewards": write_jsonl(folder / "rewards.jsonl", rewards),
        "tasks": write_jsonl(folder / "tasks.jsonl", tasks),
        "calls": write_jsonl(folder / "calls.jsonl", calls),
        "rows": (rewards, tasks, calls),
    }


def by_hand(rewards: list[dict], calls: list[dict], prices: dict | None = None) -> dict[str, np.ndarray]:
    """R, C (USD per 1,000 queries) and L (s) per task and agent, averaged straight from the rows; a
    call without cost_usd is priced from `prices` (agent -> (prompt, completion) USD per 1M tokens)."""
    by_task = {row["task_id"]: row["calls"] for row in calls}
    cost = np.zeros((len(rewards), len(AGENTS)))
    latency = np.zeros_like(cost)
    for i, row in enumerate(rewards):
        for j, agent in enumerate(AGENTS):
            made = [c for c in by_task[row["task_id"]] if c["agent"] == agent]
            usd = [
                c["cost_usd"]
                if "cost_usd" in c
                else (c["prompt_tokens"] * prices[agent][0] + c["completion_tokens"] * prices[agent][1]) / 1e6
                for c in made
            ]
            cost[i, j] = 1000 * sum(usd) / len(made)
            latency[i, j] = sum(c["latency_ms"] for c in made) / len(made) / 1000
    return {"R": np.array([row["mean_reward"] for row in rewards]), "C": cost, "L": latency}


def reference_picks(backbone: Path, theta: np.ndarray, prompts: list[str]) -> np.ndarray:
    from reference_impl import ReferenceRouter

    return ReferenceRouter(str(backbone), theta, AGENTS).batch_logits(prompts).argmax(axis=1)


def expected_points(matrices: dict[str, np.ndarray], routers: dict[str, np.ndarray]) -> dict[str, dict]:
    """Reward, cost, latency, share and Δ to the best fixed agent of each router (its picks), each fixed
    agent and uniform random, and the frontier marks among them, computed here from the matrices."""
    R, C, L = matrices["R"], matrices["C"], matrices["L"]
    rows = np.arange(len(R))
    means = R.mean(axis=0)
    tied = np.flatnonzero(means >= means.max() - 1e-12)
    reference = R[:, tied[np.argmin(C.mean(axis=0)[tied])]]  # the best agent, ties to the cheaper
    policies = {name: np.eye(len(AGENTS))[picks] for name, picks in routers.items()}
    policies.update({f"always {agent}": np.eye(len(AGENTS))[np.full(len(R), j)] for j, agent in enumerate(AGENTS)})
    policies["uniform random"] = np.full(R.shape, 1 / len(AGENTS))
    points = {}
    for name, choice in policies.items():
        reward = (choice * R).sum(axis=1)
        points[name] = {
            "reward": reward.mean(),
            "cost_per_1k": (choice * C).sum(axis=1)[rows].mean(),
            "latency_s": (choice * L).sum(axis=1).mean(),
            "share": dict(zip(AGENTS, choice.mean(axis=0), strict=True)),
            "delta_reward": (reward - reference).mean(),
            "delta_se": (reward - reference).std(ddof=1) / np.sqrt(len(R)),
        }
    for axis, flag in (("cost_per_1k", "cost_frontier"), ("latency_s", "latency_frontier")):
        for name, p in points.items():
            p[flag] = not any(
                q[axis] <= p[axis] and q["reward"] >= p["reward"] and (q[axis] < p[axis] or q["reward"] > p["reward"])
                for other, q in points.items()
                if other != name
            )
    return points


def run_evaluate(capsys, *args: object) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli("evaluate", "--no-progress", *args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def check_points(stored: dict, expected: dict[str, dict]) -> None:
    points = {p["name"]: p for p in stored["points"]}
    for name, figures in expected.items():
        for key, value in figures.items():
            if key == "share":
                assert points[name]["share"] == pytest.approx(value, abs=1e-12), name
            else:
                assert points[name][key] == pytest.approx(value, abs=1e-12), (name, key)


def test_calls_report_the_single_head_routers_point_as_computed_by_hand(
    converted, backbone_dir, cost_files, tmp_path, capsys
):
    folder, theta = converted[0]
    rewards, tasks, calls = cost_files["rows"]
    out = tmp_path / "evaluation.json"
    code, printed, err = run_evaluate(
        capsys,
        *["--model", folder, "--rewards", cost_files["rewards"], "--tasks", cost_files["tasks"]],
        *["--calls", cost_files["calls"], "--plot", tmp_path / "run", "--output-json", out],
    )
    assert code == 0, err
    picks = reference_picks(backbone_dir, theta, [task["prompt"] for task in tasks])
    matrices = by_hand(rewards, calls)
    expected = expected_points(matrices, {"router": picks})
    record = json.loads(out.read_text())
    stored = record["cost_frontier"]
    check_points(stored, expected)
    assert stored["rows"] == 14 and stored["folds"] == 1 and stored["repeats"] == 1
    assert stored["points"][0]["name"] == "router" and stored["points"][0]["cost_weight"] is None
    assert record["router"] == pytest.approx(expected["router"]["reward"], abs=1e-12)
    assert record["picks"] == {agent: int((picks == j).sum()) for j, agent in enumerate(AGENTS)}
    oracle = {p["name"]: p for p in stored["points"]}["oracle (cheapest best)"]
    R, C = matrices["R"], matrices["C"]
    best = R.max(axis=1, keepdims=True) - 1e-9 <= R
    assert oracle["reward"] == pytest.approx(R.max(axis=1).mean())
    assert oracle["cost_per_1k"] == pytest.approx(np.where(best, C, np.inf).min(axis=1).mean())
    assert not any(p["kind"] == "best_fixed_train" for p in stored["points"])  # nothing is held out here
    window = (min(C.mean(axis=0)), max(C.mean(axis=0)))
    fixed = [(expected[f"always {a}"]["cost_per_1k"], expected[f"always {a}"]["reward"]) for a in AGENTS]
    router = (expected["router"]["cost_per_1k"], expected["router"]["reward"])
    assert stored["aiq"]["fixed agents"] == pytest.approx(fr.area_under_frontier(fixed, *window))
    assert stored["aiq"]["router + fixed agents"] == pytest.approx(fr.area_under_frontier([*fixed, router], *window))
    assert "in-sample" in stored["evaluation"] and stored["calls"] == str(cost_files["calls"])
    # the quality-cost gap between the cheapest and the best agent, recomputed by hand
    gap = record["routing_gap"]["pool"]
    quality, price = R.mean(axis=0), C.mean(axis=0)
    cheap = np.flatnonzero(price <= price.min() + 1e-12)
    cheapest = int(cheap[np.argmax(quality[cheap])])
    top = np.flatnonzero(quality >= quality.max() - 1e-12)
    best = int(top[np.argmin(price[top])])
    if cheapest == best:  # the cheapest agent is also the best: no gap, one note
        assert gap == {
            "note": f"the cheapest agent ({AGENTS[best]}) is also the best: there is no quality gap to recover."
        }
        assert "quality-cost gap: none" in printed
    else:
        assert (gap["cheapest"], gap["best"]) == (AGENTS[cheapest], AGENTS[best])
        x = (expected["router"]["cost_per_1k"] - price[cheapest]) / (price[best] - price[cheapest])
        y = (expected["router"]["reward"] - quality[cheapest]) / (quality[best] - quality[cheapest])
        if 0 <= x <= 1:
            assert gap["policies"]["router"]["apgr"] == pytest.approx(0.5 * x * y + 0.5 * (1 - x) * (y + 1))
        assert gap["policies"]["random"]["apgr"] == pytest.approx(0.5)
        assert gap["policies"]["oracle"]["apgr"] >= gap["policies"]["router"]["apgr"]
        assert "quality against cost, gap from the cheapest agent" in printed
        assert (tmp_path / "run-gap.png").read_bytes()[:4] == b"\x89PNG"

    header = printed[printed.index("cost and latency of ") :].splitlines()
    assert "no cross-validation" in header[1] and "rows the router was trained on" in header[1]
    line = next(line for line in header if line.startswith("router "))
    r = expected["router"]
    assert line.split()[:2] == ["router", f"{r['reward']:.4f}"]
    assert line.split()[6:8] == [f"{r['cost_per_1k']:.4f}", f"{r['latency_s']:.2f}"]
    assert any(line.startswith("AIQ ") and "router + fixed agents" in line for line in header)
    for name in ("cost", "latency"):
        assert (tmp_path / f"run-{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_operating_point_is_reported_with_its_weights(
    operating_router, backbone_dir, cost_files, tmp_path, capsys
):
    from conftest import OPERATING_POINTS

    folder, thetas = operating_router
    rewards, tasks, calls = cost_files["rows"]
    common = ["--model", folder, "--rewards", cost_files["rewards"], "--tasks", cost_files["tasks"]]
    out = tmp_path / "evaluation.json"
    code, printed, err = run_evaluate(capsys, *common, "--calls", cost_files["calls"], "--output-json", out)
    assert code == 0, err
    prompts = [task["prompt"] for task in tasks]
    picks = {f"router {name}": reference_picks(backbone_dir, theta, prompts) for name, theta in thetas.items()}
    matrices = by_hand(rewards, calls)
    expected = expected_points(matrices, picks)
    record = json.loads(out.read_text())
    stored = record["cost_frontier"]
    check_points(stored, expected)
    points = {p["name"]: p for p in stored["points"]}
    for name, (cost_weight, latency_weight) in OPERATING_POINTS.items():
        assert (points[f"router {name}"]["cost_weight"], points[f"router {name}"]["latency_weight"]) == (
            cost_weight,
            latency_weight,
        )
        assert f"router {name} + fixed agents" in stored["aiq"]
        assert record["operating_points"][name]["router"] == pytest.approx(expected[f"router {name}"]["reward"])
        assert f"evaluation of {folder} at operating point '{name}' (14 rows)" in printed
        assert any(line.startswith(f"router {name} ") for line in printed.splitlines())
    assert stored["operating_points"] == {name: f"router {name}" for name in OPERATING_POINTS}
    assert record["operating_point"] == "balanced"
    assert record["router"] == record["operating_points"]["balanced"]["router"]

    code, printed, err = run_evaluate(
        capsys, *common, "--calls", cost_files["calls"], "--operating-point", "fast", "--output-json", out
    )
    assert code == 0, err
    record = json.loads(out.read_text())
    assert [p["name"] for p in record["cost_frontier"]["points"] if p["kind"] == "router"] == ["router fast"]
    assert record["operating_point"] == "fast" and list(record["operating_points"]) == ["fast"]
    # the frontier marks and the AIQ are those of the evaluated point alone
    alone = expected_points(matrices, {"router fast": picks["router fast"]})
    assert record["router"] == pytest.approx(alone["router fast"]["reward"], abs=1e-12)
    check_points(record["cost_frontier"], alone)


def test_a_call_without_cost_is_priced_from_the_pool_and_only_evaluated_tasks_need_calls(
    converted, backbone_dir, cost_files, tmp_path, capsys
):
    folder, theta = converted[0]
    rewards, tasks, calls = cost_rows()
    del calls[0]["calls"][0]["cost_usd"]
    calls_file = write_jsonl(tmp_path / "calls.jsonl", calls)
    pool = tmp_path / "agents.json"
    pool.write_text(json.dumps(POOL))
    common = ["--model", folder, "--rewards", cost_files["rewards"], "--tasks", cost_files["tasks"]]
    out = tmp_path / "evaluation.json"
    code, _, err = run_evaluate(capsys, *common, "--calls", calls_file, "--output-json", out)
    assert code == 2 and err.strip().splitlines()[-1].startswith("error: calls file ") and "pass the pool file" in err
    code, printed, err = run_evaluate(capsys, *common, "--calls", calls_file, "--pool", pool, "--output-json", out)
    assert code == 0, err
    prices = {row["agent_id"]: (row["price_per_1m_prompt_usd"], row["price_per_1m_output_usd"]) for row in POOL}
    picks = reference_picks(backbone_dir, theta, [task["prompt"] for task in tasks])
    stored = json.loads(out.read_text())["cost_frontier"]
    check_points(stored, expected_points(by_hand(rewards, calls, prices), {"router": picks}))
    assert "note: 1 calls had no cost_usd; estimated from the pool prices" in printed

    test_rows = [i for i, row in enumerate(rewards) if row["split"] == "test"]
    only_test = write_jsonl(tmp_path / "test-calls.jsonl", [calls[i] for i in test_rows])
    code, _, err = run_evaluate(capsys, *common, "--calls", only_test, "--split", "test", "--output-json", out)
    assert code == 0, err
    stored = json.loads(out.read_text())["cost_frontier"]
    assert stored["rows"] == len(test_rows) == 4
    expected = expected_points(
        by_hand([rewards[i] for i in test_rows], [calls[i] for i in test_rows]), {"router": picks[test_rows]}
    )
    check_points(stored, expected)

    order = [4, 2, 0, 3, 1]  # the same rewards with the pool listed in another order
    shuffled = [
        {**row, "agent_order": [AGENTS[i] for i in order], "mean_reward": [row["mean_reward"][i] for i in order]}
        for row in rewards
    ]
    other_order = ["--rewards", write_jsonl(tmp_path / "shuffled.jsonl", shuffled), "--tasks", cost_files["tasks"]]
    code, _, err = run_evaluate(
        capsys, "--model", folder, *other_order, "--calls", cost_files["calls"], "--output-json", out
    )
    assert code == 0, err
    stored = json.loads(out.read_text())["cost_frontier"]
    assert stored["agents"] == AGENTS  # the router's order
    check_points(stored, expected_points(by_hand(rewards, cost_files["rows"][2]), {"router": picks}))


@pytest.mark.slow
def test_bad_cost_input_is_one_line_and_exit_2(converted, operating_router, cost_files, tmp_path, capsys):
    calls = cost_files["rows"][2]
    single = ["--model", converted[0][0], "--rewards", cost_files["rewards"], "--tasks", cost_files["tasks"]]
    points = ["--model", operating_router[0], "--rewards", cost_files["rewards"], "--tasks", cost_files["tasks"]]
    short = write_jsonl(tmp_path / "short.jsonl", calls[:-1])
    wrong = [dict(row) for row in calls]
    wrong[2] = {**wrong[2], "calls": [{**call, "correct": not call["correct"]} for call in wrong[2]["calls"]]}
    wrong_file = write_jsonl(tmp_path / "wrong.jsonl", wrong)
    out = tmp_path / "evaluation.json"
    cases = [
        (
            [*single, "--calls", tmp_path / "missing.jsonl"],
            f"error: --calls {tmp_path / 'missing.jsonl'} not found; pass the raw per-call JSONL file "
            "(rewards.v1-pilot.jsonl format).",
        ),
        ([*single, "--calls", tmp_path], f"error: --calls {tmp_path} is a folder; pass the raw per-call JSONL file"),
        ([*single, "--calls", short], f"error: 1 labelled tasks have no row in the calls file {short} (e.g. 't13')"),
        ([*single, "--calls", wrong_file], "error: task 't2': the labelled rewards"),
        (
            [*points, "--calls", cost_files["calls"], "--operating-point", "cheap"],
            "error: operating_point 'cheap' is not one of this router's: balanced, fast, quality.",
        ),
        ([*single, "--operating-point", "fast"], "error: this router has a single head and no operating points"),
        (
            [*single, "--calls", cost_files["calls"], "--plot", tmp_path / "nowhere" / "run"],
            f"error: --plot folder {tmp_path / 'nowhere'} does not exist; create it or pass another prefix.",
        ),
        ([*single, "--plot", tmp_path / "run"], "error: --plot needs --calls"),
        ([*single, "--pool", tmp_path / "agents.json"], "error: --pool needs --calls"),
        ([*single, "--calls", cost_files["calls"], "--pool", tmp_path / "none.json"], "error: --pool"),
    ]
    for args, message in cases:
        code, _, err = run_evaluate(capsys, *args, "--output-json", out)
        assert code == 2, (args, err)
        # in-process, transformers' load bars share stderr; run as a command the error is the one line
        assert [line for line in err.splitlines() if "error" in line] == [err.strip().splitlines()[-1]]
        assert err.strip().splitlines()[-1].startswith(message), (message, err)
        assert not out.exists() and not list(tmp_path.glob("run-*.png"))
    as_a_user = run_tool("evaluate", *points, "--calls", cost_files["calls"], "--operating-point", "cheap")
    assert as_a_user.returncode == 2 and as_a_user.stderr.strip() == cases[4][1]


@pytest.mark.slow
@pytest.mark.skipif(not (PILOT / "rewards.v1-pilot.jsonl").exists(), reason=NO_PILOT)
def test_default_router_on_the_pilot_data_reports_the_fixed_agents(tmp_path, capsys):
    out = tmp_path / "evaluation.json"
    # Every 8th pilot task (139 of 1,110): the same paths and figures, an eighth of the prompts to embed.
    sample = tmp_path / "tasks.jsonl"
    sample.write_text("".join((PILOT / "tasks.v1.jsonl").read_text(encoding="utf-8").splitlines(True)[::8]))
    code, printed, err = run_evaluate(
        capsys,
        *["--rewards", PILOT / "rewards.jsonl", "--tasks", sample],
        *["--calls", PILOT / "rewards.v1-pilot.jsonl", "--pool", PILOT / "agents.json", "--output-json", out],
    )
    assert code == 0, err
    record = json.loads(out.read_text())
    stored = record["cost_frontier"]
    tasks = {row["task_id"] for row in map(json.loads, sample.open())}
    assert len(tasks) > 100
    published = [row for row in map(json.loads, (PILOT / "rewards.jsonl").open()) if row["task_id"] in tasks]
    raw = {row["task_id"]: row for row in map(json.loads, (PILOT / "rewards.v1-pilot.jsonl").open())}
    points = {p["name"]: p for p in stored["points"]}
    assert stored["rows"] == len(published) and record["rows"] == len(published)
    means = {}
    for agent in AGENTS:
        column = [row["mean_reward"][row["agent_order"].index(agent)] for row in published]
        cost = [
            1000 * np.mean([c["cost_usd"] for c in raw[row["task_id"]]["calls"] if c["agent"] == agent])
            for row in published
        ]
        assert points[f"always {agent}"]["reward"] == pytest.approx(np.mean(column), abs=1e-12)
        assert points[f"always {agent}"]["cost_per_1k"] == pytest.approx(np.mean(cost), abs=1e-12)
        line = next(line for line in printed.splitlines() if line.startswith(f"always {agent} "))
        assert line.split()[2] == f"{np.mean(column):.4f}"
        means[agent] = (np.mean(column), -np.mean(cost))
    # The reference is the best agent on reward alone, the cheaper of a tie.
    best = max(reward for reward, _ in means.values())
    tied = [agent for agent, (reward, _) in means.items() if reward >= best - 1e-9]
    assert stored["reference"] == f"always {max(tied, key=lambda agent: means[agent][1])}"
    router = [p for p in stored["points"] if p["kind"] == "router"]
    assert len(router) == max(1, len(record.get("operating_points", {})))
    if "operating_points" not in record:
        assert router[0]["reward"] == pytest.approx(record["router"], abs=1e-12)
        assert sum(router[0]["share"].values()) == pytest.approx(1.0)
