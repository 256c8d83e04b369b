"""A probability head end to end: trained with `train --head-kind probability` on data whose right
decision is known, exported, loaded through the Auto classes with trust_remote_code=True (the Hub view),
and its picks under every trade-off rule checked against a literal numpy computation from the saved
files (config.json, model.safetensors) and the model's own embeddings."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from test_tradeoffs import literal_lambda, literal_tolerance
from transformers import AutoModel, AutoTokenizer, pipeline

from helpers import AGENTS, cli, make_queries, probability_training, run_tool

PRICES = {"frontier_a": 2e-3, "frontier_b": 3e-3, "frontier_c": 1e-3, "open_mid": 1e-4, "open_cheap_reasoning": 2e-4}


def easy(prompt: str) -> bool:
    """The known decision: open_cheap_reasoning answers the sums (and nothing else)."""
    return " plus " in prompt


def mixed_queries(count: int, seed: int) -> list[str]:
    """Every other query a short sum, the rest longer questions (helpers.make_queries)."""
    rng = np.random.default_rng(seed)
    long = make_queries(count, seed=seed)
    return [f"What is {rng.integers(2, 99)} plus {rng.integers(2, 99)}?" if i % 2 else long[i] for i in range(count)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, backbone_dir):
    """(run folder, exported router, prompts, train stdout): frontier_a right on every task,
    open_cheap_reasoning right on the easy ones only, the rest never."""
    folder = tmp_path_factory.mktemp("probability-run")
    prompts, result = probability_training(folder, backbone_dir, count=160, seed=11)
    return folder / "out", folder / "router", prompts, result.stdout


def saved_head(router) -> tuple[np.ndarray, np.ndarray, dict]:
    state = load_file(str(router / "model.safetensors"))
    return (
        state["head.weight"].astype(np.float64),
        state["head.bias"].astype(np.float64),
        json.loads((router / "config.json").read_text()),
    )


def saved_calibration(router) -> dict:
    """The budget rules' calibration as the folder stores it: sizes in config.json, values in model.safetensors."""
    state = load_file(str(router / "model.safetensors"))
    record = json.loads((router / "config.json").read_text())["tradeoff_calibration"]
    margins = state["tradeoff.margins"].astype(np.float64)
    assert margins.shape == (len(AGENTS), record["levels"]) and len(state["tradeoff.lambdas"]) == record["lambdas"]
    return {
        "rows": record["rows"],
        "margins": dict(zip(AGENTS, margins.tolist(), strict=True)),
        "lambdas": state["tradeoff.lambdas"].astype(np.float64).tolist(),
        "cost_per_1k": state["tradeoff.cost_per_1k"].astype(np.float64).tolist(),
    }


def test_training_writes_the_release_formats_and_reports_calibration(trained):
    run, router, _, stdout = trained
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["head_kind"] == "probability" and manifest["agent_order"] == AGENTS
    costs = manifest["agent_costs_per_1k"]  # one call a query: the price times 1,000
    assert costs == pytest.approx([PRICES[agent] * 1000 for agent in AGENTS])
    calibration = manifest["probability_head"]["held_out_calibration"]
    assert calibration["rows"] == 32 and 0 <= calibration["pooled"]["brier"] <= 0.25
    assert "Brier" in stdout and "ECE" in stdout and "predicted" in stdout
    theta = np.load(run / "head_weights.npy")
    weight, bias, config = saved_head(router)
    np.testing.assert_allclose(theta[: weight.size].reshape(weight.shape[1], -1).T, weight, rtol=1e-6)
    np.testing.assert_allclose(theta[weight.size :], bias, rtol=1e-6)
    assert config["head_kind"] == "probability" and config["agent_costs_per_1k"] == pytest.approx(costs)
    stored = saved_calibration(router)  # the trainer's calibration, in the weights file, config.json its sizes
    for agent in AGENTS:
        np.testing.assert_allclose(
            stored["margins"][agent], manifest["tradeoff_calibration"]["margins"][agent], atol=1e-6
        )
    np.testing.assert_allclose(stored["cost_per_1k"], manifest["tradeoff_calibration"]["cost_per_1k"], rtol=1e-6)
    assert set(config["tradeoff_calibration"]) == {"rows", "levels", "lambdas"}
    report = json.loads((router / "training_report.json").read_text())
    assert "held_out_calibration" in report["probability_head"]


def test_convert_of_the_run_folder_gives_the_exported_router(trained, backbone_dir, tmp_path):
    run, router, _, _ = trained
    args = ["--manifest", run / "manifest.json", "--weights", run / "head_weights.npy", "--backbone", backbone_dir]
    assert cli("convert", *args, "--output-dir", tmp_path / "converted") == 0
    converted, exported = (
        json.loads((folder / "config.json").read_text()) for folder in (tmp_path / "converted", router)
    )
    for key in ("head_kind", "agent_costs_per_1k", "tradeoff_calibration"):
        assert converted[key] == exported[key]
    tensors = {"head.weight", "head.bias", "tradeoff.margins", "tradeoff.lambdas", "tradeoff.cost_per_1k"}
    assert load_file(str(tmp_path / "converted" / "model.safetensors")).keys() == tensors
    for name, value in saved_calibration(tmp_path / "converted").items():
        assert value == saved_calibration(router)[name]


def test_every_rule_in_the_hub_view_matches_a_literal_computation(trained):
    _, router, prompts, _ = trained
    model = AutoModel.from_pretrained(router, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(router)
    weight, bias, config = saved_head(router)
    costs = np.array(config["agent_costs_per_1k"])
    batch = tokenizer(prompts[:40], return_tensors="pt", padding=True)
    with torch.inference_mode():
        plain = model(**batch)
    embeddings = plain.embeddings.double().numpy()
    p = 1 / (1 + np.exp(-(embeddings @ weight.T + bias)))
    np.testing.assert_array_equal(plain.picks.numpy(), p.argmax(axis=1))  # default: the most likely agent
    calibration = saved_calibration(router)
    expected = {
        "tolerance=0.05": literal_tolerance(p, costs, 0.05),
        "lambda=0.2": literal_lambda(p, costs, 0.2),
    }
    margins = np.array(calibration["margins"]["frontier_b"])  # budget=X: default agent, the most expensive
    mu = max(0.0, float(np.interp(0.75, np.linspace(0, 1, len(margins)), margins)))
    penalised = p.copy()
    penalised[:, AGENTS.index("frontier_b")] -= mu
    expected["budget=0.25"] = penalised.argmax(axis=1)
    lam = next(lam for lam, cost in zip(calibration["lambdas"], calibration["cost_per_1k"], strict=True) if cost <= 1.0)
    expected["usd-per-1k=1.0"] = literal_lambda(p, costs, lam)
    for rule, picks in expected.items():
        with torch.inference_mode():
            output = model(**batch, tradeoff=rule)
        np.testing.assert_array_equal(output.picks.numpy(), picks, err_msg=rule)
    # per query rules in one pass: each row is what its rule gives alone
    rules = list(expected) * 10
    with torch.inference_mode():
        mixed = model(**batch, tradeoff=rules)
    for row, rule in enumerate(rules):
        assert int(mixed.picks[row]) == int(expected[rule][row])
    # the known decision: within a tolerance, sums go to the cheap agent, the rest to frontier_a
    known = np.array([AGENTS.index("open_cheap_reasoning" if easy(q) else "frontier_a") for q in prompts[:40]])
    assert (literal_tolerance(p, costs, 0.2) == known).mean() >= 0.9


def test_the_pipeline_pick_agent_and_route_agree(trained):
    from benchgen_router.routing import pick_agent

    _, router, prompts, _ = trained
    queries = prompts[40:46]
    classifier = pipeline("text-classification", model=str(router), trust_remote_code=True)
    picks = pick_agent(queries, model=str(router), tradeoff="budget=0.3@frontier_a")
    for query, result in zip(queries, picks, strict=True):
        [top] = classifier(query, tradeoff="budget=0.3@frontier_a")  # transformers: a one-item list for a str
        assert top["label"] == result["picked_agent"]
        assert result["tradeoff"] == "budget=0.3@frontier_a"
        assert abs(sum(result["probabilities"].values()) - 1) > 1e-6 or len(AGENTS) == 1  # sigmoids, not a softmax
        scores = classifier(query, top_k=None, tradeoff="budget=0.3@frontier_a")
        assert {entry["label"]: entry["score"] for entry in scores} == pytest.approx(result["probabilities"], abs=1e-5)
    out = run_tool("route", "--model", router, "--tradeoff", "budget=0.3@frontier_a", *queries)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [result["picked_agent"] for result in picks]


def test_bad_spellings_and_cmaes_routers_get_one_line(trained, converted, capsys):
    from benchgen_router.errors import InputError
    from benchgen_router.routing import pick_agent

    _, router, prompts, _ = trained
    for bad in ("budget=30%", "speed=1", "budget=0.3@nobody", "lambda=-1"):
        with pytest.raises(InputError, match="tolerance=T") as info:
            pick_agent(prompts[0], model=str(router), tradeoff=bad)
        assert "\n" not in str(info.value)
    assert cli("route", "--model", router, "--tradeoff", "budget=2", prompts[0]) == 2
    assert "error: bad tradeoff 'budget=2'" in capsys.readouterr().err
    cmaes = converted[0][0]
    with pytest.raises(InputError, match="needs a probability head"):
        pick_agent(prompts[0], model=str(cmaes), tradeoff="budget=0.3")
    model = AutoModel.from_pretrained(cmaes, trust_remote_code=True)
    batch = AutoTokenizer.from_pretrained(cmaes)(prompts[:2], return_tensors="pt", padding=True)
    with pytest.raises(ValueError, match="operating_point"):
        model(**batch, tradeoff="budget=0.3")


def test_recalibrating_on_new_traffic_holds_the_budget_there(trained, tmp_path):
    from benchgen_router.loading import load_router
    from benchgen_router.routing import pick_agent, recalibrate

    _, router, _, _ = trained
    traffic = [q for q in mixed_queries(200, seed=99) if easy(q)]  # traffic unlike the training mix
    model, tokenizer = load_router(str(router))
    calibration = recalibrate(model, tokenizer, traffic[:60])
    assert calibration["rows"] == 60
    shares = [
        r["picked_agent"] == "open_cheap_reasoning"
        for r in pick_agent(traffic[:60], model=(model, tokenizer), tradeoff="budget=0.2@open_cheap_reasoning")
    ]
    assert np.mean(shares) <= 0.2 + 1 / 60
    sample = tmp_path / "sample.txt"
    sample.write_text("\n".join(traffic[:60]) + "\n")
    saved = tmp_path / "recalibrated"
    args = ["--model", router, "--calibrate-on", sample, "--save-calibrated", saved, "--quiet"]
    assert cli("route", *args, "--tradeoff", "budget=0.2@open_cheap_reasoning", traffic[0]) == 0
    stored = saved_calibration(saved)
    assert stored["rows"] == 60
    for agent in AGENTS:  # the same traffic, a fresh load: the same calibration
        np.testing.assert_allclose(stored["margins"][agent], calibration["margins"][agent], atol=1e-5)


def test_evaluate_at_each_tradeoff_scores_the_literal_picks(trained, tmp_path, capsys):
    """`evaluate --tradeoff RULE` (repeated) reports each rule like an operating point: its mean reward
    is that of the literal rule's picks on every joined row."""
    folder, router, prompts, _ = trained
    data = folder.parent
    rewards = {row["task_id"]: row["mean_reward"] for row in map(json.loads, (data / "r.jsonl").open())}
    model = AutoModel.from_pretrained(router, trust_remote_code=True)
    weight, bias, config = saved_head(router)
    costs = np.array(config["agent_costs_per_1k"])
    batch = AutoTokenizer.from_pretrained(router)(prompts, return_tensors="pt", padding=True)
    with torch.inference_mode():
        p = 1 / (1 + np.exp(-(model(**batch).embeddings.double().numpy() @ weight.T + bias)))
    reward_matrix = np.array([rewards[f"t{i}"] for i in range(len(prompts))])
    output = tmp_path / "evaluation.json"
    args = ["--model", router, "--rewards", data / "r.jsonl", "--tasks", data / "t.jsonl", "--no-progress"]
    rules = {"tolerance=0.05": literal_tolerance(p, costs, 0.05), "lambda=0.2": literal_lambda(p, costs, 0.2)}
    tradeoffs = [arg for rule in rules for arg in ("--tradeoff", rule)]
    assert cli("evaluate", *args, *tradeoffs, "--output-json", output) == 0
    printed = capsys.readouterr().out
    record = json.loads(output.read_text())
    assert list(record["tradeoffs"]) == list(rules) and record["tradeoff"] == "tolerance=0.05"
    for rule, picks in rules.items():
        expected = reward_matrix[np.arange(len(prompts)), picks].mean()
        assert record["tradeoffs"][rule]["router"] == pytest.approx(expected, abs=1e-9), rule
        assert f"at trade-off '{rule}'" in printed
    assert cli("evaluate", *args, "--tradeoff", "budget=2") == 2
    assert cli("evaluate", *args, "--tradeoff", "lambda=0.2", "--operating-point", "quality") == 2


def test_a_default_tradeoff_from_pretrained_decides_and_a_bad_one_fails_before_the_backbone_loads(trained, tmp_path):
    """from_pretrained(..., tradeoff=RULE) sets the rule a query without one is decided by; a bad rule (or
    operating point) is refused from the config alone: with the backbone unreachable, the error names the
    rule, not the backbone."""
    _, router, prompts, _ = trained
    weight, bias, config = saved_head(router)
    model = AutoModel.from_pretrained(router, trust_remote_code=True, tradeoff="lambda=0.5")
    tokenizer = AutoTokenizer.from_pretrained(router, trust_remote_code=True)
    output = model(**tokenizer(prompts[:24], return_tensors="pt", padding=True))
    probabilities = 1 / (1 + np.exp(-(output.embeddings.numpy().astype(np.float64) @ weight.T + bias)))
    expected = literal_lambda(probabilities, np.asarray(config["agent_costs_per_1k"]), 0.5)
    assert output.picks.tolist() == expected.tolist()

    unreachable = tmp_path / "router"
    unreachable.mkdir()
    for file in router.iterdir():
        (unreachable / file.name).write_bytes(file.read_bytes())
    config["backbone_name_or_path"] = str(tmp_path / "no-such-backbone")
    (unreachable / "config.json").write_text(json.dumps(config))
    with pytest.raises(OSError, match="no-such-backbone"):  # the folder is right: only the backbone is missing
        AutoModel.from_pretrained(unreachable, trust_remote_code=True)
    with pytest.raises(ValueError, match=r"tradeoff|lambda|tolerance"):
        AutoModel.from_pretrained(unreachable, trust_remote_code=True, tradeoff="lambda=cheap")
    with pytest.raises(ValueError, match="no operating points; drop operating_point='fast'"):
        AutoModel.from_pretrained(unreachable, trust_remote_code=True, operating_point="fast")


def test_a_folder_written_with_the_calibration_in_its_config_still_decides_alike(trained, tmp_path):
    """Routers written before the calibration moved to model.safetensors hold its values in config.json:
    such a folder loads and decides every budget rule as the folder of today does."""
    from safetensors.torch import load_file as load_tensors
    from safetensors.torch import save_file

    _, router, prompts, _ = trained
    older = tmp_path / "older"
    older.mkdir()
    for file in router.iterdir():
        (older / file.name).write_bytes(file.read_bytes())
    config = json.loads((router / "config.json").read_text())
    config["tradeoff_calibration"] = saved_calibration(router)
    (older / "config.json").write_text(json.dumps(config))
    state = load_tensors(str(router / "model.safetensors"))
    save_file({k: v for k, v in state.items() if k.startswith("head.")}, str(older / "model.safetensors"))
    tokenizer = AutoTokenizer.from_pretrained(router)
    batch = tokenizer(prompts[:40], return_tensors="pt", padding=True)
    today, before = (AutoModel.from_pretrained(folder, trust_remote_code=True) for folder in (router, older))
    for rule in ("budget=0.25", "budget=0.1@open_cheap_reasoning", "usd-per-1k=1.0", "tolerance=0.05"):
        with torch.inference_mode():
            assert today(**batch, tradeoff=rule).picks.tolist() == before(**batch, tradeoff=rule).picks.tolist(), rule
