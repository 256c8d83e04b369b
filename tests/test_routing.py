"""routing.py: the one inference path (packed and padded batches by token budget, input order kept,
the reference's results), pick_agent's return shape, its input rules and its shared router cache."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from benchgen_router import routing
from benchgen_router.batching import plan_batches
from benchgen_router.errors import InputError
from benchgen_router.head import head_logits, theta_to_state_dict
from benchgen_router.loading import backbone_router, load_router
from benchgen_router.routing import (
    EmptyQueryError,
    get_router,
    pick_agent,
    run_router,
)
from helpers import AGENTS, check_result, make_queries
from reference_impl import ReferenceRouter

QUERIES = make_queries(40, seed=11)


@pytest.mark.parametrize("hidden", [0, 8])
@pytest.mark.parametrize(
    "batching",
    [{}, {"max_batch_tokens": 300}, {"batch_size": 7}, {"max_batch_tokens": 1}, {"max_batch_tokens": 10**6}],
)
def test_run_router_matches_reference_in_input_order(converted, backbone_dir, hidden, batching):
    """Packed batches of any budget (one query per batch up to one batch for all), a query cap, and
    the default: each query's per-query reference result, in input order."""
    folder, theta = converted[hidden]
    ref = ReferenceRouter(str(backbone_dir), theta, AGENTS, hidden)
    model, tokenizer = load_router(folder)
    assert model.packs_queries
    logits, embeddings = run_router(model, tokenizer, QUERIES, **batching)
    ref_emb = np.concatenate([ref.embed([q]) for q in QUERIES])
    assert np.abs(embeddings - ref_emb).max() <= 1e-4
    assert np.abs(logits - ref.logits(ref_emb)).max() <= 1e-4
    assert len(set(logits.argmax(1))) > 1
    # the numpy head used by the trainer agrees with the torch head on the same embeddings
    assert np.abs(head_logits(theta, ref_emb, len(AGENTS), hidden)[0] - ref.logits(ref_emb)).max() <= 1e-9


@pytest.mark.parametrize("hidden", [0, 8])
def test_backbone_router_with_theta_is_the_converted_router(converted, backbone_dir, hidden):
    folder, theta = converted[hidden]
    model, tokenizer = backbone_router(str(backbone_dir), AGENTS, head_hidden_dim=hidden)
    model.head.load_state_dict(
        {k.removeprefix("head."): v for k, v in theta_to_state_dict(theta, 32, 5, hidden).items()}
    )
    converted_model, _ = load_router(folder)
    a, _ = run_router(model, tokenizer, QUERIES)
    b, _ = run_router(converted_model, tokenizer, QUERIES)
    assert np.array_equal(a, b)


@pytest.mark.parametrize("hidden", [0, 8])
def test_pick_agent_one_query_and_a_list_match_the_reference(converted, backbone_dir, hidden):
    folder, theta = converted[hidden]
    reference = ReferenceRouter(str(backbone_dir), theta, AGENTS, hidden)
    expected = np.concatenate([reference.logits(reference.embed([q])) for q in QUERIES])

    single = pick_agent(QUERIES[0], model=str(folder))
    assert isinstance(single, dict)
    check_result(single, expected[0])

    batch = pick_agent(QUERIES, model=folder, batch_size=5)  # varied lengths: sorted batches, order restored
    assert isinstance(batch, list) and len(batch) == len(QUERIES)
    for result, row in zip(batch, expected, strict=True):
        check_result(result, row)
    for result, row in zip(pick_agent(QUERIES, model=folder, max_batch_tokens=300), expected, strict=True):
        check_result(result, row)
    assert len({r["picked_agent"] for r in batch}) > 1  # the random head does discriminate these queries


def test_pick_agent_reuses_one_load_and_takes_loaded_routers(converted, monkeypatch):
    folder, _ = converted[0]
    first = get_router(str(folder), device="cpu")
    monkeypatch.chdir(folder.parent)
    assert get_router(folder.name, device="cpu") is first  # a relative path to the same folder: no reload
    half = get_router(str(folder), device="cpu", dtype="float16")  # another dtype is another load
    assert half is not first and next(half[0].backbone.parameters()).dtype == torch.float16

    expected = pick_agent(QUERIES[:4], model=str(folder), device="cpu")
    pair = load_router(folder)
    assert pick_agent(QUERIES[:4], model=pair) == expected
    assert pick_agent(QUERIES[:4], model=SimpleNamespace(model=pair[0], tokenizer=pair[1])) == expected
    with pytest.raises(TypeError, match="model= takes"):
        pick_agent("hello", model=3.5)


def test_pick_agent_refuses_empty_queries_and_accepts_an_empty_list(converted):
    folder, _ = converted[0]
    with pytest.raises(ValueError, match="empty"):
        pick_agent("   ", model=folder)
    with pytest.raises(ValueError, match=r"queries at position\(s\) \[1\] are empty"):
        pick_agent(["What is 2+2?", ""], model=folder)
    assert pick_agent([], model=folder) == []


@pytest.mark.parametrize("value", [0, -1, -5, 2.5, True, "8"])
def test_every_batching_argument_is_validated_at_the_api(converted, value):
    """A negative batch size used to return 0.2 for every agent without running the model, and a
    zero budget made planning loop forever: both are refused with one line, for every entry point."""
    folder, _ = converted[0]
    model, tokenizer = load_router(folder)
    for kwargs in ({"batch_size": value}, {"max_batch_tokens": value}):
        with pytest.raises(InputError, match="must be a positive integer"):
            pick_agent(QUERIES[:2], model=(model, tokenizer), **kwargs)
        with pytest.raises(InputError, match="must be a positive integer"):
            run_router(model, tokenizer, QUERIES[:2], **kwargs)
        with pytest.raises(InputError, match="must be a positive integer"):
            plan_batches([5, 3], packed=True, **kwargs)


@pytest.mark.parametrize("bad", ["\u200b", "\ufeff", "\u2060\u200b", "\x01\x02", "\u0301", " \u00ad "])
def test_queries_that_tokenize_to_nothing_are_refused_before_the_model_runs(bad):
    """Zero-width spaces, a lone BOM, control characters, a lone combining mark: BERT's tokenizer
    (the committed router's) keeps nothing of them but [CLS] [SEP]."""
    model, tokenizer = load_router(None)
    with pytest.raises(EmptyQueryError) as raised:
        run_router(model, tokenizer, [QUERIES[0], bad, QUERIES[1], bad])
    assert raised.value.positions == [1, 3] and "position(s) [1, 3]" in str(raised.value)
    with pytest.raises(ValueError, match=r"position\(s\) \[0\]"):
        pick_agent(bad, model=(model, tokenizer))
    assert len(pick_agent([QUERIES[0], QUERIES[1]], model=(model, tokenizer))) == 2


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (b"What is 2+2?", "got bytes; decode"),
        ({"q": "What?"}, "got dict"),
        (42, "got int"),
        (["ok", 3], "query 1 is int"),
    ],
)
def test_pick_agent_takes_a_str_or_a_sequence_of_str_only(converted, value, message):
    folder, _ = converted[0]
    with pytest.raises(TypeError, match=message):
        pick_agent(value, model=folder)


def test_first_calls_from_many_threads_load_the_router_once(converted, monkeypatch):
    folder, _ = converted[0]
    loads = []
    import benchgen_router.loading as loading

    original = loading.load_router

    def counting_load(*args, **kwargs):
        loads.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(loading, "load_router", counting_load)
    monkeypatch.setattr(routing, "ROUTERS", routing._RouterCache(2))
    results, barrier = [], threading.Barrier(8)

    def first_call() -> None:
        barrier.wait()
        results.append(pick_agent(QUERIES[0], model=str(folder), device="cpu")["picked_agent"])

    threads = [threading.Thread(target=first_call) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(loads) == 1 and len(results) == 8 and len(set(results)) == 1


def test_pick_agent_routes_at_each_operating_point(operating_router, backbone_dir):
    """operating_point= picks that point's head (the literal reference's results over its theta), the
    default is the router's configured one, each result names its point, and a wrong name is one line."""
    folder, thetas = operating_router
    queries = QUERIES[:12]
    for name, theta in thetas.items():
        reference = ReferenceRouter(str(backbone_dir), theta, AGENTS)
        expected = np.concatenate([reference.logits(reference.embed([q])) for q in queries])
        for result, row in zip(pick_agent(queries, model=folder, operating_point=name), expected, strict=True):
            assert result.pop("operating_point") == name
            check_result(result, row)
    default = pick_agent(queries, model=folder)
    assert default == pick_agent(queries, model=folder, operating_point="balanced")
    with pytest.raises(InputError, match="'cheap' is not one of this router's: balanced, fast, quality"):
        pick_agent(queries[0], model=folder, operating_point="cheap")


def test_a_single_head_router_refuses_an_operating_point_and_names_none(converted):
    folder, _ = converted[0]
    assert "operating_point" not in pick_agent(QUERIES[0], model=folder)
    with pytest.raises(InputError, match="single head and no operating points"):
        pick_agent(QUERIES[0], model=folder, operating_point="quality")


def test_route_results_skips_only_the_queries_that_tokenize_to_nothing():
    """The routine of the command line, bulk routing and the service: a query no router can score is
    None at its position, and every other query gets what it gets alone, at its own point (the
    committed router: BERT's tokenizer keeps nothing of a zero-width space)."""
    model, tokenizer = load_router(None)
    texts = [QUERIES[0], "\u200b", QUERIES[1], "\ufeff", QUERIES[2]]
    points = ["fast", "quality", None, "fast", "quality"]
    results = routing.route_results(model, tokenizer, texts, operating_points=points)
    assert [result is None for result in results] == [False, True, False, True, False]
    for position in (0, 2, 4):
        alone = routing.route_results(model, tokenizer, [texts[position]], operating_points=points[position])
        assert results[position]["picked_agent"] == alone[0]["picked_agent"]
        assert results[position]["operating_point"] == (points[position] or "balanced")
        assert np.allclose(list(results[position]["logits"].values()), list(alone[0]["logits"].values()), atol=1e-5)
    assert routing.route_results(model, tokenizer, ["\u200b"]) == [None]


class CountedTokenizer:
    """A real tokenizer that counts how often it is called."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.calls = tokenizer, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.tokenizer(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


def test_router_tokenizes_once_and_checks_each_point_once_at_the_edge(monkeypatch):
    """Router.route: one tokenization however many queries are empty, each distinct point checked once
    (none when the caller's edge checked them), and the model's decision as the pick."""
    model, tokenizer = load_router(None)
    checks = []
    check = type(model.config).check_operating_point
    monkeypatch.setattr(
        type(model.config), "check_operating_point", lambda config, name: checks.append(name) or check(config, name)
    )
    counted = CountedTokenizer(tokenizer)
    router = routing.Router(model, counted)
    texts = [QUERIES[0], "\u200b", QUERIES[1], QUERIES[2], "\ufeff"]
    points = ["fast", "quality", None, "fast", "quality"]
    results = router.route(texts, points)
    assert counted.calls == 1 and sorted(checks, key=str) == sorted(["fast", "quality", None], key=str)
    assert [result is None for result in results] == [False, True, False, False, True]
    checks.clear()
    again = router.route(texts, ["fast", "quality", "balanced", "fast", "quality"], checked=True)
    assert counted.calls == 2 and checks == [] and again == results  # None is the default point, "balanced"
    routed = router.run([texts[i] for i in (0, 2, 3)], "fast")
    assert [result["agent_index"] for result in router.results(routed)] == routed.picks.tolist()
    with pytest.raises(InputError, match="not one of this router's"):
        router.route(texts, "nowhere")
