"""Public outcome matrices read into the files `train`, `evaluate` and the benchmark read (docs/import.md).

One reader per source format, each returning an `Outcomes` matrix, beside the shared pieces:
- `routellm`: RouteLLM's response CSVs (`read_routellm_csvs`, `read_contaminated`);
- `long`: one row per (task, model), with the prompt on every row or joined by id from a prompts file
  (`read_long_outcomes`, `read_prompts`);
- `tables`: reading CSV/TSV/JSONL rows lazily, and the cells every reader parses;
- `pricing`: what each call cost (`with_prices`, `with_call_costs`, `call_costs`);
- `writing`: the tasks, rewards and calls files (`write_outcomes`).

    from benchgen_router.importing import LongColumns, read_long_outcomes, read_prompts, write_outcomes

    prompts = read_prompts("questions.jsonl", LongColumns(id="question_id"))
    outcomes = read_long_outcomes("outcomes.csv", prompts=prompts, drop_incomplete=True)
    write_outcomes(outcomes, "mmlu-pro/")
"""

from benchgen_router.importing.long import LongColumns, Prompts, read_long_outcomes, read_prompts
from benchgen_router.importing.outcomes import Outcomes
from benchgen_router.importing.pricing import call_costs, with_call_costs, with_prices
from benchgen_router.importing.routellm import read_contaminated, read_routellm_csvs
from benchgen_router.importing.writing import CALLS_FILE, REWARDS_FILE, TASKS_FILE, Written, write_outcomes

__all__ = [
    "CALLS_FILE",
    "REWARDS_FILE",
    "TASKS_FILE",
    "LongColumns",
    "Outcomes",
    "Prompts",
    "Written",
    "call_costs",
    "read_contaminated",
    "read_long_outcomes",
    "read_prompts",
    "read_routellm_csvs",
    "with_call_costs",
    "with_prices",
    "write_outcomes",
]
