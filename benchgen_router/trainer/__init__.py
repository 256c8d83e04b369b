"""Training a router: the library behind `benchgen-router train`.

    from benchgen_router.trainer import TrainConfig, train
    result = train(TrainConfig(rewards="rewards.jsonl", tasks="tasks.v1.jsonl", output_dir=Path("run")))
    result.report.test_reward

train() embeds the labelled prompts with the backbone, searches one head per operating point
(separable CMA-ES), fits the out-of-distribution guard, cross-validates (the cost frontier when
per-call costs are given), writes the run folder (head_weights.npy, manifest.json and the files
that go with them) and, with `export`, the Hub folder. Bad input raises InputError with one line.
"""

from benchgen_router.trainer.config import (
    DEFAULT_BACKBONE,
    TrainConfig,
    check_config,
    parse_seed_list,
    reference_settings,
    train_defaults,
)
from benchgen_router.trainer.run import TrainResult, train
from benchgen_router.trainer.summary import run_summary

__all__ = [
    "DEFAULT_BACKBONE",
    "TrainConfig",
    "TrainResult",
    "check_config",
    "parse_seed_list",
    "reference_settings",
    "run_summary",
    "train",
    "train_defaults",
]
