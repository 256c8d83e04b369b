"""folder.py: the folder checks."""

from __future__ import annotations

import json

import pytest

from benchgen_router.errors import InputError
from benchgen_router.release.folder import check_output_folder, is_router_folder


def test_folders_that_hold_something_else_are_refused(tmp_path):
    check_output_folder(tmp_path / "new", overwrite=False)  # a new folder is fine
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.md").write_text("x")
    with pytest.raises(InputError, match="already holds files and no router"):
        check_output_folder(tmp_path / "theirs", overwrite=False)
    check_output_folder(tmp_path / "theirs", overwrite=True)
    (tmp_path / "router").mkdir()
    (tmp_path / "router" / "config.json").write_text(json.dumps({"model_type": "benchgen_router"}))
    assert is_router_folder(tmp_path / "router") and not is_router_folder(tmp_path / "theirs")
    check_output_folder(tmp_path / "router", overwrite=False)  # a router folder is replaced
