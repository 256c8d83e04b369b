"""Writing a router folder (config, weights, code, tokenizer, card, training report): one function for every tool.

`write_router_folder` stages everything in a temporary folder next to the target and moves it into
place only when all of it was written, so a failed run leaves the folder as it was. The config,
the weights and the two code files come from `RouterModel.save_pretrained` (head-only unless the
backbone is bundled); the tokenizer, the model card and training_report.json are added here.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from benchgen_router.errors import InputError, first_line, setting_error
from benchgen_router.files import staging_dir, to_json
from benchgen_router.release.card import merge_card
from benchgen_router.release.report import REPORT_FILE, TrainingReport

logger = logging.getLogger("benchgen_router")

# What a pushed router folder holds: the Hub model files, never the tooling around them.
HUB_FILES = (
    "README.md",
    "config.json",
    REPORT_FILE,
    "model*.safetensors",
    "model.safetensors.index.json",
    "configuration_router.py",
    "modeling_router.py",
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.*",
    "merges.txt",
    "chat_template.*",
    "router_head.py",
    "convert_npy.py",
)
# Files a router folder's writer owns besides config, code and card. In a folder that already holds
# a router they are replaced, so stale weights (old shards, an index) or another backbone's
# tokenizer files never survive next to the new ones. In any other folder nothing is deleted.
REPLACED_PATTERNS = (
    REPORT_FILE,
    "model*.safetensors*",
    "pytorch_model*.bin*",
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.*",
    "merges.txt",
    "chat_template.*",
)
# Loading options that from_pretrained records in tokenizer_config.json; a published folder must
# not carry them (`local_files_only: true` would make every user's load offline-only).
LOADING_FLAGS = (
    "local_files_only",
    "is_local",
    "cache_dir",
    "force_download",
    "proxies",
    "token",
    "revision",
    "subfolder",
    "trust_remote_code",
    "_commit_hash",
)


def is_router_folder(folder: Path) -> bool:
    """True when `folder` holds a BenchGen router (its config.json says so)."""
    try:
        return json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type") == "benchgen_router"
    except (OSError, ValueError, AttributeError):
        return False


def check_output_folder(folder: Path, overwrite: bool) -> None:
    """Refuse to write into a non-empty folder that does not hold a router, unless overwrite."""
    if folder.exists() and not folder.is_dir():
        raise InputError(f"output folder {folder} is a file; pass a folder path.")
    if folder.is_dir() and any(folder.iterdir()) and not is_router_folder(folder) and not overwrite:
        raise setting_error(
            f"output folder {folder} already holds files and no router; pass an empty or new folder, "
            "or {overwrite} to write the router's files into it (nothing else there is deleted)."
        )


# ---------------------------------------------------------------------------------------------
# The folder


def save_tokenizer(tokenizer: Any, folder: Path) -> None:
    """The tokenizer files, loadable by both transformers lines and free of loading flags."""
    tokenizer.save_pretrained(folder)
    config_file = folder / "tokenizer_config.json"
    if config_file.exists():
        settings = json.loads(config_file.read_text(encoding="utf-8"))
        for flag in LOADING_FLAGS:
            settings.pop(flag, None)
        # 5.x names generic tokenizer.json tokenizers "TokenizersBackend", a class 4.x does not have.
        if settings.get("tokenizer_class") == "TokenizersBackend":
            settings["tokenizer_class"] = "PreTrainedTokenizerFast"
        config_file.write_text(json.dumps(settings, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_router_folder(
    folder: Path, model: Any, tokenizer: Any, card: str, report: TrainingReport, overwrite: bool = False
) -> Path:
    """Write a complete router folder: config, weights (head-only unless bundled), the two code
    files, the tokenizer, the model card and the training report. Refuses a non-empty folder that
    holds no router unless `overwrite`; deletes nothing it did not write."""
    folder = Path(folder)
    check_output_folder(folder, overwrite)
    replacing = is_router_folder(folder)
    existing_card = (folder / "README.md").read_text(encoding="utf-8") if (folder / "README.md").is_file() else None
    with staging_dir(folder) as staging:
        try:
            model.save_pretrained(staging)
            save_tokenizer(tokenizer, staging)
        except OSError as err:
            raise InputError(f"cannot write the router into {folder} ({first_line(err)}).") from None
        (staging / "README.md").write_text(merge_card(card, existing_card), encoding="utf-8")
        (staging / REPORT_FILE).write_text(to_json(report.to_dict(), indent=2) + "\n", encoding="utf-8")
        if replacing:
            written = {path.name for path in staging.iterdir()}
            for pattern in REPLACED_PATTERNS:
                for stale in folder.glob(pattern):
                    if stale.is_file() and stale.name not in written:
                        stale.unlink()
    return folder


def push_folder(folder: Path, repo_id: str) -> str:
    """Upload a router folder's Hub files (HUB_FILES, never tooling) with huggingface_hub; the token
    comes from the usual HF_TOKEN or `huggingface-cli login`."""
    from huggingface_hub import HfApi

    api = HfApi()
    try:
        api.create_repo(repo_id, repo_type="model", exist_ok=True)
        commit = api.upload_folder(
            folder_path=str(folder),
            repo_id=repo_id,
            repo_type="model",
            allow_patterns=list(HUB_FILES),
            commit_message="Upload BenchGen router",
        )
    except Exception as err:  # HTTP errors, offline mode, no network (httpx), no token: all one line
        raise InputError(
            f"{folder} is complete, but pushing it to '{repo_id}' failed ({first_line(err)}); push it later with "
            f"`benchgen-router convert ... --push-to-hub {repo_id}` or `huggingface-cli upload {repo_id} {folder}` "
            "once the Hub is reachable and you are logged in."
        ) from None
    logger.info("pushed %s to %s", folder, repo_id)
    return str(commit)


def save_recalibrated(model: Any, tokenizer: Any, source: str | None, folder: Path) -> Path:
    """A router whose probability head was recalibrated on new traffic (routing.recalibrate), written as
    a complete folder: its card and training report are the source folder's when it has them."""
    from benchgen_router.release.report import read_report

    source_dir = Path(source) if source and Path(source).is_dir() else None
    card_file = source_dir / "README.md" if source_dir else None
    card = card_file.read_text(encoding="utf-8") if card_file and card_file.is_file() else "# BenchGen router\n"
    report_file = source_dir / REPORT_FILE if source_dir else None
    report = read_report(report_file) if report_file and report_file.is_file() else TrainingReport()
    calibration = model.config.tradeoff_calibration
    report.extra["recalibrated_on_rows"] = calibration["rows"] if calibration else None
    return write_router_folder(Path(folder), model, tokenizer, card, report)
