"""training/neighbours.py: neighbours found without the row itself, and their outcomes as log-odds; and
`train --neighbour-outcomes K` end to end: the exported router's logits and picks against a literal computation
from its saved training queries and the rewards file, the package's routing against the Hub view, and the
refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from test_tradeoffs import literal_tolerance
from transformers import AutoModel, AutoTokenizer

from benchgen_router.training.neighbours import leave_one_out_neighbours, neighbour_log_odds
from helpers import AGENTS, cli, probability_training, synthetic_rows, write_jsonl


def test_a_row_is_never_its_own_neighbour_even_among_equals():
    embeddings = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    found = leave_one_out_neighbours(embeddings, 1)
    assert found.shape == (5, 1)
    assert all(found[row, 0] != row for row in range(5))
    assert found[:4, 0].tolist() == [1, 0, 0, 0] and found[4, 0] == 0  # the closest others, lower index first
    assert sorted(leave_one_out_neighbours(embeddings, 3)[1].tolist()) == [0, 2, 3]


def test_neighbours_outcomes_as_smoothed_log_odds():
    rewards = np.array([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    odds = neighbour_log_odds(np.array([[0, 2], [1, 1]]), rewards)
    # (2 + 1) / (2 + 2) = 3/4 -> log 3; (1 + 1) / 4 = 1/2 -> 0; (0 + 1) / 4 -> log(1/3)
    assert odds == pytest.approx(np.array([[np.log(3), 0.0], [np.log(1 / 3), np.log(1 / 3)]]))


# ---------------------------------------------------------------------------------------------
# `train --neighbour-outcomes K` end to end: the exported router against a literal computation


@pytest.fixture(scope="module")
def trained(tmp_path_factory, backbone_dir):
    """(run folder, exported router, prompts): every fifth prompt held out, K = 5."""
    folder = tmp_path_factory.mktemp("neighbours-run")
    prompts, _ = probability_training(folder, backbone_dir, count=80, seed=11, extra=["--neighbour-outcomes", "5"])
    return folder / "out", folder / "router", prompts


def test_the_router_reads_its_training_queries_outcomes_as_a_literal_computation_does(trained):
    run, router, prompts = trained
    model = AutoModel.from_pretrained(router, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(router)
    training = [prompt for i, prompt in enumerate(prompts) if i % 5]  # probability_training holds out i % 5 == 0
    rows = [json.loads(line) for line in (run.parent / "r.jsonl").read_text().splitlines()]
    rewards = np.array([row["mean_reward"] for i, row in enumerate(rows) if i % 5])
    assert model.config.neighbour_outcomes == 5 and model.config.neighbour_rows == len(training) == 64
    with torch.inference_mode():
        train_embeddings = model(**tokenizer(training, return_tensors="pt", padding=True)).embeddings.double().numpy()
        output = model(**tokenizer(prompts[:30], return_tensors="pt", padding=True), tradeoff="tolerance=0.3")
    state = load_file(str(router / "model.safetensors"))
    np.testing.assert_array_equal(state["neighbours.rewards"], rewards.astype(np.float32))
    unit = train_embeddings / np.linalg.norm(train_embeddings, axis=1, keepdims=True)
    np.testing.assert_allclose(state["neighbours.embeddings"], unit, atol=1e-5)

    queries = output.embeddings.double().numpy()
    similarity = (queries / np.linalg.norm(queries, axis=1, keepdims=True)) @ unit.T
    literal = []
    for row in similarity:
        nearest = sorted(range(len(row)), key=lambda j: -row[j])[:5]
        p = (rewards[nearest].sum(axis=0) + 1) / 7
        literal.append(np.log(p / (1 - p)))
    inputs = np.hstack([queries, np.array(literal)])
    weight, bias = state["head.weight"].astype(np.float64), state["head.bias"].astype(np.float64)
    assert weight.shape == (len(AGENTS), 32 + len(AGENTS))
    np.testing.assert_allclose(output.logits.double().numpy(), inputs @ weight.T + bias, rtol=1e-4, atol=1e-4)
    costs = np.array(model.config.agent_costs_per_1k)
    picks = literal_tolerance(1 / (1 + np.exp(-(inputs @ weight.T + bias))), costs, 0.3)
    np.testing.assert_array_equal(output.picks.numpy(), picks)
    assert len(set(picks.tolist())) > 1  # the picks differ between queries: agreement is not trivial
    assert "training queries' embeddings and rewards" in (router / "README.md").read_text()


def test_the_package_routes_as_the_hub_view_and_its_run_folder_is_refused(trained, backbone_dir, tmp_path, capsys):
    from benchgen_router.loading import load_router
    from benchgen_router.routing import route_queries

    run, router, prompts = trained
    hub = AutoModel.from_pretrained(router, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(router)
    with torch.inference_mode():
        expected = hub(**tokenizer(prompts, return_tensors="pt", padding=True), tradeoff="tolerance=0.3").picks.numpy()
    model, tokenizer = load_router(str(router))
    np.testing.assert_array_equal(route_queries(model, tokenizer, prompts, tradeoffs="tolerance=0.3").picks, expected)
    assert json.loads((run / "manifest.json").read_text())["neighbour_outcomes"] == 5
    args = ["--manifest", run / "manifest.json", "--weights", run / "head_weights.npy", "--backbone", backbone_dir]
    capsys.readouterr()
    assert cli("convert", *args, "--output-dir", tmp_path / "converted") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train --neighbour-outcomes" in err[0] and "exported" in err[0], err
    assert not (tmp_path / "converted").exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--head-kind", "cmaes", "--export", "R"], "--neighbour-outcomes feeds the probability head"),
        (["--head-kind", "probability", "--export", "R", "--finetune"], "and drop --finetune"),
        (["--head-kind", "probability"], "pass --export DIR"),
    ],
)
def test_neighbour_outcomes_outside_an_exported_probability_head_are_one_line(tmp_path, capsys, flags, message):
    rows = tmp_path / "r.jsonl"
    rows.write_text('{"task_id": "t", "agent_order": ["a", "b"], "mean_reward": [1, 0]}\n')
    flags = [str(tmp_path / "router") if flag == "R" else flag for flag in flags]
    code = cli(
        "train", "--rewards", rows, "--tasks", rows, "--output-dir", tmp_path / "out", "--neighbour-outcomes", "3",
        *flags,
    )  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "out").exists() and not (tmp_path / "router").exists()


def test_as_many_neighbours_as_training_rows_is_refused_before_any_embedding(tmp_path, capsys):
    rewards, tasks = synthetic_rows(14)  # 10 training rows, 4 held out
    files = write_jsonl(tmp_path / "r.jsonl", rewards), write_jsonl(tmp_path / "t.jsonl", tasks)
    code = cli(
        "train", "--rewards", files[0], "--tasks", files[1],
        "--output-dir", tmp_path / "out", "--export", tmp_path / "router", "--head-kind", "probability",
        "--neighbour-outcomes", "10", "--backbone", tmp_path / "no-backbone-here",
    )  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == ["error: --neighbour-outcomes 10 must be below the 10 training rows."], err
    assert not (tmp_path / "out").exists() and not (tmp_path / "router").exists()
