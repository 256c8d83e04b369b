"""A training run's settings: the typed config, its defaults and the checks made before any work."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

from benchgen_router import ood as ood_defaults
from benchgen_router.data import DEFAULT_TEST_SPLIT
from benchgen_router.errors import InputError, setting_error
from benchgen_router.manifest import DEFAULT_TRUNCATION_LENGTH
from benchgen_router.training.search import DEFAULT_CMA_LIBRARY

logger = logging.getLogger("benchgen_router")


DEFAULT_BACKBONE = "Qwen/Qwen3-1.7B"
DEFAULT_REWARD_COLUMN = "mean_reward"


@dataclass
class TrainConfig:
    """Everything a run reads; `benchgen-router train --help` describes each (the flag of a field is
    its name with dashes)."""

    # data
    rewards: str
    tasks: str
    output_dir: Path
    rewards_id: str | None = None
    reward_column: str = DEFAULT_REWARD_COLUMN  # or collect's feedback_reward (users' feedback, judge elsewhere)
    test_split: str = DEFAULT_TEST_SPLIT
    cv_folds: int = 5
    # backbone and head
    backbone: str = DEFAULT_BACKBONE
    backbone_id: str | None = None  # what the manifest records (default: backbone)
    backbone_revision: str | None = None
    head_hidden_dim: int = 0
    head_kind: str = "cmaes"  # or "probability": a trade-off chosen per request (training/probability.py)
    pooling: str = "last-layer"  # or "every-layer" (a probability head): every hidden state's mean
    neighbour_outcomes: int = 0  # k > 0 (a probability head): the k nearest training queries' outcomes as inputs
    truncation_length: int = DEFAULT_TRUNCATION_LENGTH
    device: str = "cpu"
    dtype: str = "float32"
    batch_size: int | None = None
    max_batch_tokens: int | None = None
    allow_emulated_bf16: bool = False
    cache_dir: Path | None = None
    no_cache: bool = False
    # fine-tuning the backbone with a probability head (training/finetune.py)
    finetune: bool = False
    finetune_epochs: int = 3
    finetune_layers: int | None = None  # top layers trained; None: every layer
    finetune_learning_rate: float = 3e-5
    finetune_batch_size: int = 32
    finetune_patience: int = 1
    finetune_validation_share: float = 0.1
    # search
    sigma0: float = 0.5
    generations: int = 60
    seed: int = 42
    popsize: int | None = None
    cma_library: str = DEFAULT_CMA_LIBRARY
    ensemble_seeds: list[int] | None = None
    shrink: float = 0.0
    # cost and latency
    calls: Path | None = None
    pool: Path | None = None
    operating_points: Sequence[tuple[str, Any]] | None = None  # (name, frontier.Tradeoff)
    default_operating_point: str | None = None
    target_eps: float | None = None
    cv_repeats: int = 10
    cv_seed: int = 0
    # query forms
    query_format: str = "pilot"
    # out-of-distribution guard
    no_ood_guard: bool = False
    ood_method: str = "discriminative"
    ood_keep_share: float = 0.95
    ood_plain_keep_share: float = ood_defaults.DEFAULT_PLAIN_KEEP_SHARE
    ood_inside: Path | None = None
    ood_outside: Path | None = None
    ood_queries: Path | None = None
    # output
    model_id: str | None = None
    export: Path | None = None
    card_note: str | None = None  # markdown appended to the exported card
    no_progress: bool = False

    def __post_init__(self) -> None:
        self.output_dir = Path(self.output_dir)
        self.backbone_id = self.backbone_id or self.backbone

    def finetune_settings(self) -> FinetuneSettings:
        """The fine-tuning settings of this run, seeded by `seed`."""
        return FinetuneSettings(**{name: getattr(self, f"finetune_{name}") for name in FINETUNE_FIELDS}, seed=self.seed)


OPTION_FLAGS = {"operating_points": "--operating-point"}
FINETUNE_FIELDS = ("epochs", "layers", "learning_rate", "batch_size", "patience", "validation_share")


@dataclass(frozen=True)
class FinetuneSettings:
    """`epochs`: the most epochs run; `layers`: how many top layers train (None: every layer, the token
    embeddings included); `learning_rate`: AdamW's, decayed linearly to 0 over the epoch budget;
    `batch_size`: prompts per step; `patience`: epochs without a better validation loss before stopping;
    `validation_share`: the training rows held out for early stopping; `seed`: the split, the batch order
    and dropout."""

    epochs: int = 3
    layers: int | None = None
    learning_rate: float = 3e-5
    batch_size: int = 32
    patience: int = 1
    validation_share: float = 0.1
    seed: int = 0


def check_finetune_settings(settings: FinetuneSettings) -> None:
    """One line for a setting no run can use, named as `train`'s flags (`finetune_` + the field)."""

    def whole(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    if not (whole(settings.epochs) and settings.epochs >= 1):
        raise setting_error(f"{{finetune_epochs}} must be a whole number >= 1, got {settings.epochs!r}.")
    if settings.layers is not None and not (whole(settings.layers) and settings.layers >= 1):
        raise setting_error(
            f"{{finetune_layers}} must be a whole number >= 1 (top layers trained), got {settings.layers!r}; "
            "leave it unset to train every layer."
        )
    rate = settings.learning_rate
    if not (isinstance(rate, int | float) and not isinstance(rate, bool) and 0 < rate < 1 and math.isfinite(rate)):
        raise setting_error(f"{{finetune_learning_rate}} must lie strictly between 0 and 1 (e.g. 3e-5), got {rate!r}.")
    if not (whole(settings.batch_size) and settings.batch_size >= 1):
        raise setting_error(f"{{finetune_batch_size}} must be a whole number >= 1, got {settings.batch_size!r}.")
    if not (whole(settings.patience) and settings.patience >= 1):
        raise setting_error(f"{{finetune_patience}} must be a whole number >= 1, got {settings.patience!r}.")
    share = settings.validation_share
    if not (isinstance(share, int | float) and not isinstance(share, bool) and 0 < share <= 0.5):
        raise setting_error(f"{{finetune_validation_share}} must lie in (0, 0.5] (e.g. 0.1), got {share!r}.")


def check_config(config: TrainConfig) -> None:
    """The settings of a run, checked before any work."""
    from benchgen_router.training.search import check_search_settings

    def refuse(template: str) -> InputError:
        return setting_error(template, OPTION_FLAGS)

    if config.cv_folds == 1:
        raise refuse("{cv_folds} must be 0 (skip) or at least 2.")
    if not isinstance(config.reward_column, str) or not config.reward_column.strip():
        raise refuse("{reward_column} must name a column of the rewards file, e.g. mean_reward or feedback_reward.")
    if config.head_hidden_dim < 0 or config.truncation_length < 1:
        raise refuse("{head_hidden_dim} must be >= 0 and {truncation_length} >= 1.")
    if config.head_kind not in ("cmaes", "probability"):
        raise refuse(f"{{head_kind}} must be cmaes or probability, got {config.head_kind!r}.")
    if config.head_kind == "probability" and (config.head_hidden_dim or config.operating_points):
        raise refuse(
            "{head_kind=probability} is one linear layer whose trade-off is chosen per request: drop "
            "{head_hidden_dim} and {operating_points}."
        )
    check_head_inputs(config)
    check_finetune(config)
    check_search_settings(config.sigma0, config.generations, config.seed, config.popsize, config.cma_library)
    if not 0.0 < config.ood_keep_share < 1.0:
        raise refuse(f"{{ood_keep_share}} must lie strictly between 0 and 1, got {config.ood_keep_share}.")
    for name in ("ood_queries", "calls", "pool"):
        path = getattr(config, name)
        if path is not None and not Path(path).is_file():
            raise refuse(f"{{{name}}} {path} not found; pass the file (see docs/training.md).")
    for name in ("output_dir", "export"):
        folder = getattr(config, name)
        if folder is not None and Path(folder).exists() and not Path(folder).is_dir():
            raise refuse(f"{{{name}}} {folder} is a file; pass a folder.")
    check_point_settings(config)


def check_head_inputs(config: TrainConfig) -> None:
    """--pooling and --neighbour-outcomes: what a probability head over a frozen backbone reads beyond the last
    layer's mean."""
    from benchgen_router.manifest import POOLINGS

    if config.pooling not in POOLINGS:
        raise setting_error(f"{{pooling}} must be one of {', '.join(POOLINGS)}, got {config.pooling!r}.")
    if config.pooling == "every-layer" and config.head_kind != "probability":
        raise setting_error("{pooling=every-layer} feeds the probability head: pass {head_kind=probability}.")
    if config.pooling == "every-layer" and config.finetune:
        raise setting_error("{pooling=every-layer} reads a frozen backbone's layers: drop {finetune}.")
    k = config.neighbour_outcomes
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise setting_error(f"{{neighbour_outcomes}} must be a whole number of neighbours >= 0, got {k!r}.")
    if k and (config.head_kind != "probability" or config.finetune):
        raise setting_error(
            "{neighbour_outcomes} feeds the probability head over a frozen backbone: pass {head_kind=probability} "
            "and drop {finetune}."
        )
    if k and config.export is None:
        raise setting_error(
            "{neighbour_outcomes} keeps the training queries' embeddings and rewards in the router folder only: "
            "pass {export=DIR} (the run folder keeps the head and the record)."
        )


def check_finetune(config: TrainConfig) -> None:
    """--finetune's settings: with a probability head, in float32, into an exported router folder."""
    if not config.finetune:
        defaults = train_defaults()
        given = [
            f"finetune_{name}"
            for name in FINETUNE_FIELDS
            if getattr(config, f"finetune_{name}") != defaults[f"finetune_{name}"]
        ]
        if given:
            raise setting_error(f"{{{given[0]}}} sets how the backbone is fine-tuned: pass {{finetune}} with it.")
        return
    if config.head_kind != "probability":
        raise setting_error("{finetune} trains the backbone with the probability head: pass {head_kind=probability}.")
    if config.dtype != "float32":
        raise setting_error(f"{{finetune}} trains in float32: drop {{dtype={config.dtype}}}.")
    if config.export is None:
        raise setting_error(
            "{finetune} writes the trained backbone into the router folder only: pass {export=DIR} (the run folder "
            "keeps the head and the record)."
        )
    check_finetune_settings(config.finetune_settings())


def check_point_settings(config: TrainConfig) -> None:
    """The operating points and how the default one is chosen."""

    def refuse(template: str) -> InputError:
        return setting_error(template, OPTION_FLAGS)

    if config.pool is not None and config.calls is None:
        raise refuse("{pool} prices calls: pass {calls} with it.")
    points = list(config.operating_points or [])
    names = [name for name, _ in points]
    if points and config.calls is None:
        raise refuse("{operating_points} train for cost and latency: pass {calls} (the per-call records).")
    if len(set(names)) != len(names):
        raise refuse(f"{{operating_points}} names repeat: {sorted({n for n in names if names.count(n) > 1})}.")
    if len({tradeoff for _, tradeoff in points}) != len(points):
        raise refuse("two {operating_points} have the same weights; give each point its own trade-off.")
    default = config.default_operating_point
    if default is not None and default not in names:
        raise refuse(
            f"{{default_operating_point}} {default!r} is not one of the {{operating_points}} {names or '(none)'}."
        )
    if config.target_eps is not None:
        if len(points) < 2:
            raise refuse("{target_eps} chooses between operating points: give at least two {operating_points}.")
        if default is not None:
            raise refuse("{target_eps} chooses the default operating point; drop {default_operating_point}.")
        if not config.target_eps >= 0:
            raise refuse(f"{{target_eps}} must be a reward difference >= 0, got {config.target_eps}.")
        if not config.cv_folds:
            raise refuse("{target_eps} chooses by cross-validation: {cv_folds} must not be 0.")


def parse_seed_list(text: str) -> list[int]:
    """'42,43,44' -> the ensemble's seeds."""
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InputError(f"'{text}' is not a comma-separated list of integers") from None
    if not seeds:
        raise InputError("give at least one seed")
    return seeds


def rewards_source(config: TrainConfig) -> str:
    """What the manifest records as the rewards dataset: --rewards-id, else --rewards, with the column
    trained on when it is not the default."""
    if config.rewards_id:
        return config.rewards_id
    if config.reward_column == DEFAULT_REWARD_COLUMN:
        return config.rewards
    return f"{config.rewards} ({config.reward_column})"


def train_defaults() -> dict[str, Any]:
    """Each optional field's default, for the command line's flags."""
    return {item.name: item.default for item in fields(TrainConfig) if item.default is not MISSING}


def search_options(config: TrainConfig) -> dict[str, Any]:
    """The search settings of this run, in frontier.run_search's terms."""
    options: dict[str, Any] = {
        "hidden_dim": config.head_hidden_dim,
        "sigma0": config.sigma0,
        "generations": config.generations,
        "seed": config.seed,
        "popsize": config.popsize,
        "library": config.cma_library,
    }
    if config.ensemble_seeds:
        options["ensemble_seeds"] = config.ensemble_seeds
    if config.shrink:
        options["shrink"] = config.shrink
    return options


# Reference trainer config key -> (option dest, type).
CONFIG_KEYS: dict[str, tuple[str, type]] = {
    "model_id": ("model_id", str),
    "model": ("backbone", str),
    "rewards_dataset": ("rewards", str),
    "tasks_dataset": ("tasks", str),
    "tasks_path": ("tasks", str),
    "test_split": ("test_split", str),
    "head_hidden_dim": ("head_hidden_dim", int),
    "cma_seed": ("seed", int),
    "cma_sigma0": ("sigma0", float),
    "cma_generations": ("generations", int),
    "cma_population_size": ("popsize", int),
    "device": ("device", str),
    "output_dir": ("output_dir", str),
}
KIND_NAMES = {str: "a string", int: "an integer", float: "a number"}


def reference_settings(path: Path) -> dict[str, Any]:
    """TrainConfig fields from a reference trainer config file (unknown keys are logged and ignored)."""
    from benchgen_router.files import read_json

    config = read_json(path, "config file")
    if not isinstance(config, dict):
        raise InputError(f"config file {path} must be a JSON object of trainer settings.")
    if "tasks_dataset" in config and "tasks_path" in config:
        raise InputError(f"config file {path} gives both tasks_dataset and tasks_path; keep one.")
    defaults: dict[str, Any] = {}
    for key, value in config.items():
        if key not in CONFIG_KEYS:
            logger.warning("config file %s: ignoring unknown key '%s'", path, key)
            continue
        dest, kind = CONFIG_KEYS[key]
        if value is None:
            continue
        wrong = f"config file {path}: '{key}' must be {KIND_NAMES[kind]}, got {value!r}."
        if isinstance(value, bool | list | dict):
            raise InputError(wrong)
        try:
            defaults[dest] = kind(str(value))
        except ValueError:
            raise InputError(wrong) from None
    return defaults
