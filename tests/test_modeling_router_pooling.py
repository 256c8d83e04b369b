"""Every-layer pooling end to end: `train --head-kind probability --pooling every-layer` exports a router whose
remote code pools every hidden state of the backbone; its embeddings are checked against a literal computation
from the backbone's own outputs (each query alone, no padding), its picks against the saved head, and the
package's routing, the converted run folder and the refusals against the same."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from test_tradeoffs import literal_tolerance
from transformers import AutoModel, AutoTokenizer

from helpers import AGENTS, cli, probability_training


@pytest.fixture(scope="module")
def trained(tmp_path_factory, backbone_dir):
    """(run folder, exported router, prompts): the probability head over every layer's mean."""
    folder = tmp_path_factory.mktemp("every-layer-run")
    prompts, _ = probability_training(folder, backbone_dir, count=80, seed=11, extra=["--pooling", "every-layer"])
    return folder / "out", folder / "router", prompts


def literal_every_layer(backbone_dir, tokenizer, texts: list[str]) -> np.ndarray:
    """Each text alone through the backbone: the plain mean over its tokens of every hidden state the backbone
    returns, the states side by side in the order returned."""
    backbone = AutoModel.from_pretrained(backbone_dir).eval()
    rows = []
    with torch.inference_mode():
        for text in texts:
            ids = tokenizer(text, return_tensors="pt")["input_ids"]
            states = backbone(input_ids=ids, output_hidden_states=True).hidden_states
            rows.append(np.concatenate([state[0].double().numpy().mean(axis=0) for state in states]))
    return np.stack(rows)


def test_the_hub_view_pools_every_hidden_state_and_picks_by_the_saved_head(trained, backbone_dir):
    _, router, prompts = trained
    model = AutoModel.from_pretrained(router, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(router)
    config = json.loads((router / "config.json").read_text())
    assert config["pooling"] == "every-layer" and model.config.embedding_dim == 32 * 3  # 2 layers + the input's
    assert not model.packs_queries  # a packed pass returns the last hidden state only
    texts = prompts[:24]  # mixed lengths: a padded batch
    with torch.inference_mode():
        output = model(**tokenizer(texts, return_tensors="pt", padding=True), tradeoff="tolerance=0.3")
    expected = literal_every_layer(backbone_dir, tokenizer, texts)
    assert output.embeddings.shape == (24, 96)
    np.testing.assert_allclose(output.embeddings.double().numpy(), expected, rtol=1e-4, atol=1e-5)
    state = load_file(str(router / "model.safetensors"))
    weight, bias = state["head.weight"].astype(np.float64), state["head.bias"].astype(np.float64)
    assert weight.shape == (len(AGENTS), 96)
    p = 1 / (1 + np.exp(-(expected @ weight.T + bias)))
    picks = literal_tolerance(p, np.array(config["agent_costs_per_1k"]), 0.3)
    np.testing.assert_array_equal(output.picks.numpy(), picks)
    assert len(set(picks.tolist())) > 1  # the picks differ between queries: agreement is not trivial
    assert "every hidden state" in (router / "README.md").read_text()


def test_the_package_routes_and_the_converted_run_pick_as_the_hub_view(trained, backbone_dir, tmp_path):
    from benchgen_router.loading import load_router
    from benchgen_router.routing import route_queries

    run, router, prompts = trained
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["pooling"] == "every-layer" and manifest["embedding_dim"] == 96
    args = ["--manifest", run / "manifest.json", "--weights", run / "head_weights.npy", "--backbone", backbone_dir]
    assert cli("convert", *args, "--output-dir", tmp_path / "converted") == 0
    hub = AutoModel.from_pretrained(router, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(router)
    with torch.inference_mode():
        expected = hub(**tokenizer(prompts[:40], return_tensors="pt", padding=True), tradeoff="tolerance=0.3")
    assert len(set(expected.picks.tolist())) > 1
    for folder in (router, tmp_path / "converted"):
        model, tokenizer = load_router(str(folder))
        assert model.config.pooling == "every-layer"
        routed = route_queries(model, tokenizer, prompts[:40], batch_size=7, tradeoffs="tolerance=0.3")
        np.testing.assert_allclose(routed.embeddings, expected.embeddings.numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(routed.picks, expected.picks.numpy())


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--head-kind", "cmaes"], "--pooling every-layer feeds the probability head: pass --head-kind probability"),
        (["--head-kind", "probability", "--finetune"], "--pooling every-layer reads a frozen backbone's layers"),
    ],
)
def test_every_layer_pooling_outside_the_probability_head_is_one_line(tmp_path, capsys, flags, message):
    rows = tmp_path / "r.jsonl"
    rows.write_text('{"task_id": "t", "agent_order": ["a", "b"], "mean_reward": [1, 0]}\n')
    code = cli(
        "train", "--rewards", rows, "--tasks", rows, "--output-dir", tmp_path / "out", "--pooling", "every-layer",
        "--export", tmp_path / "router", *flags,
    )  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "out").exists() and not (tmp_path / "router").exists()


def test_the_package_and_the_remote_code_name_the_same_poolings():
    import inspect

    from benchgen_router.manifest import POOLINGS
    from benchgen_router.model_code import RouterConfig

    assert inspect.getmodule(RouterConfig).POOLINGS == POOLINGS


def test_a_packed_batch_is_refused_by_an_every_layer_router_in_one_line(trained):
    """A packed pass yields the last hidden state only: an every-layer router refuses it with the fix, rather
    than failing in its head's matrix product."""
    router = trained[1]
    model = AutoModel.from_pretrained(router, trust_remote_code=True)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with pytest.raises(ValueError, match="pass the queries padded, without position_ids") as raised:
        model(input_ids=ids, position_ids=torch.tensor([[0, 1, 2, 0, 1, 2]]))
    assert "\n" not in str(raised.value)


def test_an_unknown_pooling_is_refused_before_any_cache_is_read(backbone_dir, tmp_path):
    from benchgen_router.embeddings import embed_prompts

    with pytest.raises(ValueError, match="pooling must be one of last-layer, every-layer, got 'every-layers'"):
        embed_prompts(["a question"], str(backbone_dir), AGENTS, cache_dir=tmp_path, pooling="every-layers")
    assert not any(tmp_path.iterdir())
