"""convert.py through `convert_npy.py` as users run it: the output folder, both checkpoint modes,
every bad artifact, what the folder records, never clobbering a user's folder, and the Hub upload
at the huggingface_hub boundary."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file
from transformers import AutoConfig, pipeline

from benchgen_router.errors import InputError
from benchgen_router.release.convert import convert_release as convert_release_api
from helpers import (
    AGENTS,
    build_backbone,
    cli,
    convert_release,
    make_queries,
    run_in_process,
    run_tool,
    write_operating_release,
    write_release,
)
from reference_impl import ReferenceRouter


def convert_args(manifest: Path, weights: Path, out: Path, backbone: Path, *extra: str) -> list[str]:
    return ["--manifest", manifest, "--weights", weights, "--output-dir", out, "--backbone", backbone, *extra]


def test_output_folder_is_a_complete_hub_repo(converted):
    folder, _ = converted[0]
    names = {p.name for p in folder.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "configuration_router.py",
        "modeling_router.py",
        "README.md",
        "tokenizer.json",
        "tokenizer_config.json",
        "training_report.json",
    } <= names
    card = (folder / "README.md").read_text()
    header = card.split("---")[1]
    for line in ("library_name: transformers", "pipeline_tag: text-classification", "license:", "tags:"):
        assert line in header
    for agent in AGENTS:
        assert f"`{agent}`" in card
    assert "0.6667" in card and "Limitations" in card  # figures from the manifest, and the limits
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".router-0.tmp")]  # staging cleaned up


@pytest.mark.slow
def test_cli_round_trip_records_backbone_and_revision(tmp_path, backbone_dir):
    manifest, weights = write_release(tmp_path / "release", 32, seed=5)
    out = tmp_path / "hub-folder"
    result = run_in_process(
        "convert_npy.py", *convert_args(manifest, weights, out, backbone_dir, "--backbone-revision", "v1.0")
    )
    assert result.returncode == 0, result.stderr
    config = json.loads((out / "config.json").read_text())
    # read from the local copy, recorded as the manifest's Hub id (a pushed folder names no local path)
    assert config["backbone_name_or_path"] == "Qwen/Qwen3-1.7B"
    assert config["text_config"]["_name_or_path"] == "Qwen/Qwen3-1.7B"
    assert 'base_model: "Qwen/Qwen3-1.7B"' in (out / "README.md").read_text()
    assert str(backbone_dir) not in (out / "config.json").read_text() + (out / "README.md").read_text()
    assert config["backbone_revision"] == "v1.0"
    assert config["text_config"]["model_type"] == "qwen3" and config["text_config"]["hidden_size"] == 32
    assert config["training"]["test_reward"] == 0.7 and config["truncation_length"] == 1024


@pytest.mark.slow
def test_real_geometry_head_has_10245_values(tmp_path, tokenizer_dir):
    """A Qwen3-1.7B-sized head (2048 x 5 + 5) converts to exactly its 10,245 values; the head-only
    conversion needs the backbone's config and tokenizer, never its weights."""
    from transformers import Qwen3Config

    backbone = tmp_path / "qwen3-geometry"
    Qwen3Config(
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
    ).save_pretrained(backbone)
    for item in tokenizer_dir.iterdir():
        (backbone / item.name).write_bytes(item.read_bytes())
    manifest, weights = write_release(tmp_path / "release", 2048, seed=1)
    out = tmp_path / "out"
    result = run_tool("convert_npy.py", *convert_args(manifest, weights, out, backbone))
    assert result.returncode == 0, result.stderr
    state = load_file(out / "model.safetensors")
    assert sum(t.numel() for t in state.values()) == 10_245
    assert state["head.weight"].shape == (5, 2048)
    theta = np.load(weights)
    assert np.allclose(state["head.weight"].numpy(), theta[: 2048 * 5].reshape(2048, 5).T.astype(np.float32))
    assert "10,245" in (out / "README.md").read_text()


@pytest.mark.slow
def test_bundled_checkpoint_loads_without_the_backbone_repo(tmp_path, tokenizer_dir):
    backbone = build_backbone(tmp_path / "backbone", tokenizer_dir, seed=3)
    manifest, weights = write_release(tmp_path / "release", 32, head_hidden_dim=4, seed=2)
    out = tmp_path / "bundled"
    result = run_in_process("convert_npy.py", *convert_args(manifest, weights, out, backbone, "--bundle-backbone"))
    assert result.returncode == 0, result.stderr
    assert any(k.startswith("backbone.") for k in load_file(out / "model.safetensors"))
    reference = ReferenceRouter(str(backbone), np.load(weights), AGENTS, 4)
    queries = make_queries(6, seed=4)
    expected = [AGENTS[int(reference.pick_agent(q)["logits"].argmax())] for q in queries]
    for item in backbone.iterdir():  # the backbone repo is gone: the bundle must stand alone
        item.unlink()
    router = pipeline("text-classification", model=str(out), trust_remote_code=True)
    assert [r["label"] for r in router(queries)] == expected


def pickled_object_array(path: Path, marker: Path) -> None:
    """An .npy whose object array runs code when unpickled (it would create marker)."""

    class Exploit:
        def __reduce__(self):
            return (Path.touch, (marker,))

    array = np.empty(10245, dtype=object)
    array[0] = Exploit()
    with open(path, "wb") as handle:
        np.lib.format.write_array(handle, array, allow_pickle=True)
    assert pickle.dumps(array)  # sanity: it really is a pickle payload


BAD_CASES = {
    "wrong length": ("weights", lambda w: np.save(w, np.zeros(100)), "holds 100 values"),
    "nan": ("weights", lambda w: np.save(w, np.full(32 * 5 + 5, np.nan)), "NaN"),
    "2-d": ("weights", lambda w: np.save(w, np.zeros((5, 33))), "flat 1-D"),
    "int dtype": ("weights", lambda w: np.save(w, np.zeros(32 * 5 + 5, dtype=np.int64)), "float"),
    "missing weights": ("weights", lambda w: w.unlink(), "not found"),
    "not npy": ("weights", lambda w: w.write_text("hello"), "not a readable .npy"),
    "dim mismatch": ("release", lambda folder: write_release(folder, 64, seed=0), "hidden size 32"),
    "duplicate agents": ("manifest", lambda m: m.update(agent_order=["a", "b", "a", "c", "d"]), "repeats ['a']"),
    "empty agents": ("manifest", lambda m: m.update(agent_order=[]), "non-empty list"),
    "blank agent": ("manifest", lambda m: m.update(agent_order=["a", "", "c", "d", "e"]), "non-empty string"),
    "negative hidden": ("manifest", lambda m: m.update(head_hidden_dim=-3), "head_hidden_dim must be an integer >= 0"),
    "no agent_order": ("manifest", lambda m: m.pop("agent_order"), "has no 'agent_order'"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_artifacts_fail_with_one_line_and_write_nothing(tmp_path, backbone_dir, case):
    target, corrupt, message = BAD_CASES[case]
    manifest, weights = write_release(tmp_path / "release", 32, seed=0)
    if target == "weights":
        corrupt(weights)
    elif target == "release":  # a self-consistent release that does not fit the backbone
        corrupt(manifest.parent)
    else:
        data = json.loads(manifest.read_text())
        corrupt(data)
        manifest.write_text(json.dumps(data))
    out = tmp_path / "out"
    result = run_in_process("convert_npy.py", *convert_args(manifest, weights, out, backbone_dir))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["release"]  # no staging folder left either


def test_pickled_npy_is_refused_and_never_executed(tmp_path, backbone_dir):
    manifest, weights = write_release(tmp_path / "release", 32, seed=0)
    marker = tmp_path / "pwned"
    pickled_object_array(weights, marker)
    out = tmp_path / "out"
    result = run_in_process("convert_npy.py", *convert_args(manifest, weights, out, backbone_dir))
    assert result.returncode == 2 and "pickled" in result.stderr
    assert not marker.exists() and not out.exists()


def test_existing_output_dir_is_untouched_on_failure(tmp_path, backbone_dir):
    manifest, weights = write_release(tmp_path / "release", 32, seed=0)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    np.save(weights, np.zeros(7))
    assert run_in_process("convert_npy.py", *convert_args(manifest, weights, out, backbone_dir)).returncode == 2
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


@pytest.mark.slow
def test_unreachable_backbone_is_one_line(tmp_path):
    manifest, weights = write_release(tmp_path / "release", 32, seed=0)
    result = run_in_process(
        "convert_npy.py", *convert_args(manifest, weights, tmp_path / "out", "nobody/no-such-model")
    )
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "cannot load the backbone 'nobody/no-such-model'" in result.stderr


def test_push_to_hub_uploads_the_folder(tmp_path, backbone_dir, monkeypatch):
    """No network here: record what reaches huggingface_hub's HfApi, the boundary of our code."""
    from fnmatch import fnmatch

    import huggingface_hub

    from benchgen_router.cli.main import main

    calls = []
    monkeypatch.setattr(
        huggingface_hub.HfApi, "create_repo", lambda self, repo_id, **kw: calls.append(("create", repo_id, kw))
    )

    def upload_folder(self, *, folder_path, repo_id, allow_patterns, **kw):
        uploaded = [p.name for p in Path(folder_path).iterdir() if any(fnmatch(p.name, a) for a in allow_patterns)]
        calls.append(("upload", repo_id, sorted(uploaded)))
        return "https://huggingface.co/commit/abc"

    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    manifest, weights = write_release(tmp_path / "release", 32, seed=0)
    out = tmp_path / "out"
    convert_release(manifest, weights, out, backbone_dir)
    (out / "train_run.log").write_text("tooling output that must not be pushed")
    argv = convert_args(manifest, weights, out, backbone_dir, "--push-to-hub", "me/my-router")
    assert main(["convert", *map(str, argv)]) == 0
    assert calls[0][0] == "create" and calls[0][1] == "me/my-router" and calls[0][2]["exist_ok"]
    assert calls[1][0] == "upload" and calls[1][1] == "me/my-router"
    assert {"config.json", "model.safetensors", "modeling_router.py", "README.md"} <= set(calls[1][2])
    assert "train_run.log" not in calls[1][2]
    assert AutoConfig.from_pretrained(out, trust_remote_code=True).model_type == "benchgen_router"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"truncation_length": "abc"}, "truncation_length must be a positive integer"),
        ({"truncation_length": 0}, "truncation_length must be a positive integer"),
        ({"agent_order": ["a", "b\nc", "d", "e", "f"]}, "newline or control character"),
        ({"agent_order": ["a", "b\x07", "d", "e", "f"]}, "newline or control character"),
        ({"backbone_model": 42}, "backbone_model must be"),
    ],
)
def test_bad_provenance_in_manifest_is_one_line(tmp_path, backbone_dir, change, message):
    manifest, weights = write_release(tmp_path / "release", 32, seed=0)
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), **change}))
    result = run_in_process("convert_npy.py", *convert_args(manifest, weights, tmp_path / "out", backbone_dir))
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_output_dir_that_is_a_file_and_offline_push_are_one_line(tmp_path, backbone_dir):
    manifest, weights = write_release(tmp_path / "release", 32, seed=0)
    (tmp_path / "a-file").write_text("x")
    result = run_in_process("convert_npy.py", *convert_args(manifest, weights, tmp_path / "a-file", backbone_dir))
    assert result.returncode == 2 and "is a file" in result.stderr and "Traceback" not in result.stderr
    out = tmp_path / "out"
    result = run_in_process(
        "convert_npy.py", *convert_args(manifest, weights, out, backbone_dir, "--push-to-hub", "me/r")
    )
    assert result.returncode == 2 and "is complete, but pushing it to 'me/r' failed" in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "push it later" in errors[0]
    assert "Traceback" not in result.stderr and (out / "model.safetensors").exists()  # the folder itself is kept


@pytest.mark.slow
def test_reconversion_replaces_stale_weights_and_tokenizer_files(tmp_path, backbone_dir):
    out = tmp_path / "out"
    manifest, weights = write_release(tmp_path / "release", 32, seed=0)
    convert_release(manifest, weights, out, backbone_dir)  # a router folder, from an earlier conversion
    for stale in ("model-00001-of-00002.safetensors", "model.safetensors.index.json", "vocab.txt"):
        (out / stale).write_text("old")
    (out / "notes.md").write_text("mine")
    assert run_in_process("convert_npy.py", *convert_args(manifest, weights, out, backbone_dir)).returncode == 0
    names = {p.name for p in out.iterdir()}
    assert (
        "notes.md" in names
        and not {"model-00001-of-00002.safetensors", "model.safetensors.index.json", "vocab.txt"} & names
    )
    assert (out / "model.safetensors").stat().st_mode & 0o044  # readable by others, like any written file


def user_folder(folder: Path) -> dict[str, str]:
    """A folder of someone else's files, some with the names a router folder uses."""
    folder.mkdir()
    files = {
        "README.md": "my notes",
        "config.json": '{"model_type": "bert"}',
        "vocab.txt": "[PAD]",
        "merges.txt": "a b",
        "model-final.safetensors": "weights",
    }
    for name, text in files.items():
        (folder / name).write_text(text)
    return files


def test_a_folder_of_other_files_is_refused_and_kept(tmp_path, backbone_dir):
    manifest, weights = write_release(tmp_path / "release", 32, seed=0)
    out = tmp_path / "theirs"
    files = user_folder(out)
    result = run_in_process("convert_npy.py", *convert_args(manifest, weights, out, backbone_dir))
    assert result.returncode == 2 and "already holds files and no router" in result.stderr
    assert "--overwrite" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert {p.name: p.read_text() for p in out.iterdir()} == files


@pytest.mark.slow
def test_overwrite_writes_the_router_and_deletes_nothing_it_did_not_write(tmp_path, backbone_dir):
    manifest, weights = write_release(tmp_path / "release", 32, seed=0)
    out = tmp_path / "theirs"
    files = user_folder(out)
    result = run_in_process("convert_npy.py", *convert_args(manifest, weights, out, backbone_dir, "--overwrite"))
    assert result.returncode == 0, result.stderr
    names = {p.name for p in out.iterdir()}
    assert set(files) <= names  # vocab.txt, merges.txt and model-final.safetensors survive
    assert (out / "vocab.txt").read_text() == "[PAD]" and (out / "model-final.safetensors").read_text() == "weights"
    assert json.loads((out / "config.json").read_text())["model_type"] == "benchgen_router"


@pytest.mark.parametrize("value", [1e300, -1e39, 3.5e38])
def test_weights_that_overflow_float32_are_refused(tmp_path, backbone_dir, value):
    manifest, weights = write_release(tmp_path / "release", 32, seed=0)
    theta = np.load(weights)
    theta[3] = value
    np.save(weights, theta)
    result = run_in_process("convert_npy.py", *convert_args(manifest, weights, tmp_path / "out", backbone_dir))
    assert result.returncode == 2 and "overflow float32" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "provenance",
    [
        {"cross_validation": {"folds": "five", "router_mean": "0.9", "router_std": None}},
        {"baselines": "x", "test_reward": "high", "n_train": [1, 2], "model_id": "a|b\n---\nc"},
        {"cross_validation": 3, "train_reward": float("inf"), "beats_best_fixed_agent": "yes"},
    ],
)
def test_provenance_of_any_type_is_left_out_and_the_card_stays_valid(tmp_path, backbone_dir, provenance):
    """Readers rely only on agent_order, embedding_dim, head_hidden_dim and backbone_model: a
    provenance field of the wrong type is left out of the report with a warning naming it, and the
    card's front matter stays valid YAML."""
    manifest, weights = write_release(tmp_path / "release", 32, seed=0, backbone=str(backbone_dir))
    data = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**data, **provenance}).replace("Infinity", "1e999"))
    out = tmp_path / "out"
    result = run_in_process("convert_npy.py", *convert_args(manifest, weights, out, backbone_dir))
    assert result.returncode == 0, result.stderr
    bad = [key for key, value in provenance.items() if key != "model_id"]
    for key in bad:
        assert f"manifest.json.{key}" in result.stderr and "left out of the training report" in result.stderr
    report = json.loads((out / "training_report.json").read_text())
    assert all(report.get(key) is None for key in bad) and report["n_test"] == data["n_test"]
    card = (out / "README.md").read_text()
    front, body = card.split("---\n", 2)[1:]
    keys = [line.split(":")[0] for line in front.splitlines() if line and not line.startswith("- ")]
    assert keys == ["library_name", "pipeline_tag", "license", "tags"]  # a local path is no base_model
    assert "\n---\n" not in body.split("# ", 1)[1]


def test_saved_tokenizer_carries_no_loading_flags(converted):
    folder, _ = converted[0]
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    assert not {"local_files_only", "is_local", "cache_dir", "token", "revision"} & set(settings)


POINTS = {"quality": (0.0, 0.0), "cheap": (1.0, 0.0)}


@pytest.mark.slow
def test_a_bundled_release_with_operating_points_routes_each_with_its_head(tmp_path, tokenizer_dir):
    backbone = build_backbone(tmp_path / "backbone", tokenizer_dir, seed=5)
    manifest, weights, thetas = write_operating_release(tmp_path / "release", 32, POINTS, "cheap", seed=3)
    out = tmp_path / "bundled"
    result = run_in_process("convert_npy.py", *convert_args(manifest, weights, out, backbone, "--bundle-backbone"))
    assert result.returncode == 0, result.stderr
    queries = make_queries(6, seed=8)
    expected = {}
    for name, theta in thetas.items():
        reference = ReferenceRouter(str(backbone), theta, AGENTS)
        expected[name] = [AGENTS[i] for i in reference.logits(reference.embed(queries)).argmax(axis=1)]
    for item in backbone.iterdir():
        item.unlink()
    for name in thetas:
        router = pipeline(
            "text-classification", model=str(out), trust_remote_code=True, model_kwargs={"operating_point": name}
        )
        assert [r["label"] for r in router(queries)] == expected[name]
    config = json.loads((out / "config.json").read_text())
    assert config["operating_point"] == "cheap" and config["operating_points"]["cheap"]["cost_weight"] == 1.0
    assert "operating_points" not in config["training"]


def _drop(folder: Path, name: str) -> None:
    from safetensors.numpy import load_file as load_np
    from safetensors.numpy import save_file

    heads = load_np(str(folder / "operating_heads.safetensors"))
    heads.pop(name)
    save_file(heads, str(folder / "operating_heads.safetensors"))


OPERATING_BAD_CASES = {
    "no heads file": (lambda folder: (folder / "operating_heads.safetensors").unlink(), "not found"),
    "a point without its head": (lambda folder: _drop(folder, "quality"), "no head for operating point 'quality'"),
    "another default head": (
        lambda folder: np.save(folder / "head_weights.npy", np.zeros(32 * 5 + 5)),
        "is not the head of the default operating point 'cheap'",
    ),
    "bad point name": (
        lambda folder: _edit(folder, {"operating_points": {"1x": {"cost_weight": 0, "latency_weight": 0}}}),
        "must start with a letter",
    ),
    "negative weight": (
        lambda folder: _edit(folder, {"operating_points": {"cheap": {"cost_weight": -1, "latency_weight": 0}}}),
        "needs a number cost_weight >= 0",
    ),
    "unknown default": (
        lambda folder: _edit(folder, {"default_operating_point": "fast"}),
        "is not one of its operating points",
    ),
}


def _edit(folder: Path, changes: dict) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest.update(changes)
    (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(OPERATING_BAD_CASES))
def test_bad_operating_point_releases_fail_with_one_line_and_write_nothing(tmp_path, backbone_dir, case):
    corrupt, message = OPERATING_BAD_CASES[case]
    manifest, weights, _ = write_operating_release(tmp_path / "release", 32, POINTS, "cheap")
    corrupt(tmp_path / "release")
    out = tmp_path / "out"
    result = run_in_process("convert_npy.py", *convert_args(manifest, weights, out, backbone_dir))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and message in lines[0], result.stderr
    assert not out.exists()


@pytest.mark.slow
def test_card_note_is_appended_to_the_card_and_a_missing_note_file_is_one_line(tmp_path, backbone_dir):
    manifest, weights = write_release(tmp_path / "release", 32, seed=4)
    note = tmp_path / "note.md"
    note.write_text("## About this router\n\nTrained for a test.\n")
    out = tmp_path / "router"
    result = run_in_process("convert", *convert_args(manifest, weights, out, backbone_dir, "--card-note", f"@{note}"))
    assert result.returncode == 0, result.stderr
    card = (out / "README.md").read_text()
    assert "## About this router\n\nTrained for a test." in card and card.index("Trained for") < card.index("end of")
    missing = run_in_process(
        "convert", *convert_args(manifest, weights, tmp_path / "other", backbone_dir, "--card-note", "@/no/note.md")
    )
    assert missing.returncode == 2 and missing.stderr.strip().splitlines() == [
        "error: cannot read --card-note file /no/note.md (No such file or directory)."
    ]
    assert not (tmp_path / "other").exists()


def test_the_backbones_own_folder_is_never_written_over(tmp_path, tokenizer_dir):
    backbone = build_backbone(tmp_path / "backbone", tokenizer_dir)
    manifest, weights = write_release(tmp_path / "release", 32, backbone=str(backbone))
    before = {p.name: p.read_bytes() for p in backbone.iterdir() if p.is_file()}
    for extra in ([], ["--overwrite"]):
        code = cli(
            "convert", "--manifest", manifest, "--weights", weights, "--output-dir", backbone, "--backbone", backbone,
            *extra,
        )  # fmt: skip
        assert code == 2
    assert {p.name: p.read_bytes() for p in backbone.iterdir() if p.is_file()} == before
    with pytest.raises(InputError, match="is the backbone's folder"):
        convert_release_api(manifest, weights, backbone, overwrite=True)  # the manifest names it
