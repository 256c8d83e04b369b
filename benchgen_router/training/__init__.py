"""Training a router: the library behind `benchgen-router train`.

    from benchgen_router.training import TrainConfig, train
    result = train(TrainConfig(rewards="rewards.jsonl", tasks="tasks.v1.jsonl", output_dir=Path("run")))
    result.report.test_reward

train() embeds the labelled prompts with the backbone, searches one head per operating point
(separable CMA-ES), fits the out-of-distribution guard, cross-validates (the cost frontier when
per-call costs are given), writes the run folder (head_weights.npy, manifest.json and the files
that go with them) and, with `export`, the Hub folder. Bad input raises InputError with one line.

The modules: config (TrainConfig and its checks), run (train), search (the CMA-ES search, fitness and
k-fold cross-validation), guard (the out-of-distribution guard a run fits), probability (the
probability head, a trade-off chosen per request), summary (what the command prints).

The names below load lazily, so importing the search does not import the whole run.
"""

from __future__ import annotations

from benchgen_router.moved import lazy_names

_SEARCH = "benchgen_router.training.search"
_LAZY = {
    "DEFAULT_BACKBONE": "benchgen_router.training.config",
    "TrainConfig": "benchgen_router.training.config",
    "check_config": "benchgen_router.training.config",
    "parse_seed_list": "benchgen_router.training.config",
    "reference_settings": "benchgen_router.training.config",
    "train_defaults": "benchgen_router.training.config",
    "TrainResult": "benchgen_router.training.run",
    "train": "benchgen_router.training.run",
    "run_summary": "benchgen_router.training.summary",
    # the search's names, importable from here as they were when the search was this module
    "CMA_LIBRARIES": _SEARCH,
    "DEFAULT_CMA_LIBRARY": _SEARCH,
    "MAX_SEED": _SEARCH,
    "MIN_POPSIZE": _SEARCH,
    "SearchResult": _SEARCH,
    "check_search_settings": _SEARCH,
    "cross_validate": _SEARCH,
    "fitness": _SEARCH,
    "picked_rewards": _SEARCH,
    "population_picks": _SEARCH,
    "search_head": _SEARCH,
    "search_heads": _SEARCH,
}
__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_names(__name__, _LAZY)
