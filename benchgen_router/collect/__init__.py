"""Measuring a pool on your own prompts: the library behind `benchgen-router collect`.

    from benchgen_router.collect import CollectConfig, collect
    result = collect(CollectConfig(tasks=Path("tasks.jsonl"), pool=Path("agents.json"), output=Path("calls.jsonl")))
    result.made, result.failed, result.cost_usd, result.calls_per_s

collect() asks every agent of the pool every task's prompt `repetitions` times through the pool's
OpenAI-compatible upstreams, grades each answer with the task's grader, journals every finished
call as it finishes, and writes the two files `train` reads: the calls file (`--calls`, the format of
the pilot's rewards.v1-pilot.jsonl) and the rewards file (`--rewards`, the format of rewards.jsonl).
With `judge=AGENT` (or `judge_pool=FILE`), an LLM judge rates the answers of tasks without a
reference answer from 1 to 10 (collect/judge.py). The formats: collect/formats.py; the journal and
resuming: collect/journal.py; the asking phase and the cost cap: collect/asking.py; grading off the
event loop, in time: collect/grading.py; the two files computed from the journal: collect/outputs.py;
one call to an upstream, with retries: collect/chat.py; tasks sampled from the gateway's traffic
journal, with users' feedback: collect/traffic.py; the whole story: docs/collect.md.
"""

from benchgen_router.collect.asking import STOPPED_AT_COST_CAP, Asker
from benchgen_router.collect.chat import Answer, RetryPolicy
from benchgen_router.collect.formats import Task, calls_row, pool_digest, read_tasks, rewards_row, tally
from benchgen_router.collect.journal import JournalInUse, JournalWriteFailed
from benchgen_router.collect.run import CollectConfig, CollectResult, collect

__all__ = [
    "STOPPED_AT_COST_CAP",
    "Answer",
    "Asker",
    "CollectConfig",
    "CollectResult",
    "JournalInUse",
    "JournalWriteFailed",
    "RetryPolicy",
    "Task",
    "calls_row",
    "collect",
    "pool_digest",
    "read_tasks",
    "rewards_row",
    "tally",
]
