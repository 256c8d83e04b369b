"""`benchgen-router train` as users run it: a full run on the real pilot data with a tiny backbone,
the manifest, the round trip into the converter and the pipeline, the embedding cache, the reference
trainer's config file, and every bad input (one line, exit 2, nothing written)."""

from __future__ import annotations

import json
from importlib.util import find_spec

import numpy as np
import pytest

from benchgen_router.data import join_rewards
from benchgen_router.head import head_picks
from benchgen_router.loading import load_router
from benchgen_router.routing import run_router
from helpers import (
    AGENTS,
    NO_PILOT,
    PILOT,
    call_record,
    calls_row,
    cli,
    pilot_data,
    run_in_process,
    synthetic_rows,
    write_jsonl,
)

# docs/reference.md, "manifest.json": the keys the reference trainer writes (literally, not the package's list).
REFERENCE_KEYS = {
    "model_id",
    "backbone_model",
    "rewards_dataset",
    "agent_order",
    "embedding_dim",
    "head_hidden_dim",
    "n_head_params",
    "n_total",
    "n_train",
    "n_test",
    "train_reward",
    "test_reward",
    "baselines",
    "beats_best_fixed_agent",
    "cma_generations_run",
    "history",
    "duration_seconds",
}
needs_pilot = pytest.mark.skipif(not (PILOT / "rewards.jsonl").exists(), reason=NO_PILOT)


# ---------------------------------------------------------------------------------------------
# A full run on the real pilot data, with the tiny backbone


@pytest.fixture(scope="module")
def pilot_run(tmp_path_factory, backbone_dir):
    if not (PILOT / "rewards.jsonl").exists():
        pytest.skip(f"real pilot data not found at {PILOT} (CI has it)")
    folder = tmp_path_factory.mktemp("pilot-run")
    note = folder / "note.md"
    note.write_text("## Demonstration\n\nA test note.\n")
    args = [
        "--rewards",
        PILOT / "rewards.jsonl",
        "--tasks",
        PILOT / "tasks.v1.jsonl",
        "--backbone",
        backbone_dir,
        "--backbone-id",
        "test-org/tiny-qwen3",
        "--rewards-id",
        "benchgen/router-pilot",
        "--output-dir",
        folder / "out",
        "--export",
        folder / "router",
        "--card-note",
        f"@{note}",
        "--cache-dir",
        folder / "cache",
        "--no-progress",
    ]
    result = run_in_process("train", *args)
    assert result.returncode == 0, result.stderr
    return folder, result, args


@pytest.mark.slow
@needs_pilot
def test_full_pilot_run_writes_the_reference_manifest(pilot_run):
    folder, _, _ = pilot_run
    manifest = json.loads((folder / "out" / "manifest.json").read_text())
    assert manifest.keys() >= REFERENCE_KEYS
    assert (manifest["n_total"], manifest["n_train"], manifest["n_test"]) == (46, 35, 11)
    assert manifest["backbone_model"] == "test-org/tiny-qwen3"
    assert manifest["rewards_dataset"] == "benchgen/router-pilot"
    assert manifest["embedding_dim"] == 32 and manifest["n_head_params"] == 32 * 5 + 5
    assert manifest["cma_generations_run"] == 60 and len(manifest["history"]) == 60
    assert manifest["cma"] == {"library": "pycma", "sigma0": 0.5, "seed": 42, "popsize": 19, "generations": 60}
    assert [round(manifest["baselines"][k], 4) for k in ("best_fixed_agent", "random_agent", "oracle")] == [
        0.7879,
        0.6364,
        0.8485,
    ]
    theta = np.load(folder / "out" / "head_weights.npy", allow_pickle=False)
    assert theta.dtype == np.float64 and theta.shape == (165,)

    evaluation = manifest["evaluation"]
    assert evaluation["router"] == manifest["test_reward"] and sum(evaluation["picks"].values()) == 11
    best, oracle = evaluation["best_fixed_agent"], evaluation["oracle"]
    assert evaluation["headroom_share"] == pytest.approx((evaluation["router"] - best) / (oracle - best))
    assert manifest["beats_best_fixed_agent"] == (manifest["test_reward"] > manifest["baselines"]["best_fixed_agent"])

    cv = manifest["cross_validation"]
    assert cv["folds"] == 5 and sum(fold["rows"] for fold in cv["per_fold"]) == 46
    routers = [fold["router"] for fold in cv["per_fold"]]
    assert cv["router_mean"] == pytest.approx(np.mean(routers))
    assert cv["router_std"] == pytest.approx(np.std(routers, ddof=1))
    assert all(fold["best_fixed"] <= fold["oracle"] for fold in cv["per_fold"])


@needs_pilot
def test_full_pilot_run_prints_a_well_formed_table(pilot_run):
    folder, result, _ = pilot_run
    manifest = json.loads((folder / "out" / "manifest.json").read_text())
    lines = result.stdout.splitlines()
    start = lines.index("held-out evaluation (11 rows)")
    table = dict(line.rsplit(None, 1) for line in lines[start + 3 : start + 8 + len(AGENTS)])
    table = {name.strip(): value for name, value in table.items()}
    assert float(table["router"]) == round(manifest["test_reward"], 4)
    assert table["best fixed agent (frontier_a)"] == "0.7879"
    assert table["uniform random agent"] == "0.6364" and table["per-question oracle"] == "0.8485"
    assert sum(int(table[f"picks: {agent}"]) for agent in AGENTS) == 11
    assert any(line.startswith("5-fold cross-validation over 46 labelled rows") for line in lines)
    if not manifest["beats_best_fixed_agent"]:
        assert "warning: the head does not beat the best fixed agent" in result.stderr


@needs_pilot
def test_trainer_output_round_trips_through_convert_into_the_pipeline(pilot_run, backbone_dir):
    """Trainer -> convert_npy (via --export) -> text-classification pipeline: the pipeline's picks
    are the numpy head's picks on the trainer's own (cached) embeddings."""
    from transformers import pipeline

    folder, _, _ = pilot_run
    theta = np.load(folder / "out" / "head_weights.npy")
    # the cache holds the labelled prompts (46), the whole task pool (the guard's) and the OOD query set
    (cached,) = [path for path in (folder / "cache").glob("*.npy") if np.load(path).shape[0] == 46]
    embeddings = np.load(cached, allow_pickle=False).astype(np.float64)
    data = pilot_data("rewards.jsonl")
    numpy_picks = [AGENTS[i] for i in head_picks(theta, embeddings, len(AGENTS), 0)]

    router = pipeline(
        "text-classification",
        model=str(folder / "router"),
        trust_remote_code=True,
        model_kwargs={"backbone_name_or_path": str(backbone_dir)},
    )
    assert [out["label"] for out in router(data.prompts, batch_size=8)] == numpy_picks

    config = json.loads((folder / "router" / "config.json").read_text())
    assert config["backbone_name_or_path"] == "test-org/tiny-qwen3"  # the recorded id, not the local path
    card = (folder / "router" / "README.md").read_text()
    assert card.split("<!-- end of router card -->")[0].rstrip().endswith("A test note.")
    assert "5-fold CV reward: router" in card


@pytest.mark.slow
@needs_pilot
def test_rerun_reads_the_embedding_cache_and_reproduces_the_head(pilot_run, tmp_path):
    folder, _, args = pilot_run
    out = tmp_path / "again"
    rerun = [
        *args[: args.index("--output-dir")],
        "--output-dir",
        out,
        "--cache-dir",
        folder / "cache",
        "--cv-folds",
        "0",
        "--no-ood-guard",
        "--no-progress",
    ]
    cached = sorted((folder / "cache").glob("*.npy"))
    result = run_in_process("train", *rerun)
    assert result.returncode == 0, result.stderr
    assert "read from cache" in result.stderr and sorted((folder / "cache").glob("*.npy")) == cached
    # the guard does not touch the search: the same head with or without it
    assert np.array_equal(np.load(out / "head_weights.npy"), np.load(folder / "out" / "head_weights.npy"))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["cross_validation"] is None and "ood_guard" not in manifest
    assert not (out / "ood_guard.safetensors").exists() and "out-of-distribution guard" not in result.stdout


@needs_pilot
def test_guard_is_fitted_on_the_whole_task_pool_and_exported(pilot_run):
    from benchgen_router import ood

    folder, result, _ = pilot_run
    manifest = json.loads((folder / "out" / "manifest.json").read_text())
    record = manifest["ood_guard"]
    assert (record["n_prompts"], record["n_calibration"], record["n_plain_calibration"]) == (1110, 333, 350)
    assert record["n_outside"] == 1000 and record["n_fit"] > 1110  # views of 777 prompts and 350 typed questions
    # conformal ranks ceil((n + 1) q): each calibration set keeps at least that many, whatever the CPU
    assert record["keep_share"] == 0.95 and record["calibration_kept_share"] >= 318 / 333
    assert record["plain_keep_share"] == 0.9 and record["plain_calibration_kept_share"] >= 316 / 350
    assert record["fallback_agent"] == "frontier_b"  # the best fixed agent on the 35 training rows
    assert manifest["query_format"]["labels"] == ["Problem: ", "Question: "]
    assert {"labelled_formatted_flagged_share", "labelled_plain_flagged_share"} <= set(record)
    guard = ood.load_guard(folder / "out" / record["file"], embedding_dim=32)
    assert guard.threshold == record["threshold"] and guard.metadata["backbone"] == "test-org/tiny-qwen3"
    assert guard.discriminative
    evaluation = record["evaluation"]
    assert evaluation["ood_queries_file"] == "ood_queries.jsonl" and evaluation["in_distribution_count"] == 333
    assert set(evaluation["groups"]) >= {"german", "code_tooling", "benchmark_style_templated"}
    assert f"out-of-distribution guard: threshold {record['threshold']:.4f}" in result.stdout
    config = json.loads((folder / "router" / "config.json").read_text())
    assert config["ood_threshold"] == record["threshold"] and config["ood_fallback_agent"] == "frontier_b"
    assert config["ood_discriminative"] is True and config["query_format"] == manifest["query_format"]
    assert "ood_calibration" not in config and len(json.dumps(config)) < 8_000  # lean: the record is the report's
    report = json.loads((folder / "router" / "training_report.json").read_text())
    assert report["ood_guard"]["evaluation"] == evaluation and report["n_train"] == manifest["n_train"]
    card = (folder / "router" / "README.md").read_text()
    assert "## Out-of-distribution guard" in card and f"{record['calibration_kept_share']:.4f}" in card


# ---------------------------------------------------------------------------------------------
# Config file, MLP head, export of an MLP head


def test_reference_config_file_with_an_mlp_head(tmp_path, backbone_dir):
    rewards, tasks = synthetic_rows(20, seed=2)
    for row in tasks[:5]:
        row["split"] = "validation"
    config = {
        "model_id": "head-from-config",
        "model": str(backbone_dir),
        "rewards_dataset": str(write_jsonl(tmp_path / "rewards.jsonl", rewards)),
        "tasks_path": str(write_jsonl(tmp_path / "tasks.jsonl", tasks)),
        "test_split": "validation",
        "head_hidden_dim": 4,
        "cma_seed": 7,
        "cma_sigma0": 0.3,
        "cma_generations": 9,
        "cma_population_size": 8,
        "device": "cpu",
        "output_dir": str(tmp_path / "out"),
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    code = cli(
        "train",
        *[
            "--config",
            str(tmp_path / "config.json"),
            "--generations",
            "5",
            "--cv-folds",
            "3",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--export",
            str(tmp_path / "router"),
            "--no-progress",
        ],
    )
    assert code == 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["model_id"] == "head-from-config" and manifest["n_test"] == 5 and manifest["n_train"] == 15
    assert manifest["head_hidden_dim"] == 4 and manifest["n_head_params"] == 32 * 4 + 4 + 4 * 5 + 5
    assert manifest["cma"] == {"library": "pycma", "sigma0": 0.3, "seed": 7, "popsize": 8, "generations": 5}
    assert manifest["cma_generations_run"] == 5  # the command line wins over the file
    assert manifest["cross_validation"]["folds"] == 3

    # the exported MLP router picks what the numpy head picks
    data = join_rewards(rewards, tasks)
    model, tokenizer = load_router(tmp_path / "router", backbone=str(backbone_dir))
    logits, embeddings = run_router(model, tokenizer, data.prompts)
    theta = np.load(tmp_path / "out" / "head_weights.npy")
    assert np.array_equal(logits.argmax(1), head_picks(theta, embeddings.astype(np.float64), 5, 4))


def test_warns_when_the_head_cannot_beat_the_best_fixed_agent(tmp_path, backbone_dir, caplog):
    rewards, tasks = synthetic_rows(12, seed=4)
    for row in rewards:  # open_mid always succeeds alone: there is no routing headroom at all
        row["mean_reward"] = [0.0, 0.0, 0.0, 1.0, 0.0]
    args = [
        "--rewards",
        str(write_jsonl(tmp_path / "r.jsonl", rewards)),
        "--tasks",
        str(write_jsonl(tmp_path / "t.jsonl", tasks)),
        "--backbone",
        str(backbone_dir),
        "--output-dir",
        str(tmp_path / "out"),
        "--generations",
        "3",
        "--cv-folds",
        "0",
        "--no-cache",
        "--no-progress",
    ]
    with caplog.at_level("WARNING"):
        assert cli("train", *args) == 0
    assert "does not beat the best fixed agent (open_mid, 1.0000)" in caplog.text
    assert "no out-of-distribution guard: 12 task prompts cannot calibrate" in caplog.text  # too few, not an error
    assert not (tmp_path / "out" / "ood_guard.safetensors").exists()
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["evaluation"]["headroom_share"] is None and manifest["beats_best_fixed_agent"] is False


# ---------------------------------------------------------------------------------------------
# Bad input: one line, exit 2, nothing written


def _break(kind: str, rewards: list[dict], tasks: list[dict]) -> str:
    """Damage the synthetic data as `kind` says; returns the text the error line must contain."""
    if kind == "agent_order":
        rewards[3]["agent_order"] = list(reversed(AGENTS))
        return "rewards row 4 (t3) has agent_order"
    if kind == "few_rows":
        del tasks[5:]
        return "only 5 reward rows join a task prompt"
    if kind == "width":
        rewards[2]["mean_reward"] = rewards[2]["mean_reward"][:4]
        return "has 4 mean_reward values for 5 agents"
    if kind == "range":
        rewards[1]["mean_reward"][0] = 1.5
        return "rewards must lie in [0, 1]"
    if kind == "prompt":
        del tasks[6]["prompt"]
        return "task 't6' has no prompt text"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["agent_order", "few_rows", "width", "range", "prompt"])
def test_bad_data_stops_with_one_line(kind, tmp_path, backbone_dir, capsys):
    rewards, tasks = synthetic_rows(14)
    expected = _break(kind, rewards, tasks)
    code = cli(
        "train",
        *[
            "--rewards",
            str(write_jsonl(tmp_path / "r.jsonl", rewards)),
            "--tasks",
            str(write_jsonl(tmp_path / "t.jsonl", tasks)),
            "--backbone",
            str(backbone_dir),
            "--output-dir",
            str(tmp_path / "out"),
        ],
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: ") and expected in err[-1]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            ["--test-split", "holdout"],
            "error: no joined row has split 'holdout' (splits present: ['test', 'train']); "
            "pass one of those as --test-split.",
        ),
        (["--cv-folds", "1"], "error: --cv-folds must be 0 (skip) or at least 2."),
        (["--popsize", "2"], "error: popsize must be at least 4 candidates per generation, got 2."),
        (["--seed", "-1"], "error: seed must be an integer from 0 to 4294967295, got -1."),
        (["--sigma0", "1e308"], "error: sigma0 must be a positive step size no larger than 1e6, got 1e+308."),
    ],
)
def test_bad_options_stop_with_one_line(extra, expected, tmp_path, backbone_dir, capsys):
    rewards, tasks = synthetic_rows(14)
    args = [
        "--rewards",
        str(write_jsonl(tmp_path / "r.jsonl", rewards)),
        "--tasks",
        str(write_jsonl(tmp_path / "t.jsonl", tasks)),
        "--backbone",
        str(backbone_dir),
        "--output-dir",
        str(tmp_path / "out"),
        *extra,
    ]
    assert cli("train", *args) == 2
    assert capsys.readouterr().err.strip().splitlines() == [expected]
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(find_spec("datasets") is not None, reason="the datasets package is installed here")
def test_hub_dataset_id_without_datasets_package_is_one_clear_line(tmp_path):
    result = run_in_process(
        "train",
        "--rewards",
        "benchgen/router-pilot",
        "--tasks",
        "benchgen/router-pilot-tasks",
        "--output-dir",
        tmp_path / "out",
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: rewards 'benchgen/router-pilot' is not a local file and reading Hub datasets needs the `datasets` "
        "package; pass a local JSONL file (or pip install datasets)."
    ]
    assert not (tmp_path / "out").exists()


def test_bad_config_value_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"cma_generations": "sixty", "rewards_dataset": "r.jsonl"}))
    result = run_in_process("train", "--config", tmp_path / "config.json")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: config file {tmp_path / 'config.json'}: 'cma_generations' must be an integer, got 'sixty'."
    ]


# ---------------------------------------------------------------------------------------------
# Cost and latency: operating points, the frontier, target mode


def value_rows(count: int = 20, seed: int = 3) -> tuple[list[dict], list[dict], list[dict]]:
    """(reward rows, task rows, raw call rows): frontier_a and open_cheap_reasoning are right on every
    task, open_mid on none, the others at random; one call per task and agent, open_cheap_reasoning ten
    times cheaper than frontier_a."""
    rewards, tasks = synthetic_rows(count, seed)
    rng = np.random.default_rng(seed)
    prices = {
        "frontier_a": 2e-4,
        "frontier_b": 3e-4,
        "frontier_c": 1e-4,
        "open_mid": 1e-5,
        "open_cheap_reasoning": 2e-5,
    }
    calls = []
    for row in rewards:
        correct = [
            agent in ("frontier_a", "open_cheap_reasoning") or bool(rng.integers(0, 2) * (agent != "open_mid"))
            for agent in AGENTS
        ]
        records = [call_record(agent, ok, prices[agent]) for agent, ok in zip(AGENTS, correct, strict=True)]
        calls.append(calls_row(row["task_id"], AGENTS, records))
        row["mean_reward"] = calls[-1]["mean_reward"]
    return rewards, tasks, calls


@pytest.fixture(scope="module")
def value_run(tmp_path_factory, backbone_dir):
    """A run with two operating points (reward only, and cost-heavy) and a plain run of the same data."""
    folder = tmp_path_factory.mktemp("value-run")
    rewards, tasks, calls = value_rows()
    common = [
        "--rewards", write_jsonl(folder / "r.jsonl", rewards), "--tasks", write_jsonl(folder / "t.jsonl", tasks),
        "--backbone", backbone_dir, "--generations", "8", "--no-ood-guard", "--no-progress",
        "--cache-dir", folder / "cache",
    ]  # fmt: skip
    plain = run_in_process("train", *common, "--output-dir", folder / "plain", "--cv-folds", "0")
    assert plain.returncode == 0, plain.stderr
    args = [
        *common, "--output-dir", folder / "out", "--export", folder / "router", "--calls",
        write_jsonl(folder / "calls.jsonl", calls), "--operating-point", "quality=0",
        "--operating-point", "thrifty=5", "--default-operating-point", "thrifty", "--cv-folds", "2",
        "--cv-repeats", "2",
    ]  # fmt: skip
    result = run_in_process("train", *args)
    assert result.returncode == 0, result.stderr
    return folder, result, args


@pytest.mark.slow
def test_operating_points_train_one_head_each_and_zero_weight_is_todays_head(value_run):
    from safetensors.numpy import load_file

    folder, result, _ = value_run
    manifest = json.loads((folder / "out" / "manifest.json").read_text())
    heads = load_file(str(folder / "out" / "operating_heads.safetensors"))
    assert sorted(heads) == ["quality", "thrifty"]
    # weight 0 is the reference search: the same head as a run without costs, bit for bit
    assert np.array_equal(heads["quality"], np.load(folder / "plain" / "head_weights.npy"))
    # head_weights.npy is the default point's head, for readers of the reference format
    assert np.array_equal(np.load(folder / "out" / "head_weights.npy"), heads["thrifty"])
    assert manifest["default_operating_point"] == "thrifty"
    points = manifest["operating_points"]
    assert points["thrifty"]["cost_weight"] == 5 and points["quality"]["latency_weight"] == 0
    for name in ("quality", "thrifty"):
        assert {"reward", "reward_std_repeats", "delta_se", "cost_per_1k", "latency_s", "share"} <= set(
            points[name]["cv"]
        )
        assert points[name]["held_out"]["rows"] == 4
    # at cost weight 5 (0.1 reward per cent per 1,000 queries) the cheaper of the two always-right agents wins
    rewards, _, _ = value_rows()
    data = join_rewards(rewards, json.loads("[" + ",".join((folder / "t.jsonl").read_text().splitlines()) + "]"))
    model, tokenizer = load_router(folder / "router")
    _, vectors = run_router(model, tokenizer, data.prompts)
    thrifty = head_picks(heads["thrifty"], vectors.astype(np.float64), len(AGENTS), 0)
    assert (np.array(AGENTS)[thrifty] == "open_cheap_reasoning").mean() >= 0.9
    assert points["thrifty"]["cv"]["cost_per_1k"] < points["quality"]["cv"]["cost_per_1k"]
    assert "frontier" in manifest and manifest["frontier"]["repeats"] == 2 and manifest["cross_validation"] is None
    for png in ("frontier-cost.png", "frontier-latency.png"):
        assert (folder / "out" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "router lc5_ll0" in result.stdout and "always open_cheap_reasoning" in result.stdout
    assert "default operating point: thrifty" in result.stdout


def test_the_exported_router_serves_every_point_and_its_card_lists_them(value_run):
    from benchgen_router.routing import pick_agent

    folder, _, _ = value_run
    config = json.loads((folder / "router" / "config.json").read_text())
    assert config["operating_point"] == "thrifty" and set(config["operating_points"]) == {"quality", "thrifty"}
    manifest = json.loads((folder / "out" / "manifest.json").read_text())
    card = (folder / "router" / "README.md").read_text()
    assert "## Figures" in card and "`thrifty` (default): cost 5" in card
    assert set(config["operating_points"]["thrifty"]) <= {"cost_weight", "latency_weight", "ood_fallback_agent"}
    thrifty_cv = manifest["operating_points"]["thrifty"]["cv"]
    assert f"{thrifty_cv['reward']:.4f} ± {thrifty_cv['reward_std_repeats']:.4f}" in card
    assert "| always frontier_a |" in card and "operating_point=" in card
    query = "What is the derivative of x^3 + 2x?"
    default = pick_agent(query, model=folder / "router")
    assert default["operating_point"] == "thrifty"
    assert pick_agent(query, model=folder / "router", operating_point="quality")["operating_point"] == "quality"


@pytest.mark.slow
def test_target_mode_chooses_the_default_and_records_its_nested_estimate(tmp_path, backbone_dir):
    rewards, tasks, calls = value_rows()
    args = [
        "--rewards", write_jsonl(tmp_path / "r.jsonl", rewards), "--tasks", write_jsonl(tmp_path / "t.jsonl", tasks),
        "--calls", write_jsonl(tmp_path / "c.jsonl", calls), "--backbone", backbone_dir, "--generations", "4",
        "--no-ood-guard", "--no-progress", "--output-dir", tmp_path / "out", "--cv-folds", "2", "--cv-repeats", "1",
        "--operating-point", "quality=0", "--operating-point", "thrifty=5", "--target-eps", "0.05",
    ]  # fmt: skip
    result = run_in_process("train", *args)
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    target = manifest["target_mode"]
    # both agents are always right, so the cheap point is within any eps of the best fixed agent
    assert target["chosen"] == "thrifty" == manifest["default_operating_point"]
    assert 0 <= target["nested_cv"]["point"]["reward"] <= 1 and target["nested_cv"]["outer"] == "2x2-fold"
    assert "target mode (eps 0.05): chose 'thrifty'" in result.stdout


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--operating-point", "cheap=1"], "error: --operating-point train for cost and latency: pass --calls"),
        (["--calls", "CALLS", "--operating-point", "a=1", "--operating-point", "a=2"], "names repeat: ['a']"),
        (["--calls", "CALLS", "--operating-point", "a=1", "--operating-point", "b=1"], "have the same weights"),
        (["--calls", "CALLS", "--operating-point", "a=1", "--default-operating-point", "b"], "'b' is not one of"),
        (["--calls", "CALLS", "--operating-point", "a=1", "--target-eps", "0.01"], "give at least two"),
        (["--calls", "missing.jsonl"], "error: --calls missing.jsonl not found"),
        (["--pool", "CALLS"], "error: --pool prices calls: pass --calls with it."),
        (["--ensemble-seeds", "1,2", "--head-hidden-dim", "4"], "averages linear heads only"),
        (["--shrink", "1"], "must be a number in [0, 1)"),
    ],
)
def test_bad_cost_options_stop_with_one_line(extra, expected, tmp_path, backbone_dir, capsys):
    rewards, tasks, calls = value_rows(14)
    calls_file = str(write_jsonl(tmp_path / "c.jsonl", calls))
    args = [
        "--rewards", str(write_jsonl(tmp_path / "r.jsonl", rewards)),
        "--tasks", str(write_jsonl(tmp_path / "t.jsonl", tasks)),
        "--backbone", str(backbone_dir), "--output-dir", str(tmp_path / "out"),
        *[calls_file if item == "CALLS" else item for item in extra],
    ]  # fmt: skip
    assert cli("train", *args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("cheap", "NAME=COST[:LATENCY]"),
        ("=1", "NAME=COST[:LATENCY]"),
        ("a=x", "must be one number or a cost:latency pair"),
        ("a=1,2", "names more than one trade-off"),
        ("1a=1", "NAME=COST[:LATENCY]"),
        ("a=1e308", "must be one number or a cost:latency pair"),
        ("a=0:1e308", "must be one number or a cost:latency pair"),
    ],
)
def test_a_malformed_operating_point_is_an_argparse_error(value, words, tmp_path, capsys):
    assert cli("train", "--operating-point", value) == 2
    err = capsys.readouterr().err
    assert "argument --operating-point" in err and words in err and "'0,0.5,1'" not in err


@pytest.mark.slow
def test_a_run_into_an_earlier_runs_folder_leaves_none_of_its_files(tmp_path, backbone_dir):
    """--no-ood-guard into a folder where an earlier run left a guard, heads and plots: they are
    removed, so the export carries no stale guard; files of the user's own are kept."""
    rewards, tasks = synthetic_rows(20, seed=3)
    out = tmp_path / "out"
    out.mkdir()
    stale = ("ood_guard.safetensors", "operating_heads.safetensors", "frontier-cost.png", "frontier-latency.png")
    for name in (*stale, "notes.txt"):
        (out / name).write_text("an earlier run's file")
    args = [
        "--rewards", write_jsonl(tmp_path / "r.jsonl", rewards), "--tasks", write_jsonl(tmp_path / "t.jsonl", tasks),
        "--backbone", backbone_dir, "--generations", "2", "--cv-folds", "0", "--no-ood-guard", "--no-progress",
        "--output-dir", out, "--export", tmp_path / "router",
    ]  # fmt: skip
    result = run_in_process("train", *args)
    assert result.returncode == 0, result.stderr
    assert "Loading weights" not in result.stderr and "Writing model shards" not in result.stderr  # quiet
    assert sorted(p.name for p in out.iterdir()) == ["head_weights.npy", "manifest.json", "notes.txt"]
    config = json.loads((tmp_path / "router" / "config.json").read_text())
    assert config["ood_threshold"] is None and "ood_guard" not in json.loads((out / "manifest.json").read_text())


def test_a_probability_head_with_a_hidden_layer_stops_with_one_line(tmp_path, backbone_dir, capsys):
    rewards, tasks = synthetic_rows(14)
    args = [
        "--rewards",
        write_jsonl(tmp_path / "r.jsonl", rewards),
        "--tasks",
        write_jsonl(tmp_path / "t.jsonl", tasks),
    ]
    args += ["--backbone", backbone_dir, "--output-dir", tmp_path / "out", "--no-progress"]
    assert cli("train", *args, "--head-kind", "probability", "--head-hidden-dim", "4") == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --head-kind probability is one linear layer whose trade-off is chosen per request: drop "
        "--head-hidden-dim and --operating-point."
    ]
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------
# The rewards column trained on: collect's feedback_reward beside the judge's mean_reward


def test_reward_column_trains_on_the_named_column_and_records_it(tmp_path, backbone_dir, capsys):
    rewards, tasks = synthetic_rows(12, seed=5)
    for row in rewards:  # the measured rewards favour the fourth agent, users' feedback the first
        row["mean_reward"] = [0.0, 0.0, 0.0, 1.0, 0.0]
        row["feedback_reward"] = [1.0, 0.0, 0.0, 0.2, 0.0]
    args = [
        "--rewards",
        str(write_jsonl(tmp_path / "r.jsonl", rewards)),
        "--tasks",
        str(write_jsonl(tmp_path / "t.jsonl", tasks)),
        "--backbone",
        str(backbone_dir),
        "--generations",
        "3",
        "--cv-folds",
        "0",
        "--no-cache",
        "--no-progress",
        "--no-ood-guard",
    ]
    assert cli("train", *args, "--output-dir", tmp_path / "measured") == 0
    assert cli("train", *args, "--output-dir", tmp_path / "feedback", "--reward-column", "feedback_reward") == 0
    measured = json.loads((tmp_path / "measured" / "manifest.json").read_text())
    feedback = json.loads((tmp_path / "feedback" / "manifest.json").read_text())
    assert measured["evaluation"]["best_fixed_agent_id"] == AGENTS[3] and measured["baselines"]["oracle"] == 1.0
    assert feedback["evaluation"]["best_fixed_agent_id"] == AGENTS[0] and feedback["baselines"]["oracle"] == 1.0
    assert measured["baselines"]["random_agent"] == pytest.approx(1.0 / 5)
    assert feedback["baselines"]["random_agent"] == pytest.approx(1.2 / 5)
    assert measured["rewards_dataset"] == str(tmp_path / "r.jsonl")
    assert feedback["rewards_dataset"] == f"{tmp_path / 'r.jsonl'} (feedback_reward)"

    del rewards[4]["feedback_reward"]
    write_jsonl(tmp_path / "r.jsonl", rewards)
    capsys.readouterr()
    assert cli("train", *args, "--output-dir", tmp_path / "broken", "--reward-column", "feedback_reward") == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: rewards row 5 (t4) has no column 'feedback_reward'; pass a rewards file that has it "
        "(collect --from-journal writes feedback_reward), or another --reward-column."
    ]
    assert not (tmp_path / "broken").exists()
