"""Routing value on any outcome matrix: every router kind trained and scored on the same cross-validation
folds of an imported folder (tasks, rewards, calls), against each single model, RouterBench's zero router
and the oracle (docs/benchmarks/mmlu-pro.md, docs/benchmarks/routellm.md).

    benchgen-router import --long outcomes.csv --prompts questions.jsonl --cost-column cost_usd \
        --drop-incomplete --output-dir mmlu-pro/
    benchgen-router bench value --data mmlu-pro/ --output-dir out/

- `data`: the matrix (prompts, groups, rewards, cost per call) read from an imported folder;
- `routers`: the routers compared, each fitted on a fold's training rows;
- `metrics`: a curve's figures (cost share at the best single model's accuracy, best accuracy, AIQ);
- `run`: the folds and the loop;
- `report`: tables, JSON and PNG curves.
"""

from benchgen_router.bench.value.data import OutcomeMatrix, read_imported_folder
from benchgen_router.bench.value.run import ValueConfig, ValueResult, run_value_benchmark

__all__ = ["OutcomeMatrix", "ValueConfig", "ValueResult", "read_imported_folder", "run_value_benchmark"]
