"""training/finetune.py: the backbone trained with the probability head, early stopping, the exported router
and the settings' one-line errors.

The task (helpers.order_task): the same tokens in two orders, the first agent right only when "prime" comes
first. The backbone (helpers.build_bag_of_tokens) is a tiny Qwen3 whose frozen embedding is a bag of tokens,
identical for both orders of a prompt: no head over it can beat chance; a trained top layer can see the order.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from benchgen_router.errors import InputError
from benchgen_router.hardware import one_thread
from benchgen_router.loading import backbone_router
from benchgen_router.routing import run_router
from benchgen_router.training.config import FinetuneSettings, TrainConfig, check_config, check_finetune_settings
from benchgen_router.training.finetune import (
    StandardisedHead,
    finetune_probability,
    first_trained_layer,
    tokenized_prompts,
)
from benchgen_router.training.finetune_states import LayerStack, LowerStates
from benchgen_router.training.probability import feature_scaling, fit_probability_head
from helpers import build_bag_of_tokens, order_task, run_in_process, write_jsonl

AGENTS = ["prime_first", "prime_second"]


@pytest.fixture(scope="module")
def bag_of_tokens(tmp_path_factory, tokenizer_dir):
    return build_bag_of_tokens(tmp_path_factory.mktemp("bag") / "backbone", tokenizer_dir)


@pytest.fixture(scope="module")
def bert_backbone(tmp_path_factory, tokenizer_dir):
    """A tiny random BERT-style encoder with the tests' tokenizer."""
    from transformers import BertConfig, BertModel

    folder = tmp_path_factory.mktemp("bert") / "backbone"
    torch.manual_seed(0)
    settings = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}
    BertModel(BertConfig(vocab_size=320, max_position_embeddings=128, pad_token_id=0, **settings)).save_pretrained(
        folder
    )
    for item in tokenizer_dir.iterdir():
        shutil.copy(item, folder / item.name)
    return folder


def prepared(backbone, layers: int | None, prompts: list[str]):
    """(router, tokenizer, lower states of every prompt) for training `layers` top layers (None: all)."""
    router, tokenizer = backbone_router(str(backbone), AGENTS)
    first = first_trained_layer(router, layers)
    ids = tokenized_prompts(router, tokenizer, prompts)
    return router, tokenizer, LowerStates.compute(router, ids, first, tokenizer.pad_token_id or 0)


def cross_entropy(probabilities: np.ndarray, rewards: np.ndarray) -> float:
    p = np.clip(probabilities, 1e-7, 1 - 1e-7)
    return float(-(rewards * np.log(p) + (1 - rewards) * np.log(1 - p)).mean())


def test_learns_an_order_the_frozen_embedding_cannot_see_and_is_seeded(bag_of_tokens) -> None:
    prompts, rewards = order_task()
    held = np.random.default_rng(0).permutation(len(prompts))[:60]
    train = np.setdiff1d(np.arange(len(prompts)), held)
    settings = FinetuneSettings(epochs=8, layers=1, learning_rate=1e-2, batch_size=16, patience=3, seed=5)
    with one_thread():
        router, tokenizer, lower = prepared(bag_of_tokens, 1, prompts)
        frozen = run_router(router, tokenizer, prompts)[1]
        assert np.abs(frozen[0::2] - frozen[1::2]).max() < 1e-5  # both orders: one frozen embedding
        frozen_head = fit_probability_head(frozen[train], rewards[train], seed=5)
        tuned = finetune_probability(router, lower, train, rewards[train], frozen[train], settings)
        fresh, _, fresh_lower = prepared(bag_of_tokens, 1, prompts)
        again = finetune_probability(fresh, fresh_lower, train, rewards[train], frozen[train], settings)
    assert cross_entropy(frozen_head.predict(frozen[held]), rewards[held]) > 0.65  # chance: ln 2 = 0.693
    learned = tuned.head.predict(tuned.embeddings(held))
    assert cross_entropy(learned, rewards[held]) < 0.3
    assert ((learned[:, 0] > 0.5) == (rewards[held, 0] == 1)).mean() > 0.9
    assert tuned.best_epoch >= 1 and tuned.history[0]["validation_loss"] > 0.65
    # one thread, one seed: the same weights and the same history
    np.testing.assert_array_equal(tuned.head.weight, again.head.weight)
    assert [row["validation_loss"] for row in tuned.history] == [row["validation_loss"] for row in again.history]


@pytest.mark.parametrize("backbone", ["bag_of_tokens", "bert_backbone"])
def test_top_layers_over_kept_states_give_the_served_embeddings(backbone, request) -> None:
    """Training moves only the top layer's weights (and the final norm's); the top layers replayed over the
    kept states give the embeddings the router serves with, for a decoder and an encoder, whatever those
    weights are."""
    folder = request.getfixturevalue(backbone)
    prompts, rewards = order_task()
    rows = np.arange(len(prompts))
    with one_thread():
        router, tokenizer, lower = prepared(folder, 1, prompts)
        frozen = run_router(router, tokenizer, prompts)[1]
        before = {name: value.clone() for name, value in router.backbone.state_dict().items()}
        settings = FinetuneSettings(epochs=2, layers=1, learning_rate=1e-2, batch_size=16, patience=2)
        tuned = finetune_probability(router, lower, rows, rewards, frozen, settings)
        stack = LayerStack.of(router.backbone)
        changed = {name for name, value in router.backbone.state_dict().items() if not torch.equal(value, before[name])}
        lower_names = {name for name in before if ".0." in name or "embed" in name}
        torch.manual_seed(0)
        with torch.no_grad():  # whatever training made of them
            for parameter in stack.trained_parameters(1):
                parameter.add_(0.1 * torch.randn_like(parameter))
        served = run_router(tuned.router, tokenizer, prompts)[1]
    assert stack.count == 2 and lower_names and not lower_names & changed
    assert bool(changed) == (tuned.best_epoch > 0)
    assert np.abs(served - frozen).max() > 1e-2  # the changed top layer reaches the embeddings
    np.testing.assert_allclose(tuned.embeddings(rows), served, atol=1e-5)


def test_early_stopping_stops_and_keeps_the_frozen_router_when_no_epoch_beats_it(bag_of_tokens) -> None:
    prompts, _ = order_task()
    noise = np.random.default_rng(3).integers(0, 2, size=(len(prompts), 2)).astype(float)
    settings = FinetuneSettings(epochs=10, layers=1, learning_rate=5e-2, batch_size=16, patience=1, seed=1)
    with one_thread():
        router, tokenizer, lower = prepared(bag_of_tokens, 1, prompts)
        frozen = run_router(router, tokenizer, prompts)[1]
        before = {name: value.clone() for name, value in router.backbone.state_dict().items()}
        rows = np.arange(len(prompts))
        tuned = finetune_probability(router, lower, rows, noise, frozen, settings)
    assert len(tuned.history) == 2  # epoch 1 was worse than the start: patience 1 stops there, not at 10
    assert tuned.best_epoch == 0 and tuned.history[1]["validation_loss"] > tuned.history[0]["validation_loss"]
    # the frozen router: the backbone as it was, the head fitted on every training row
    assert all(torch.equal(value, before[name]) for name, value in router.backbone.state_dict().items())
    np.testing.assert_array_equal(tuned.head.weight, fit_probability_head(frozen, noise, seed=1).weight)
    assert tuned.record()["epochs_run"] == 1


def test_exported_router_loads_with_the_auto_classes_and_picks_as_trained(bag_of_tokens, tmp_path) -> None:
    from transformers import AutoModel, AutoTokenizer

    from benchgen_router import pick_agent
    from benchgen_router.model_code import DEFAULT_TRADEOFF
    from benchgen_router.tradeoffs import decide
    from benchgen_router.training import train

    prompts, rewards = order_task()
    tasks = [
        {"task_id": f"t{i}", "prompt": p, "split": "test" if i % 5 == 0 else "train"} for i, p in enumerate(prompts)
    ]
    rows = [
        {"task_id": task["task_id"], "agent_order": AGENTS, "split": task["split"], "mean_reward": list(reward)}
        for task, reward in zip(tasks, rewards, strict=True)
    ]
    config = TrainConfig(
        rewards=str(write_jsonl(tmp_path / "rewards.jsonl", rows)),
        tasks=str(write_jsonl(tmp_path / "tasks.jsonl", tasks)),
        output_dir=tmp_path / "run",
        export=tmp_path / "router",
        backbone=str(bag_of_tokens),
        backbone_id="tests/bag-of-tokens",
        head_kind="probability",
        query_format="none",
        no_ood_guard=True,
        no_progress=True,
        cache_dir=tmp_path / "cache",
        finetune=True,
        finetune_epochs=8,
        finetune_layers=1,
        finetune_learning_rate=3e-3,
        finetune_batch_size=16,
        finetune_patience=8,
    )
    with one_thread():
        result = train(config)
    tuned = result.finetuned
    test = np.array([i for i in range(len(prompts)) if i % 5 == 0])
    costs = result.manifest["agent_costs_per_1k"]
    trained_picks = decide(tuned.head.predict(tuned.embeddings(test)), costs, DEFAULT_TRADEOFF)
    assert tuned.best_epoch >= 1  # the exported backbone is a trained one

    folder = tmp_path / "router"
    model = AutoModel.from_pretrained(folder, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    assert model.config.bundled_backbone and type(model).__module__.startswith("transformers_modules")
    untrained = AutoModel.from_pretrained(bag_of_tokens).state_dict()
    exported = model.backbone.state_dict()
    assert any(not torch.equal(exported[name], untrained[name]) for name in untrained)
    output = model(**tokenizer([prompts[i] for i in test], return_tensors="pt", padding=True))
    np.testing.assert_array_equal(output.picks.numpy(), trained_picks)
    np.testing.assert_allclose(
        torch.sigmoid(output.logits).detach().numpy(), tuned.head.predict(tuned.embeddings(test)), atol=1e-5
    )
    picked = pick_agent([prompts[i] for i in test], model=str(folder))
    assert [result["picked_agent"] for result in picked] == [AGENTS[i] for i in trained_picks]
    card = (folder / "README.md").read_text()
    assert "a fine-tuned `tests/bag-of-tokens` backbone" in card and "fine-tuned together with the head" in card
    assert result.manifest["finetune"]["best_epoch"] == tuned.best_epoch
    # the run folder's head alone is no router: convert refuses to pair it with the untrained backbone
    converted = run_in_process(
        "convert", "--manifest", tmp_path / "run/manifest.json", "--weights", tmp_path / "run/head_weights.npy",
        "--backbone", bag_of_tokens, "--output-dir", tmp_path / "converted",
    )  # fmt: skip
    assert converted.returncode == 2 and "train --finetune" in converted.stderr
    assert len(converted.stderr.strip().splitlines()) == 1 and not (tmp_path / "converted").exists()


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"epochs": 0}, "finetune_epochs"),
        ({"layers": 0}, "finetune_layers"),
        ({"learning_rate": float("nan")}, "finetune_learning_rate"),
        ({"learning_rate": 2.0}, "finetune_learning_rate"),
        ({"batch_size": 0}, "finetune_batch_size"),
        ({"patience": 0}, "finetune_patience"),
        ({"validation_share": 0.9}, "finetune_validation_share"),
    ],
)
def test_bad_settings_are_one_line(settings, named) -> None:
    with pytest.raises(InputError) as caught:
        check_finetune_settings(FinetuneSettings(**settings))
    assert named in str(caught.value) and "\n" not in str(caught.value)
    assert f"--{named.replace('_', '-')}" in caught.value.for_command_line()


def base_config(tmp_path, **changes) -> TrainConfig:
    settings = {"rewards": "r.jsonl", "tasks": "t.jsonl", "output_dir": tmp_path / "run", "head_kind": "probability"}
    return TrainConfig(**{**settings, "finetune": True, "export": tmp_path / "router", **changes})


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        (
            {"head_kind": "cmaes"},
            "--finetune trains the backbone with the probability head: pass --head-kind probability",
        ),
        ({"dtype": "bfloat16"}, "--finetune trains in float32: drop --dtype bfloat16"),
        ({"export": None}, "pass --export DIR"),
        ({"finetune": False, "finetune_epochs": 5}, "--finetune-epochs sets how the backbone is fine-tuned"),
    ],
)
def test_bad_runs_are_refused_before_any_work(tmp_path, changes, said) -> None:
    with pytest.raises(InputError) as caught:
        check_config(base_config(tmp_path, **changes))
    assert said in caught.value.for_command_line()


def test_layer_counts_and_layouts_the_backbone_lacks_are_one_line(bag_of_tokens) -> None:
    router, _ = backbone_router(str(bag_of_tokens), AGENTS)
    with pytest.raises(InputError, match="more than the backbone's 2 layers; pass at most 2"):
        first_trained_layer(router, 3)
    assert first_trained_layer(router, 2) == 0 and first_trained_layer(router, None) == 0
    with pytest.raises(InputError, match="has neither: train every layer"):
        LayerStack.of(torch.nn.Linear(2, 2))


def test_the_command_says_one_line(tmp_path) -> None:
    rewards, tasks = tmp_path / "r.jsonl", tmp_path / "t.jsonl"
    result = run_in_process(
        "train", "--rewards", rewards, "--tasks", tasks, "--output-dir", tmp_path / "run", "--finetune",
        "--export", tmp_path / "router",
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: --finetune trains the backbone with the probability head: pass --head-kind probability."
    )


def test_a_near_constant_feature_goes_into_the_bias_before_training() -> None:
    """A feature constant over the fit rows to 1e-9 gets a huge weight from the frozen fit at no cost; trained,
    the backbone's least change to it would swamp the logits. The trained head starts without it, the same
    logits on the rows."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 6)).astype(np.float32)
    x[:, 2] = 1e-9 * rng.normal(size=300)
    x = x.astype(np.float64)
    y = (rng.random((300, 2)) < 1 / (1 + np.exp(-x[:, :2]))).astype(float)
    frozen = fit_probability_head(x, y, seed=0)
    mean, scale = feature_scaling(x)
    head = StandardisedHead(frozen, mean, scale)
    assert head.weight[:, 2].abs().max() == 0 and head.scale.min() > 0.05
    start = torch.sigmoid(head(torch.from_numpy(x.astype(np.float32)))).detach().numpy()
    assert np.abs(frozen.weight[:, 2]).max() > 1e4  # what the frozen fit gave it
    # the logits lose only that feature's standardised term, small where the fit's penalty kept it small
    np.testing.assert_allclose(start, frozen.predict(x), atol=0.01)
    np.testing.assert_allclose(head.folded(frozen.strengths).predict(x), start, atol=1e-5)
