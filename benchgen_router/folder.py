"""Writing a router folder (config, weights, code, tokenizer, card): one function for every tool.

`write_router_folder` stages everything in a temporary folder next to the target and moves it into
place only when all of it was written, so a failed run leaves the folder as it was. The config,
the weights and the two code files come from `RouterModel.save_pretrained` (head-only unless the
backbone is bundled); the tokenizer and the model card are added here.
"""

from __future__ import annotations

import json
import logging
import math
import re
import string
from pathlib import Path
from typing import Any

from benchgen_router.errors import InputError, first_line
from benchgen_router.files import staging_dir
from benchgen_router.head import head_param_count

logger = logging.getLogger("benchgen_router")

CARD_TEMPLATE = Path(__file__).resolve().parent / "model_card.md"
CARD_END = "<!-- end of router card -->"
# What a pushed router folder holds: the Hub model files, never the tooling around them.
HUB_FILES = (
    "README.md",
    "config.json",
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
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


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
        raise InputError(
            f"output folder {folder} already holds files and no router; pass an empty or new folder, "
            "or --overwrite to write the router's files into it (nothing else there is deleted)."
        )


# ---------------------------------------------------------------------------------------------
# The model card


def _text(value: Any) -> str:
    """A value as one table cell: numbers rounded, anything else as compact single-line text."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.4f}" if math.isfinite(value) else "n/a"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    text = " ".join(text.split()).replace("|", "\\|")  # one line; a pipe would end the cell
    return text if len(text) <= 120 else text[:117] + "..."


def _number(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, int | float) and not isinstance(value, bool) else _text(value)


def figure_rows(training: dict[str, Any]) -> list[tuple[str, str]]:
    """The card's training figures. Provenance may hold anything (readers rely on nothing but the
    reference's four keys), so every value is rendered defensively."""
    baselines = training.get("baselines") if isinstance(training.get("baselines"), dict) else {}
    rows = [
        ("rewards dataset", _text(training.get("rewards_dataset"))),
        ("rows (train / held out)", f"{_text(training.get('n_train'))} / {_text(training.get('n_test'))}"),
        ("train reward", _number(training.get("train_reward"))),
        ("held-out reward (router)", _number(training.get("test_reward"))),
        ("held-out best fixed agent", _number(baselines.get("best_fixed_agent"))),
        ("held-out uniform random", _number(baselines.get("random_agent"))),
        ("held-out oracle", _number(baselines.get("oracle"))),
        ("beats best fixed agent", _text(training.get("beats_best_fixed_agent"))),
        ("CMA-ES generations", _text(training.get("cma_generations_run"))),
    ]
    cv = training.get("cross_validation")
    if isinstance(cv, dict):
        folds = _text(cv.get("folds"))
        rows.append(
            (f"{folds}-fold CV reward (router)", f"{_number(cv.get('router_mean'))} ± {_number(cv.get('router_std'))}")
        )
        rows.append((f"{folds}-fold CV best fixed agent", _number(cv.get("best_fixed_mean"))))
    return rows


def _seconds(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, int | float) and not isinstance(value, bool) else _text(value)


def _percent(value: Any, of: Any) -> str:
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (value, of))
    return f"{100 * value / of:.0f}%" if numbers and of else "n/a"


def _cv_row(label: str, point: dict[str, Any], reference: dict[str, Any], agents: list[str]) -> str:
    """One card table row of a cross-validated point (frontier.CVPoint fields)."""
    share = point.get("share") if isinstance(point.get("share"), dict) else {}
    shares = "/".join(f"{100 * share[a]:.0f}" if isinstance(share.get(a), int | float) else "?" for a in agents)
    return (
        f"| {label} | {_number(point.get('reward'))} ± {_number(point.get('reward_std_repeats'))} | "
        f"{_number(point.get('delta_reward'))} ± {_number(point.get('delta_se'))} | "
        f"{_number(point.get('cost_per_1k'))} ({_percent(point.get('cost_per_1k'), reference.get('cost_per_1k'))}) | "
        f"{_seconds(point.get('latency_s'))} ({_percent(point.get('latency_s'), reference.get('latency_s'))}) | "
        f"{shares} |"
    )


def value_section(config: Any) -> str:
    """The card's section on quality, cost and latency (empty when the trainer measured none): each
    operating point's cross-validated figures next to the fixed agents' on the same folds, and how to
    choose a point."""
    training = config.training if isinstance(config.training, dict) else {}
    frontier = training.get("frontier") if isinstance(training.get("frontier"), dict) else None
    points = config.operating_points or {}
    if frontier is None and not points:
        return ""
    agents = config.agent_order
    stored = [p for p in (frontier or {}).get("points", []) if isinstance(p, dict)]
    by_name = {p.get("name"): p for p in stored}
    reference_name = (frontier or {}).get("reference")
    reference = by_name.get(reference_name, {})
    lines = ["## Quality, cost and latency", ""]
    if frontier is not None:
        search = frontier.get("search", {})
        lines += [
            f"Measured by {_text(frontier.get('repeats'))}x repeated {_text(frontier.get('folds'))}-fold "
            f"cross-validation over the {_text(frontier.get('rows'))} labelled tasks "
            f"(CV seed {_text(frontier.get('cv_seed'))}, search "
            f"`{json.dumps(search, sort_keys=True)}`): every head was retrained on each training fold and scored on "
            "the held-out tasks' measured reward, billed cost and latency. Reward ± the standard deviation over "
            f"repeats; Δ ± se: the paired difference to `{_text(reference_name)}` (the best fixed agent) and its "
            'standard error over tasks, which is what "equal quality" has to be judged against. Cost in USD per '
            "1,000 queries, latency in seconds per query, each with its share of the reference's; picks in % per "
            f"agent ({'/'.join(agents)}). Rows marked *plain questions* score the same held-out heads on the tasks "
            "as a user would type them: the prompt without its label and answer-format instruction.",
            "",
        ]
    header = [
        "| policy | reward ± rep | Δ ± se | USD / 1k | latency s | picks % |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    rows = []
    if points:
        for name in sorted(points, key=lambda n: (points[n].get("cost_weight", 0), points[n].get("latency_weight", 0))):
            settings = points[name] if isinstance(points[name], dict) else {}
            weights = ", ".join(
                f"{kind} {value:g}" if isinstance(value, int | float) and not isinstance(value, bool) else f"{kind} ?"
                for kind, value in (("cost", settings.get("cost_weight")), ("latency", settings.get("latency_weight")))
            )
            label = f"`{name}`{' (default)' if name == config.operating_point else ''}: {weights}"
            cv = settings.get("cv") if isinstance(settings.get("cv"), dict) else None
            rows.append(_cv_row(label, cv, reference, agents) if cv else f"| {label} | n/a | n/a | n/a | n/a | |")
            if isinstance(settings.get("cv_plain"), dict):
                rows.append(_cv_row(f"`{name}`, plain questions", settings["cv_plain"], reference, agents))
    else:
        rows += [
            _cv_row(f"router ({p.get('name')})", p, reference, agents) for p in stored if p.get("kind") == "router"
        ]
    rows += [
        _cv_row(
            _text(p.get("name")) + (" (in-sample bound)" if p.get("kind") == "oracle" else ""), p, reference, agents
        )
        for p in stored
        if p.get("kind") in ("fixed", "best_fixed_train", "random") or p.get("name") == "oracle (cheapest best)"
    ]
    lines += header + rows + [""]
    if frontier is not None and isinstance(frontier.get("headline"), dict):
        from benchgen_router.frontier import headline_text

        aiq = frontier.get("aiq") if isinstance(frontier.get("aiq"), dict) else {}
        window = frontier.get("aiq_window_cost_per_1k") or [None, None]
        names = {f"router lc{p.get('cost_weight', 0):g}_ll{p.get('latency_weight', 0):g}": n for n, p in points.items()}
        lines += [f"In short: {headline_text(frontier['headline'], names)}.", ""]
        if aiq:
            lines += [
                "Area under the reward/cost frontier (AIQ: mean best reachable reward over the cost range "
                f"{_number(window[0])}-{_number(window[-1])} USD per 1,000 queries, mixing policies at random): "
                + ", ".join(f"{name} {_number(value)}" for name, value in aiq.items())
                + ".",
                "",
            ]
    target = training.get("target_mode") if isinstance(training.get("target_mode"), dict) else None
    if target is not None:
        nested = (target.get("nested_cv") or {}).get("point") or {}
        lines += [
            f"The default was chosen by target mode (eps {target.get('eps')}): {target.get('rule')}. "
            "That rule, run inside nested cross-validation so that the choice never sees the tasks it is scored on, "
            f"reaches {_number(nested.get('reward'))} ± {_number(nested.get('reward_std_repeats'))} at "
            f"{_number(nested.get('cost_per_1k'))} USD per 1,000 queries and {_seconds(nested.get('latency_s'))} s: "
            "the honest expectation for a point chosen this way.",
            "",
        ]
    if points:
        default = _text(config.operating_point)
        lines += [
            f"Each operating point is its own head; `{default}` answers when none is named. Choose one per call:",
            "",
            "```python",
            f'model(**batch, operating_point="{default}")',
            f'AutoModel.from_pretrained(repo, trust_remote_code=True, operating_point="{default}")',
            f'options = {{"operating_point": "{default}"}}',
            'pipeline("text-classification", model=repo, trust_remote_code=True, model_kwargs=options)',
            "```",
            "",
            f'With the `benchgen-router` package: `pick_agent(query, operating_point="{default}")`, '
            f'`benchgen-router route --operating-point {default} ...`, or `"operating_point": "{default}"` in a '
            "request to its HTTP service.",
            "",
        ]
    return "\n".join(lines) + "\n"


def fit_row(record: dict[str, Any]) -> str:
    """The card row of what the guard was fitted and calibrated on."""
    fit, held = _text(record.get("n_fit")), _text(record.get("n_calibration"))
    if "n_outside" not in record:
        return f"| prompts (fit / calibration) | {fit} / {held} |"
    outside = _text(record.get("n_outside"))
    label = "texts fitted (prompt views, typed questions) / outside queries / prompts held out"
    return f"| {label} | {fit} / {outside} / {held} |"


def guard_section(config: Any) -> str:
    """The card's section on the out-of-distribution guard (empty for a router without one), from
    config.ood_calibration: the calibration and, when the trainer measured it, the OOD query set."""
    if getattr(config, "ood_threshold", None) is None:
        return ""
    record = config.ood_calibration if isinstance(config.ood_calibration, dict) else {}
    fallback = _text(config.ood_fallback_agent)
    if getattr(config, "ood_discriminative", False):
        method = [
            "arbitrary pick from the head, so the router flags them and names a fallback agent. The score is a",
            "logistic score of the query's unit-length embedding and its squared Mahalanobis distance to the mean",
            "of in-distribution texts (stored as `ood_weight`, `ood_distance_weight`, `ood_bias`, `ood_mean` and",
            "`ood_precision` in `model.safetensors`), fitted on the task prompts, shorter views of them and",
            "in-domain questions as users type them, against outside queries (chit-chat, writing, code, other",
            f"languages). A query whose score exceeds the threshold {_number(config.ood_threshold)} is flagged.",
        ]
    else:
        method = [
            "arbitrary pick from the head, so the router flags them and names a fallback agent. The score is the",
            "squared Mahalanobis distance of the query's unit-length embedding to the mean of in-distribution",
            "prompts (shrinkage covariance, stored as `ood_mean` and `ood_precision` in `model.safetensors`); a",
            f"query whose score exceeds the threshold {_number(config.ood_threshold)} is flagged.",
        ]
    fallbacks = {name: config.fallback_agent(name) for name in config.operating_points or {}}
    lines = [
        "## Out-of-distribution guard",
        "",
        "Queries unlike the prompts the head was trained for (another language, another domain) get a close to",
        *method,
        "",
        "| | |",
        "| --- | ---: |",
        f"| fallback agent | `{fallback}`"
        + (f" ({_text(record['fallback_rule'])})" if "fallback_rule" in record else "")
        + " |",
        *(f"| fallback at `{name}` | `{agent}` |" for name, agent in fallbacks.items()),
        f"| keep share targeted | {_text(record.get('keep_share'))} |",
        fit_row(record),
        f"| calibration prompts kept | {_number(record.get('calibration_kept_share'))} |",
    ]
    for key, label in (
        ("plain_calibration_kept_share", "held-out in-domain questions kept"),
        ("plain_questions_kept_share", "plain in-domain questions kept (`plain_queries.jsonl`, never fitted)"),
        ("labelled_formatted_flagged_share", "labelled tasks flagged, as formatted"),
        ("labelled_plain_flagged_share", "labelled tasks flagged, as plain questions"),
    ):
        if key in record:
            lines.append(f"| {label} | {_number(record[key])} |")
    evaluation = record.get("evaluation") if isinstance(record.get("evaluation"), dict) else {}
    groups = evaluation.get("groups") if isinstance(evaluation.get("groups"), dict) else {}
    if groups:
        lines += [
            f"| in-distribution kept ({_text(evaluation.get('in_distribution_count'))} prompts) | "
            f"{_number(evaluation.get('in_distribution_kept_share'))} |",
            f"| AUROC, in-distribution vs all {_text(evaluation.get('ood_queries'))} OOD queries | "
            f"{_number(evaluation.get('auroc'))} |",
            "",
            f"Measured on `{_text(evaluation.get('ood_queries_file'))}`; in distribution: "
            f"{_text(evaluation.get('in_distribution_rows'))}.",
            "",
            "| OOD group | queries | flagged | AUROC |",
            "| --- | ---: | ---: | ---: |",
        ]
        for group, figures in groups.items():
            figures = figures if isinstance(figures, dict) else {}
            lines.append(
                f"| {_text(group)} | {_text(figures.get('queries'))} | {_number(figures.get('flagged_share'))} | "
                f"{_number(figures.get('auroc'))} |"
            )
    lines += [
        "",
        "`model(**inputs)` returns `ood_scores`, `out_of_distribution` and `picks`, the decision with the",
        "operating point's fallback applied, next to the logits (which stay the head's). Every entry point",
        "returns that decision: the text-classification pipeline's top label, `pick_agent`, `benchgen-router",
        'route` and its service (a flagged result has `"out_of_distribution": true`, the fallback as',
        "`picked_agent` and the head's choice as `head_pick`). `AutoModel.from_pretrained(...,",
        "trust_remote_code=True, ood_guard=False)` switches the guard off.",
        "",
        "",
    ]
    return "\n".join(lines)


QUERY_LINE = (
    "Before embedding, a query loses the benchmark wrapper the head was trained with (the labels and\n"
    "answer-format instructions listed as `query_format` in config.json; `config.canonical_query` applies\n"
    "them, and the pipeline does so itself), so a plain question and its formatted prompt get one decision.\n"
)


def render_card(
    config: Any, backbone: str, revision: str | None, note: str | None = None, repo: str = "<this repo>"
) -> str:
    """README.md of a router folder: Hub metadata (YAML front matter) and what a user needs to know."""
    agents = config.agent_order
    training = config.training if isinstance(config.training, dict) else {}
    n_params = head_param_count(config.embedding_dim, len(agents), config.head_hidden_dim)
    head_kind = (
        "linear (logits = embedding @ W + b)"
        if config.head_hidden_dim == 0
        else f"an MLP (a tanh hidden layer of {config.head_hidden_dim})"
    )
    at_revision = f" at revision `{revision}`" if revision else ""
    if config.bundled_backbone:
        weights_line = (
            "`model.safetensors` holds the backbone and the head: this folder loads with no other repository."
        )
    else:
        points = len(config.operating_points or {})
        held = f"the {points} heads, one per operating point ({points} x {n_params:,} values)" if points else None
        weights_line = (
            f"`model.safetensors` holds only {held or f'the head ({n_params:,} values)'}; the backbone's weights "
            f"load from `{backbone}`{at_revision} through the normal Hub cache."
        )
    # JSON strings are valid YAML scalars, so any id is quoted safely; a path is not a Hub model.
    base_model_line = f"base_model: {json.dumps(backbone)}" if _HUB_ID.match(backbone) else ""
    values = {
        "base_model_line": base_model_line,
        "title": _text(training.get("model_id") or "BenchGen Router Lite"),
        "backbone": backbone,
        "embedding_dim": config.embedding_dim,
        "n_agents": len(agents),
        "head_kind": head_kind[:-1] + "; one head per operating point, see below)"
        if config.operating_points
        else head_kind,
        "n_params": f"{n_params:,}",
        "weights_line": weights_line,
        "pool_rows": "\n".join(f"| {i} | `{agent}` |" for i, agent in enumerate(agents)),
        "figure_rows": "\n".join(f"| {name} | {value} |" for name, value in figure_rows(training)),
        "repo": repo,
        "truncation_length": config.truncation_length,
        "query_line": QUERY_LINE if config.query_format else "",
        "card_note": f"\n{note.strip()}\n" if note and note.strip() else "",
        "guard_section": guard_section(config),
        "value_section": value_section(config),
    }
    card = string.Template(CARD_TEMPLATE.read_text(encoding="utf-8")).substitute(values)
    return re.sub(r"\n\n+(?=license:)", "\n", card)  # no blank line where base_model was left out


def merge_card(card: str, existing: str | None) -> str:
    """The new card, followed by whatever the folder's README kept after the previous card's end
    marker (the repository root's README carries the project's documentation there)."""
    if existing and CARD_END in existing:
        return card.rstrip("\n") + existing.split(CARD_END, 1)[1]
    return card


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


def write_router_folder(folder: Path, model: Any, tokenizer: Any, card: str, overwrite: bool = False) -> Path:
    """Write a complete router folder: config, weights (head-only unless bundled), the two code
    files, the tokenizer and the model card. Refuses a non-empty folder that holds no router unless
    `overwrite`; deletes nothing it did not write."""
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
