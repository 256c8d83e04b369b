"""The out-of-distribution guard (benchgen_router/ood.py): statistics, the conformal threshold, AUROC,
storage and its validation, the fallback agent, and the default backbone's guard on the pilot prompts.
(scripts/mahalanobis_study.py prints the comparison tables of docs/ood-guard.md.)"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from benchgen_router import ood, routing
from benchgen_router.convert import convert_release as convert_release_api
from benchgen_router.errors import InputError
from benchgen_router.files import read_jsonl
from benchgen_router.loading import load_router
from benchgen_router.routing import run_router
from helpers import (
    AGENTS,
    PILOT,
    RESULT_KEYS,
    cli,
    convert_release,
    make_queries,
    run_tool,
    synthetic_rows,
    write_jsonl,
    write_release,
)

OOD_QUERIES = Path(ood.__file__).resolve().parent / "data" / "ood_queries.jsonl"
PLAIN_GROUPS = ood.PLAIN_OOD_GROUPS
# Near the pilot's domains: writing, code and chit-chat on its subjects, its questions in other languages.
NEAR_GROUPS = ("writing_near_domain", "code_near_domain", "chit_chat_near_domain", "foreign_plain", "foreign_wrapped")
HARD_GROUPS = ood.BENCHMARK_STYLE_OOD_GROUPS
KEEP = ood.DEFAULT_KEEP_SHARE
needs_pilot = pytest.mark.skipif(
    not (PILOT / "tasks.v1.jsonl").exists(), reason=f"pilot data not found at {PILOT} (CI has it)"
)


# ---------------------------------------------------------------------------------------------
# Synthetic embeddings: an anisotropic cloud around one direction, and clouds around others


def cloud(rng: np.random.Generator, count: int, centre: np.ndarray, scales: np.ndarray) -> np.ndarray:
    return (centre + rng.normal(size=(count, len(centre))) * scales).astype(np.float32)


@pytest.fixture(scope="module")
def synthetic():
    rng = np.random.default_rng(7)
    dim = 24
    centre = np.zeros(dim)
    centre[0] = 4.0
    scales = np.linspace(0.05, 1.0, dim)  # variances spread over 400x: a plain distance would be misled
    elsewhere = np.zeros(dim)
    elsewhere[1] = 4.0
    return {
        "dim": dim,
        "draw": lambda count, seed: cloud(np.random.default_rng(seed), count, centre, scales),
        # far: another direction; subtle: a shift of 3 standard deviations along the tightest axes only
        "far": cloud(rng, 500, elsewhere, scales),
        "subtle": cloud(rng, 500, centre + np.r_[3 * scales[: dim // 2], np.zeros(dim - dim // 2)], scales),
    }


def test_guard_keeps_in_distribution_and_flags_out_of_distribution(synthetic):
    guard = ood.fit_guard(synthetic["draw"](600, 1), synthetic["draw"](300, 2))
    fresh = synthetic["draw"](4000, 3)
    kept = 1.0 - guard.flags(fresh).mean()
    assert abs(kept - KEEP) <= 4 * math.sqrt(KEEP * (1 - KEEP) * (1 / 4000 + 1 / 300))
    assert guard.flags(synthetic["far"]).mean() == 1.0
    # a shift of 3 standard deviations along the tight axes, small against the loose axes' spread
    assert guard.flags(synthetic["subtle"]).mean() >= 0.95
    assert ood.auroc(guard.scores(fresh), guard.scores(synthetic["subtle"])) >= 0.99
    assert guard.metadata["n_fit"] == "600" and guard.metadata["n_calibration"] == "300"


@pytest.mark.parametrize("keep_share", [0.8, 0.95, 0.99])
def test_calibration_keeps_the_stated_share_on_fresh_data(synthetic, keep_share):
    """Split conformal: with n calibration scores the kept share of fresh data has mean
    k/(n+1), k = ceil((n+1) q), and the variance of a Beta(k, n+1-k) draw (plus the fresh sample's)."""
    calibration_size, fresh_size, repeats = 200, 3000, 30
    fit = synthetic["draw"](600, 10)
    kept = []
    for repeat in range(repeats):
        guard = ood.fit_guard(fit, synthetic["draw"](calibration_size, 100 + repeat), keep_share)
        kept.append(1.0 - guard.flags(synthetic["draw"](fresh_size, 500 + repeat)).mean())
    rank = math.ceil((calibration_size + 1) * keep_share)
    expected = rank / (calibration_size + 1)
    beta_variance = rank * (calibration_size + 1 - rank) / ((calibration_size + 1) ** 2 * (calibration_size + 2))
    spread = math.sqrt(beta_variance + expected * (1 - expected) / fresh_size)
    assert expected >= keep_share
    assert abs(np.mean(kept) - expected) <= 4 * spread / math.sqrt(repeats)
    assert min(kept) >= keep_share - 5 * spread


def test_conformal_threshold_is_the_stated_order_statistic():
    scores = np.random.default_rng(0).permutation(np.arange(1.0, 101.0))  # 1..100
    assert ood.conformal_threshold(scores, 0.95) == 96.0  # ceil(101 * 0.95) = 96th smallest
    assert ood.conformal_threshold(scores, 0.5) == 51.0
    assert ood.conformal_threshold(np.arange(19.0), 0.95) == 18.0  # 19 scores: the largest
    with pytest.raises(InputError, match="give at least 19"):
        ood.conformal_threshold(np.arange(18.0), 0.95)
    with pytest.raises(InputError, match="strictly between 0 and 1"):
        ood.conformal_threshold(scores, 1.0)


def test_auroc_counts_ties_half():
    inside, outside = [0.1, 0.4, 0.4, 0.8], [0.4, 0.9, 0.2]
    # out 0.4: beats 0.1, ties both 0.4s (half each), loses to 0.8 -> 2; out 0.9 beats all 4; out 0.2 beats 0.1
    assert ood.auroc(inside, outside) == pytest.approx(7 / 12)
    assert ood.auroc([1.0, 2.0], [3.0, 4.0]) == 1.0 and ood.auroc([3.0, 4.0], [1.0, 2.0]) == 0.0
    assert ood.auroc([5.0, 5.0], [5.0]) == 0.5
    rng = np.random.default_rng(3)
    many_in, many_out = rng.integers(0, 6, 40), rng.integers(2, 9, 30)  # heavy ties
    pairwise = (many_out[:, None] > many_in[None]).mean() + 0.5 * (many_out[:, None] == many_in[None]).mean()
    assert ood.auroc(many_in, many_out) == pytest.approx(pairwise)


def test_shrinkage_weights_follow_the_data():
    rng = np.random.default_rng(5)
    isotropic = rng.normal(size=(60, 40))  # true covariance is a multiple of I: shrink (nearly) all the way
    skewed = rng.normal(size=(5000, 10)) * np.geomspace(0.01, 10, 10)  # plenty of rows, far from I: barely
    for method in ood.SHRINKAGE_METHODS:
        covariance, weight = ood.shrunk_covariance(isotropic, method)
        assert weight >= 0.8
        np.linalg.cholesky(covariance)  # fewer rows than twice the dimensions, still positive definite
        assert ood.shrunk_covariance(skewed, method)[1] <= 0.01
    wide = rng.normal(size=(10, 50))  # singular sample covariance
    for method in ood.SHRINKAGE_METHODS:
        np.linalg.cholesky(ood.shrunk_covariance(wide, method)[0])
    with pytest.raises(InputError, match="unknown shrinkage"):
        ood.shrunk_covariance(isotropic, "graphical_lasso")


def test_ledoit_wolf_matches_scikit_learn():
    covariance_module = pytest.importorskip("sklearn.covariance", reason="scikit-learn not installed")
    rows = np.random.default_rng(8).normal(size=(80, 30)) @ np.random.default_rng(9).normal(size=(30, 30))
    ours, weight = ood.shrunk_covariance(rows, "ledoit_wolf")
    theirs, their_weight = covariance_module.ledoit_wolf(rows)
    assert weight == pytest.approx(their_weight, rel=1e-9)
    assert np.abs(ours - theirs).max() <= 1e-9 * np.abs(theirs).max()


def test_torch_snippet_matches_numpy(synthetic):
    """The computation the model's forward runs on stored tensors (the snippet handed to the model
    code) flags exactly what the numpy guard flags, in float32."""
    guard = ood.fit_guard(synthetic["draw"](600, 1), synthetic["draw"](300, 2))
    queries = np.concatenate([synthetic["draw"](300, 4), synthetic["subtle"], synthetic["far"]])
    tensors = {key: torch.from_numpy(value) for key, value in guard.tensors().items()}
    embeddings = torch.from_numpy(queries)
    unit = torch.nn.functional.normalize(embeddings.float(), dim=-1)
    diff = unit - tensors["ood_mean"]
    score = ((diff @ tensors["ood_precision"]) * diff).sum(-1)
    flag = score > tensors["ood_threshold"]
    numpy_scores = guard.scores(queries)
    assert np.abs(score.numpy() - numpy_scores).max() <= 1e-4 * numpy_scores.max()
    near = np.abs(numpy_scores - guard.threshold) <= 1e-4 * guard.threshold  # float32 may differ right at the edge
    assert (flag.numpy() == guard.flags(queries))[~near].all()


def test_stored_threshold_is_the_float32_at_or_above_the_value():
    for value in (588.4775390625, 588.47754, 3.0756759, -2.5e-3, 1.0 / 3.0):
        stored = ood.stored_threshold(value)
        assert stored >= value and float(np.float32(stored)) == stored
        assert float(np.nextafter(np.float32(stored), np.float32(-np.inf))) < value


# ---------------------------------------------------------------------------------------------
# The discriminative guard: inside against outside, on the embedding and its distance


@pytest.fixture(scope="module")
def discriminative(synthetic):
    inside, outside = synthetic["draw"](600, 1), np.concatenate([synthetic["far"][:200], synthetic["subtle"][:200]])
    calibration = {"prompts": (synthetic["draw"](300, 2), 0.95), "questions": (synthetic["draw"](120, 5), 0.8)}
    return ood.fit_discriminative_guard(inside, outside, calibration), calibration


def test_discriminative_guard_flags_what_it_was_shown_and_keeps_each_calibration_set(synthetic, discriminative):
    guard, calibration = discriminative
    assert guard.discriminative and guard.metadata["n_outside"] == "400"
    fresh = synthetic["draw"](3000, 3)
    assert guard.flags(synthetic["far"][200:]).mean() == 1.0 and guard.flags(synthetic["subtle"][200:]).mean() >= 0.95
    assert 1.0 - guard.flags(fresh).mean() >= 0.90
    for name, (rows, share) in calibration.items():  # the largest threshold keeps each set's share, at least
        kept = int((~guard.flags(rows)).sum())
        assert kept >= math.ceil((len(rows) + 1) * share), name
    assert float(np.float32(guard.threshold)) == guard.threshold


def test_discriminative_guard_round_trips_and_matches_the_torch_score(tmp_path, synthetic, discriminative):
    guard, _ = discriminative
    path = ood.save_guard(tmp_path / "guard.safetensors", guard)
    loaded = ood.load_guard(path, embedding_dim=synthetic["dim"])
    assert loaded.discriminative and loaded.distance_weight == guard.distance_weight and loaded.bias == guard.bias
    queries = np.concatenate([synthetic["draw"](200, 9), synthetic["far"]])
    assert np.array_equal(loaded.flags(queries), guard.flags(queries))
    # the model's computation (modeling_router.RouterModel.ood_scores) on the stored float32 tensors
    t = {key: torch.from_numpy(value) for key, value in guard.tensors().items()}
    unit = torch.nn.functional.normalize(torch.from_numpy(queries).float(), dim=-1)
    diff = unit - t["ood_mean"]
    score = unit @ t["ood_weight"] + t["ood_distance_weight"] * ((diff @ t["ood_precision"]) * diff).sum(-1)
    score = score + t["ood_bias"]
    assert np.abs(score.numpy() - guard.scores(queries)).max() <= 1e-3


def test_logistic_regression_separates_and_needs_both_classes():
    rng = np.random.default_rng(0)
    rows = np.vstack([rng.normal(-1, 0.5, (80, 3)), rng.normal(1, 0.5, (20, 3))])
    outside = np.r_[np.zeros(80), np.ones(20)].astype(bool)
    weights, bias = ood.logistic_regression(rows, outside, l2=0.1)
    assert (((rows @ weights + bias) > 0) == outside).mean() >= 0.97
    with pytest.raises(InputError, match="needs both in-distribution and outside"):
        ood.logistic_regression(rows, np.zeros(100, dtype=bool), l2=0.1)


def test_utility_fallback_takes_the_best_utility_then_the_cheaper_agent():
    utility = np.array([[0.9, 0.8, 0.9], [0.7, 0.8, 0.7]])  # mean 0.8 for all three
    cost = np.array([[3.0, 2.0, 1.0], [3.0, 2.0, 1.0]])
    assert ood.utility_fallback(utility, cost) == 2
    assert ood.utility_fallback(utility + np.array([0.0, 0.01, 0.0]), cost) == 1


# ---------------------------------------------------------------------------------------------
# Storage


def test_saved_guard_round_trips(tmp_path, synthetic):
    guard = ood.fit_guard(synthetic["draw"](300, 1), synthetic["draw"](100, 2), metadata={"backbone": "test"})
    path = ood.save_guard(tmp_path / "guard.safetensors", guard)
    loaded = ood.load_guard(path, embedding_dim=synthetic["dim"])
    assert loaded.threshold == guard.threshold and loaded.metadata == guard.metadata
    assert np.array_equal(loaded.mean, guard.mean) and np.array_equal(loaded.precision, guard.precision)
    queries = synthetic["far"][:50]
    assert np.array_equal(loaded.flags(queries), guard.flags(queries))
    np.savez(tmp_path / "guard.npz", **guard.tensors())
    assert ood.load_guard(tmp_path / "guard.npz").threshold == guard.threshold
    assert sorted(p.name for p in tmp_path.iterdir()) == ["guard.npz", "guard.safetensors"]  # no temporary left
    with pytest.raises(InputError, match="takes 24-d embeddings"):
        loaded.scores(np.ones((2, 7), dtype=np.float32))


def test_saving_refuses_bad_statistics_and_keeps_the_old_file(tmp_path, synthetic):
    guard = ood.fit_guard(synthetic["draw"](300, 1), synthetic["draw"](100, 2))
    path = ood.save_guard(tmp_path / "guard.safetensors", guard)
    before = path.read_bytes()
    broken = ood.OODGuard(guard.mean, guard.precision, float("nan"), guard.metadata)
    with pytest.raises(InputError, match="holds NaN"):
        ood.save_guard(path, broken)
    assert path.read_bytes() == before
    with pytest.raises(InputError, match="does not exist"):
        ood.save_guard(tmp_path / "missing" / "guard.safetensors", guard)
    with pytest.raises(InputError, match=r"saved as \.safetensors"):
        ood.save_guard(tmp_path / "guard.npz", guard)


def _write_safetensors(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> Path:
    from safetensors.numpy import save_file

    save_file(tensors, str(path), metadata=metadata)
    return path


@pytest.fixture
def good_tensors(synthetic) -> dict[str, np.ndarray]:
    return ood.fit_guard(synthetic["draw"](300, 1), synthetic["draw"](100, 2)).tensors()


def _non_positive_definite(precision: np.ndarray) -> np.ndarray:
    values, vectors = np.linalg.eigh(precision.astype(np.float64))
    values[0] = -abs(values[-1])  # symmetric, one negative eigenvalue
    return ((vectors * values) @ vectors.T).astype(np.float32)


@pytest.mark.parametrize(
    "case, change, message",
    [
        ("short mean", lambda t: {**t, "ood_mean": t["ood_mean"][:-1]}, "do not fit 24-d embeddings"),
        ("non-square", lambda t: {**t, "ood_precision": t["ood_precision"][:, :-1]}, "do not fit"),
        ("vector threshold", lambda t: {**t, "ood_threshold": np.ones(2, np.float32)}, "do not fit"),
        ("NaN mean", lambda t: {**t, "ood_mean": np.full_like(t["ood_mean"], np.nan)}, "holds NaN"),
        ("inf threshold", lambda t: {**t, "ood_threshold": np.asarray(np.inf, np.float32)}, "holds NaN"),
        ("not PD", lambda t: {**t, "ood_precision": _non_positive_definite(t["ood_precision"])}, "positive definite"),
        ("asymmetric", lambda t: {**t, "ood_precision": np.triu(t["ood_precision"])}, "not symmetric"),
        ("integer", lambda t: {**t, "ood_mean": np.ones(24, np.int32)}, "not floating point"),
        ("missing key", lambda t: {k: v for k, v in t.items() if k != "ood_threshold"}, "missing"),
        ("huge mean", lambda t: {**t, "ood_mean": np.full(24, 1e300)}, "NaN or infinite values in float32"),
        ("huge threshold", lambda t: {**t, "ood_threshold": np.asarray(1e300)}, "NaN or infinite values in float32"),
        ("zero threshold", lambda t: {**t, "ood_threshold": np.asarray(0.0, np.float32)}, "must be positive"),
        ("negative threshold", lambda t: {**t, "ood_threshold": np.asarray(-5.0, np.float32)}, "must be positive"),
        ("half a linear part", lambda t: {**t, "ood_weight": np.ones(24, np.float32)}, "missing"),
        ("extra key", lambda t: {**t, "ood_reference": np.ones((3, 24), np.float32)}, "unexpected"),
    ],
)
def test_bad_safetensors_statistics_are_refused(tmp_path, good_tensors, case, change, message):
    path = _write_safetensors(tmp_path / "bad.safetensors", change(good_tensors))
    with pytest.raises(InputError, match=message) as caught:
        ood.load_guard(path, embedding_dim=24)
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)


def test_bad_files_of_other_kinds_are_refused(tmp_path, good_tensors):
    pickled = tmp_path / "stats.npy"
    np.save(pickled, np.array([{"ood_mean": 1}], dtype=object), allow_pickle=True)
    plain = tmp_path / "plain.npy"
    np.save(plain, good_tensors["ood_mean"])
    wrong_keys = tmp_path / "wrong.npz"
    np.savez(wrong_keys, mean=good_tensors["ood_mean"], cov=good_tensors["ood_precision"], thr=1.0)
    pickled_npz = tmp_path / "pickled.npz"
    np.savez(pickled_npz, **{**good_tensors, "ood_mean": np.array([object()], dtype=object)})
    damaged = tmp_path / "damaged.safetensors"
    damaged.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not a header at all")
    other_format = _write_safetensors(tmp_path / "other.safetensors", good_tensors, {"format": "something/9"})
    cases = [
        (pickled, "pickled objects"),
        (plain, "one .npy array"),
        (wrong_keys, "missing"),
        (pickled_npz, "pickled objects"),
        (damaged, "cannot be read"),
        (other_format, "format 'something/9'"),
        (tmp_path / "stats.json", "not found"),
    ]
    (tmp_path / "stats.pt").write_bytes(b"whatever")
    cases.append((tmp_path / "stats.pt", "unknown file type"))
    for path, message in cases:
        with pytest.raises(InputError, match=message) as caught:
            ood.load_guard(path)
        assert "\n" not in str(caught.value), path


# ---------------------------------------------------------------------------------------------
# Fallback agent


def test_fallback_agent_is_the_best_fixed_or_the_cheapest_near_it():
    rewards = np.array([[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 0.0, 1.0], [0.0, 1.0, 1.0, 1.0], [1.0, 0.0, 1.0, 0.5]])
    # mean rewards 0.75, 0.5, 0.75, 0.875
    assert ood.fallback_agent(rewards) == 3
    costs = np.array([1.0, 0.1, 0.5, 4.0])
    assert ood.fallback_agent(rewards, costs) == 3  # no tolerance: the best, whatever it costs
    assert ood.fallback_agent(rewards, costs, tolerance=0.125) == 2  # 0 and 2 within 0.125; 2 is cheaper
    assert ood.fallback_agent(rewards, costs, tolerance=0.4) == 1
    assert ood.fallback_agent(rewards[:, :3]) == 0  # equal means: the lowest index
    assert ood.fallback_agent(rewards[:, :3], np.array([1.0, 1.0, 1.0]), tolerance=1.0) == 0  # equal cost: best
    with pytest.raises(InputError, match="one per agent"):
        ood.fallback_agent(rewards, costs[:3])
    with pytest.raises(InputError, match="non-empty"):
        ood.fallback_agent(np.zeros((0, 4)))


# ---------------------------------------------------------------------------------------------
# The guard inside the router: converter, model, results, pick_agent, pipeline, CLI (tiny backbone)

IN_QUERIES = make_queries(200, seed=3)  # the kind of text the tiny routers' guard is fitted on
FOREIGN = ["日本語の質問です。今日は何曜日ですか？" * 3, "Привет! Как дела? Что ты делаешь сегодня вечером?" * 2]


@pytest.fixture(scope="module")
def guarded(tmp_path_factory, converted, backbone_dir):
    """One release, converted without and with a guard fitted on embeddings the plain router computed
    once for the module: {"plain", "guarded"} folders, the release, the guard and the embeddings."""
    plain, _ = converted[0]
    model, tokenizer = load_router(str(plain))
    logits, embeddings = run_router(model, tokenizer, IN_QUERIES + FOREIGN)
    folder = tmp_path_factory.mktemp("guarded")
    manifest, weights = write_release(folder / "release", 32, 0, seed=0, backbone=str(backbone_dir))
    rewards = np.random.default_rng(0).uniform(size=(20, len(AGENTS)))
    rewards[:, AGENTS.index("open_mid")] += 1.0  # the best fixed agent, so the fallback is known
    trained = ood.train_guard(embeddings[:150], rewards, AGENTS)
    ood.save_guard(folder / "release" / ood.GUARD_FILE, trained.guard)
    out = convert_release(manifest, weights, folder / "router", backbone_dir)
    return {
        "plain": plain,
        "guarded": out,
        "release": (manifest, weights),
        "trained": trained,
        "logits": logits,
        "embeddings": embeddings,
        "folder": folder,
    }


def test_converted_guard_flags_foreign_queries_and_keeps_held_out_ones(guarded):
    trained = guarded["trained"]
    assert trained.fallback_agent == "open_mid"
    model, tokenizer = load_router(str(guarded["guarded"]))
    assert model.guards_queries and model.config.ood_fallback_agent == "open_mid"
    assert float(model.ood_threshold) == pytest.approx(trained.guard.threshold)
    logits, embeddings = run_router(model, tokenizer, IN_QUERIES + FOREIGN)
    assert np.array_equal(logits, guarded["logits"])  # the guard never changes the head's scores
    scores = routing.route_queries(model, tokenizer, IN_QUERIES + FOREIGN).ood_scores
    assert np.abs(scores - trained.guard.scores(embeddings)).max() <= 1e-4 * scores.max()  # torch == numpy
    flagged = scores > float(model.ood_threshold)
    assert flagged[-len(FOREIGN) :].all()
    assert flagged[150:200].mean() <= 0.2  # held-out in-distribution queries are mostly kept


def test_flagged_query_goes_to_the_fallback_everywhere(guarded):
    from transformers import AutoModel, AutoTokenizer, pipeline

    folder = str(guarded["guarded"])
    query, kept_query = FOREIGN[0], IN_QUERIES[160]
    model = AutoModel.from_pretrained(folder, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    output = model(**tokenizer([query, kept_query], return_tensors="pt", padding=True))
    assert output.out_of_distribution.tolist()[0] is True and output.ood_scores.shape == (2,)
    head_choice = AGENTS[int(output.logits[0].argmax())]

    picked = routing.pick_agent([query, kept_query], model=folder)
    assert picked[0]["out_of_distribution"] is True and picked[0]["picked_agent"] == "open_mid"
    assert picked[0]["agent_index"] == AGENTS.index("open_mid") and picked[0]["head_pick"] == head_choice
    assert picked[0]["ood_score"] == pytest.approx(float(output.ood_scores[0]), rel=1e-5)
    assert picked[1]["out_of_distribution"] is (float(output.ood_scores[1]) > float(model.ood_threshold))
    assert "head_pick" not in picked[1] or picked[1]["out_of_distribution"]

    # the pipeline returns the model's decision, the fallback included, and the head's scores
    router = pipeline("text-classification", model=folder, trust_remote_code=True)
    assert router(query)[0]["label"] == "open_mid" == AGENTS[int(output.picks[0])]
    ranked = router(query, top_k=None)
    assert ranked[0]["label"] == "open_mid" and {entry["label"] for entry in ranked} == set(AGENTS)
    assert max(ranked[1:], key=lambda entry: entry["score"])["label"] in (head_choice, "open_mid")
    assert router(kept_query)[0]["label"] == picked[1]["picked_agent"]


@pytest.mark.slow
def test_route_json_returns_the_fallback_for_a_flagged_query(guarded):
    result = run_tool("route", "--model", guarded["guarded"], "--json", FOREIGN[0])
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout.splitlines()[0])
    assert printed["out_of_distribution"] is True and printed["picked_agent"] == "open_mid"


def test_checkpoint_without_statistics_routes_exactly_as_before(guarded):
    model, tokenizer = load_router(str(guarded["plain"]))
    assert not model.config.has_ood_guard and not model.guards_queries
    assert not any(name.startswith("ood_") for name, _ in model.named_buffers())
    output = model(**tokenizer(FOREIGN, return_tensors="pt", padding=True))
    assert output.ood_scores is None and output.out_of_distribution is None
    logits, _ = run_router(model, tokenizer, IN_QUERIES + FOREIGN)
    assert np.array_equal(logits, guarded["logits"])
    results = routing.results_for(model, routing.route_queries(model, tokenizer, IN_QUERIES + FOREIGN))
    assert results == routing.results_from_logits(logits, AGENTS)
    assert all(set(result) == RESULT_KEYS for result in results)
    alone, _ = run_router(model, tokenizer, FOREIGN)  # batched as pick_agent batches them
    assert routing.pick_agent(FOREIGN, model=str(guarded["plain"])) == routing.results_from_logits(alone, AGENTS)
    config = json.loads((guarded["plain"] / "config.json").read_text())
    assert config["ood_threshold"] is None
    assert "Out-of-distribution guard" not in (guarded["plain"] / "README.md").read_text()


def test_config_switch_turns_a_present_guard_off(guarded):
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(guarded["guarded"]), trust_remote_code=True, ood_guard=False)
    assert model.config.has_ood_guard and not model.guards_queries
    _, tokenizer = load_router(str(guarded["guarded"]))
    output = model(**tokenizer(FOREIGN, return_tensors="pt", padding=True))
    assert output.ood_scores is None and output.out_of_distribution is None
    logits, _ = run_router(model, tokenizer, FOREIGN)
    results = routing.results_for(model, routing.route_queries(model, tokenizer, FOREIGN))
    assert results == routing.results_from_logits(logits, AGENTS)


def test_saving_and_bundling_keep_the_statistics(guarded, tmp_path, backbone_dir):
    from transformers import AutoModel

    model, tokenizer = load_router(str(guarded["guarded"]))
    model.save_pretrained(tmp_path / "saved")
    reloaded = AutoModel.from_pretrained(str(tmp_path / "saved"), trust_remote_code=True)
    for name in ("ood_mean", "ood_precision", "ood_threshold"):
        assert torch.equal(getattr(reloaded, name), getattr(model, name))
    manifest, weights = guarded["release"]
    bundled = convert_release_api(manifest, weights, tmp_path / "bundled", backbone=str(backbone_dir), bundle=True)
    loaded, _ = load_router(str(bundled))
    assert loaded.config.bundled_backbone and loaded.guards_queries
    assert torch.equal(loaded.ood_precision, model.ood_precision) and loaded.ood_precision.dtype == torch.float32
    output = loaded(**tokenizer(FOREIGN, return_tensors="pt", padding=True))
    assert output.out_of_distribution.all()


def _stats(tensors: dict[str, np.ndarray], path: Path, metadata: dict[str, str] | None = None) -> Path:
    if path.suffix == ".npz":
        np.savez(path, **tensors)
        return path
    return _write_safetensors(path, tensors, metadata)


@pytest.mark.parametrize(
    "case, change, name, message",
    [
        ("wrong shape", lambda t: {**t, "ood_mean": t["ood_mean"][:-1]}, "s.safetensors", "do not fit 32-d"),
        ("NaN", lambda t: {**t, "ood_precision": t["ood_precision"] * np.nan}, "s.safetensors", "NaN"),
        ("not PD", lambda t: {**t, "ood_precision": _non_positive_definite(t["ood_precision"])}, "s.npz", "definite"),
        ("pickled", None, "s.npy", "pickled"),
        ("unknown fallback", lambda t: t, "s.safetensors", "fallback agent 'gpt_x' is not in agent_order"),
        ("npz, no fallback", lambda t: t, "s.npz", "name no fallback agent .* --ood-fallback-agent AGENT"),
    ],
)
def test_converter_refuses_bad_statistics_and_writes_nothing(
    guarded, tmp_path, backbone_dir, case, change, name, message
):
    manifest, weights = guarded["release"]
    path = tmp_path / name
    if change is None:
        np.save(path, np.array([{"ood_mean": 1}], dtype=object), allow_pickle=True)
    else:
        _stats(change(guarded["trained"].guard.tensors()), path, {"fallback_agent": "gpt_x"})
    out = tmp_path / "router"
    code = cli(
        "convert", "--manifest", manifest, "--weights", weights, "--output-dir", out, "--ood-stats", path,
        "--backbone", backbone_dir,
    )  # fmt: skip
    assert code == 2
    assert not out.exists()
    with pytest.raises(InputError, match=message) as caught:
        convert_release_api(manifest, weights, out, backbone=str(backbone_dir), ood_stats=path)
    assert "\n" not in str(caught.value) and not out.exists()


def test_a_fallback_agent_without_a_guard_is_refused(guarded, tmp_path, backbone_dir, capsys):
    manifest, weights = guarded["release"]
    out = tmp_path / "router"
    base = ["convert", "--manifest", manifest, "--weights", weights, "--output-dir", out, "--backbone", backbone_dir]
    assert cli(*base, "--ood-fallback-agent", "open_mid", "--no-ood-guard") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no out-of-distribution guard" in err[0] and not out.exists()


@pytest.mark.slow
def test_evaluate_reports_the_guard_on_the_ood_set(guarded, tmp_path):
    queries = tmp_path / "ood.jsonl"
    write_jsonl(queries, [{"query": q, "group": "foreign"} for q in FOREIGN] + [{"query": "x y z", "group": "odd"}])
    rewards, tasks = synthetic_rows(count=14)
    result = run_tool(
        "evaluate", "--model", guarded["guarded"], "--rewards", write_jsonl(tmp_path / "r.jsonl", rewards),
        "--tasks", write_jsonl(tmp_path / "t.jsonl", tasks), "--ood-queries", queries,
        "--output-json", tmp_path / "eval.json", "--no-progress",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    record = json.loads((tmp_path / "eval.json").read_text())["ood_guard"]
    assert record["groups"]["foreign"] == {"queries": 2, "auroc": pytest.approx(1.0), "flagged_share": 1.0}
    assert record["in_distribution_count"] == 14 and "14 evaluated prompts" in record["in_distribution_rows"]
    assert "out-of-distribution guard" in result.stdout and "foreign" in result.stdout


# ---------------------------------------------------------------------------------------------
# The default backbone on real data


def read_ood_queries() -> tuple[list[str], list[str]]:
    rows = read_jsonl(OOD_QUERIES, "OOD query set")
    return [row["query"] for row in rows], [row["group"] for row in rows]


def test_ood_query_set_is_well_formed():
    queries, groups = read_ood_queries()
    assert len(queries) >= 100 and len(set(queries)) == len(queries)
    assert all(isinstance(query, str) and query.strip() for query in queries)
    assert set(groups) == set(PLAIN_GROUPS) | set(NEAR_GROUPS) | set(HARD_GROUPS)
    assert min(groups.count(group) for group in set(groups)) >= 10


@pytest.fixture(scope="module")
def real():
    """The default router's embeddings of every pilot prompt and of the packaged OOD queries."""
    if not (PILOT / "tasks.v1.jsonl").exists():
        pytest.skip(f"pilot data not found at {PILOT} (CI has it)")
    queries, groups = read_ood_queries()
    model, tokenizer = load_router(None)
    prompts = [task["prompt"] for task in read_jsonl(PILOT / "tasks.v1.jsonl", "tasks")]
    return {
        "pilot": run_router(model, tokenizer, prompts)[1],
        "ood": run_router(model, tokenizer, queries)[1],
        "groups": groups,
    }


@pytest.mark.slow
@needs_pilot
def test_default_guard_keeps_held_out_pilot_prompts_and_flags_plain_ood(real):
    pilot, outside, groups = real["pilot"], real["ood"], np.array(real["groups"])
    # the shipped recipe on 80% of the prompts (70/30 fit/calibration), measured on the other 20%
    known, unseen = ood.split_indices(len(pilot), (0.8, 0.2), seed=1)
    fit_rows, calibration_rows = ood.split_indices(len(known), (0.7, 0.3), seed=0)
    guard = ood.fit_guard(pilot[known][fit_rows], pilot[known][calibration_rows], KEEP)
    calibration_size = int(guard.metadata["n_calibration"])
    slack = 3 * math.sqrt(KEEP * (1 - KEEP) * (1 / len(unseen) + 1 / calibration_size))
    kept = 1.0 - guard.flags(pilot[unseen]).mean()
    assert kept >= KEEP - slack, f"kept {kept:.3f} of {len(unseen)} held-out pilot prompts"
    flagged = guard.flags(outside)
    for group in PLAIN_GROUPS:
        assert flagged[groups == group].mean() >= 0.8, f"{group}: flagged {flagged[groups == group].mean():.2f}"
    assert flagged[np.isin(groups, PLAIN_GROUPS)].mean() >= 0.95
    # repeated 60/20/20 splits: the kept share averages the conformal level, and plain groups stay flagged
    kept, flagged_by_group, auroc_by_group = [], {g: [] for g in PLAIN_GROUPS}, {g: [] for g in PLAIN_GROUPS}
    for seed in range(10):
        fit_rows, calibration_rows, test_rows = ood.split_indices(len(pilot), (0.6, 0.2, 0.2), seed)
        split_guard = ood.fit_guard(pilot[fit_rows], pilot[calibration_rows], KEEP)
        test_scores = split_guard.scores(pilot[test_rows])
        kept.append(float(np.mean(test_scores <= split_guard.threshold)))
        for group in PLAIN_GROUPS:
            group_scores = split_guard.scores(outside[groups == group])
            flagged_by_group[group].append(float(np.mean(group_scores > split_guard.threshold)))
            auroc_by_group[group].append(ood.auroc(test_scores, group_scores))
    assert abs(np.mean(kept) - KEEP) <= 0.025, kept
    assert np.mean([np.mean(shares) for shares in flagged_by_group.values()]) >= 0.95
    assert min(np.mean(values) for values in auroc_by_group.values()) >= 0.95
