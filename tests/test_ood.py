"""The guard inside the router (converter, model, results, pick_agent, pipeline, CLI; tiny backbone),
and the default backbone's guard on the pilot prompts. Each room of benchgen_router/ood/ has its own
tests/test_ood_<room>.py; scripts/mahalanobis_study.py prints the comparison tables of docs/ood-guard.md."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from test_ood_storage import non_positive_definite, write_safetensors

from benchgen_router import ood, routing
from benchgen_router.errors import InputError
from benchgen_router.loading import load_router
from benchgen_router.release.convert import convert_release as convert_release_api
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

PLAIN_GROUPS = ood.PLAIN_OOD_GROUPS
KEEP = ood.DEFAULT_KEEP_SHARE
needs_pilot = pytest.mark.skipif(
    not (PILOT / "tasks.v1.jsonl").exists(), reason=f"pilot data not found at {PILOT} (CI has it)"
)


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
    return write_safetensors(path, tensors, metadata)


@pytest.mark.parametrize(
    "case, change, name, message",
    [
        ("wrong shape", lambda t: {**t, "ood_mean": t["ood_mean"][:-1]}, "s.safetensors", "do not fit 32-d"),
        ("NaN", lambda t: {**t, "ood_precision": t["ood_precision"] * np.nan}, "s.safetensors", "NaN"),
        ("not PD", lambda t: {**t, "ood_precision": non_positive_definite(t["ood_precision"])}, "s.npz", "definite"),
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


@pytest.fixture(scope="module")
def real(committed_router, pilot_routed):
    """The default router's embeddings of every pilot prompt and of the packaged OOD queries."""
    queries, groups = ood.read_ood_queries()
    model, tokenizer = committed_router
    return {
        "pilot": pilot_routed["formatted"][1].embeddings,
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
