"""hardware.py: CPU features, the dtype rule (bfloat16 only where it is not emulated, unless forced),
devices, batch budgets and threads."""

from __future__ import annotations

import os

import pytest
import torch

from benchgen_router import hardware
from benchgen_router.errors import InputError


def test_cpu_features_and_the_bf16_rule_follow_the_cpu_flags():
    features = hardware.cpu_features()
    assert set(features) >= {"avx2", "avx512_bf16", "amx_bf16"} and all(isinstance(v, bool) for v in features.values())
    assert hardware.bf16_is_fast("cpu") == (features["avx512_bf16"] or features["amx_bf16"])
    summary = hardware.cpu_summary()
    assert f"{os.cpu_count()} CPUs" in summary and ("avx" in summary or "no avx2/avx512/amx" in summary)


def avx2_only() -> dict[str, bool]:
    """An AMD EPYC of the kind CI may run on: AVX2, no avx512, no AMX."""
    return {name: name == "avx2" for name in hardware.CPU_FEATURES}


def test_emulated_bfloat16_is_refused_unless_forced(monkeypatch, caplog):
    monkeypatch.setattr(hardware, "cpu_features", avx2_only)
    assert not hardware.bf16_is_fast("cpu")
    with pytest.raises(InputError, match="bfloat16 would be emulated"):
        hardware.resolve_dtype("bfloat16", "cpu")
    assert hardware.resolve_dtype("bfloat16", "cpu", allow_emulated=True) == torch.bfloat16
    assert "emulated" in caplog.text
    assert hardware.resolve_dtype("auto", "cpu") == "auto" and hardware.resolve_dtype(None, "cpu") == "auto"
    assert hardware.resolve_dtype("float32", "cpu") == torch.float32


def test_bfloat16_is_taken_where_the_cpu_has_matrix_units(monkeypatch):
    monkeypatch.setattr(hardware, "cpu_features", lambda: {**avx2_only(), "amx_bf16": True})
    assert hardware.resolve_dtype("bfloat16", "cpu") == torch.bfloat16


def test_auto_never_picks_emulated_bfloat16_for_a_bfloat16_router(converted, monkeypatch, tmp_path):
    """A router whose config records bfloat16 runs float32 under dtype auto on an AVX2-only CPU."""
    import json
    import shutil

    from benchgen_router.loading import load_router

    folder, _ = converted[0]
    copy = tmp_path / "bf16-router"
    shutil.copytree(folder, copy)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))
    monkeypatch.setattr(hardware, "cpu_features", avx2_only)
    model, _ = load_router(copy)
    assert model.backbone.dtype == torch.float32


@pytest.mark.parametrize(("value", "message"), [("bogus", "unknown dtype"), ("int8", "unknown dtype")])
def test_unknown_dtypes_are_one_line(value, message):
    with pytest.raises(InputError, match=message):
        hardware.resolve_dtype(value, "cpu")


def test_devices_are_checked():
    with pytest.raises(InputError, match="unknown device 'warp'"):
        hardware.check_device("warp")
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="no CUDA GPU"):
            hardware.resolve_device("cuda:0")
    assert hardware.resolve_device(None) in ("cpu", "cuda")


def test_default_batch_tokens_follow_device_and_dtype():
    assert hardware.default_batch_tokens("cpu", torch.float32) == 2048
    assert hardware.default_batch_tokens("cpu", torch.bfloat16) == 4096
    assert hardware.default_batch_tokens("cuda:0", torch.float32) == 32768


def test_threads_default_to_the_cpus_this_process_may_use():
    before = torch.get_num_threads()
    try:
        assert hardware.set_threads(1) == 1 and torch.get_num_threads() == 1
        assert hardware.set_threads(None) == len(os.sched_getaffinity(0)) == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
