"""benchgen-router collect: measure a pool on your own prompts, writing the data `train` retrains on.

    benchgen-router collect --tasks tasks.jsonl --pool agents.json --repetitions 3 --output calls.jsonl
    benchgen-router train --rewards calls.rewards.jsonl --tasks tasks.jsonl --calls calls.jsonl --pool agents.json ...

Asks every agent of the pool (each with its base_url, model and api_key_env) every task's prompt
--repetitions times, grades each answer with the task's grader and writes --output (per-call
records, the pilot's rewards.v1-pilot.jsonl format, for train --calls) and --rewards-output (the
rewards.jsonl format, for train --rewards; default <output stem>.rewards.jsonl). Every finished
call is journaled at once in <output>.journal: after a crash, Ctrl-C or SIGTERM, --resume asks only
what is missing. 429, 5xx, timeouts and connection errors are retried with backoff; a call that
still fails is recorded with its error and counted as a wrong answer. --max-cost-usd stops
launching calls before the journal's spend would pass it (exit 1: some calls not asked). One run at
a time holds an output's journal (exit 75 for another: nothing asked); a write that fails after
calls were made (a full disk) exits 74, and --resume continues. --judge AGENT (an agent of the
pool) or --judge-pool FILE (an endpoint of its own) rates the answers of tasks without a reference
answer from 1 to 10 (`grader: "judge"`, or no answer and no grader); a verdict without a rating is
asked again once, then left ungraded, never counted as wrong. --from-journal DIR --sample N takes N
distinct prompts the gateway journaled with their text (serve --journal DIR --journal-text), an equal
share per agent that answered them, drawn with --seed; writes them to --tasks (default
<stem>.tasks.jsonl) and has the judge rate the pool's answers; users' feedback becomes the rewards
file's feedback_reward column (train --reward-column). Details: docs/collect.md.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchgen_router.cli.common import EXIT_CODES_HELP, EXIT_OK, EXIT_SKIPPED, non_negative_int, positive_int
from benchgen_router.graders import MATH_EQUIVALENCES

logger = logging.getLogger("benchgen_router")

HELP = "measure a pool on your prompts: the calls and rewards files train reads"
# sysexits.h's EX_IOERR and EX_TEMPFAIL: a write failed after calls were made (--resume continues);
# another run holds the journal (nothing was asked: try again once it ends).
EXIT_WRITE_FAILED, EXIT_JOURNAL_IN_USE = 74, 75
EXIT_HELP = EXIT_CODES_HELP.replace(
    "1 some lines skipped, the rest done", "1 stopped at --max-cost-usd, the rest written"
).replace(
    "70 unexpected error;",
    "70 unexpected error; 74 a write failed after calls were made (--resume continues); "
    "75 another run holds the journal (nothing asked);",
)


def _amount(minimum_exclusive: bool) -> Callable[[str], float]:
    wanted = "a number > 0" if minimum_exclusive else "a number >= 0"

    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {value!r}") from None
        if not math.isfinite(number) or number < 0 or (minimum_exclusive and number == 0):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {value}")
        return number

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    summary, _, details = (__doc__ or "").partition("\n\n")
    parser.description, parser.epilog = summary, details + "\n" + EXIT_HELP
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    data = parser.add_argument_group("what to ask")
    data.add_argument(
        "--tasks",
        type=Path,
        metavar="FILE",
        help="tasks JSONL: task_id, prompt, answer, grader, ... (with --from-journal: where the sampled prompts "
        "are written; default <stem>.tasks.jsonl)",
    )
    data.add_argument(
        "--pool", required=True, type=Path, metavar="FILE", help="pool file (agents.json) with every agent's base_url"
    )
    data.add_argument(
        "--repetitions", type=positive_int, metavar="N", default=3, help="calls per task and agent (default: 3)"
    )
    data.add_argument("--limit", type=positive_int, metavar="N", help="only the first N tasks")
    data.add_argument(
        "--math-equivalence",
        choices=MATH_EQUIVALENCES,
        default="value",
        help="math_expression answers equal by value (math-verify; the default) or by the pilot's string rule, "
        "to extend a matrix graded that way",
    )
    data.add_argument(
        "--judge",
        metavar="AGENT",
        help="rate answers of tasks without a reference with this agent of the pool (or of --judge-pool)",
    )
    data.add_argument(
        "--judge-pool",
        type=Path,
        metavar="FILE",
        help="a pool file (agents.json format) for a judge outside the pool: its one agent, or --judge AGENT",
    )
    traffic = parser.add_argument_group("from the gateway's traffic journal")
    traffic.add_argument(
        "--from-journal",
        type=Path,
        metavar="DIR",
        help="take the prompts from a journal folder (serve --journal DIR --journal-text); needs a judge",
    )
    traffic.add_argument("--sample", type=positive_int, metavar="N", help="distinct journaled prompts to take")
    traffic.add_argument(
        "--seed", type=int, metavar="S", default=0, help="seed of the draw within each agent's prompts (default: 0)"
    )
    data.add_argument("--max-tokens", type=positive_int, metavar="N", help="max_tokens sent upstream (default: none)")
    data.add_argument(
        "--pool-version",
        metavar="NAME",
        help="the pool_version the rows record (default: a digest of agents and models)",
    )
    out = parser.add_argument_group("output")
    out.add_argument(
        "--output", required=True, type=Path, metavar="FILE", help="the calls file (rewards.v1-pilot.jsonl format)"
    )
    out.add_argument(
        "--rewards-output",
        type=Path,
        metavar="FILE",
        help="the rewards file (rewards.jsonl format; default: <stem>.rewards.jsonl)",
    )
    out.add_argument(
        "--resume", action="store_true", help="continue from <output>.journal, asking only what is missing"
    )
    out.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    calls = parser.add_argument_group("calls")
    calls.add_argument(
        "--concurrency", type=positive_int, metavar="N", default=4, help="calls in flight at once (default: 4)"
    )
    calls.add_argument(
        "--max-cost-usd", type=_amount(False), metavar="USD", help="stop launching calls before the spend passes this"
    )
    calls.add_argument(
        "--timeout-s",
        type=_amount(True),
        metavar="S",
        default=600.0,
        help="seconds an attempt may wait for its answer (default: 600)",
    )
    calls.add_argument(
        "--retries",
        type=non_negative_int,
        metavar="N",
        default=3,
        help="retries of a 429, 5xx, timeout or lost connection (default: 3)",
    )


def _tasks_path(args: argparse.Namespace) -> Path:
    """--tasks, or with --from-journal where its sample goes; one line for a combination that cannot work."""
    from benchgen_router.errors import InputError

    if args.from_journal is None:
        if args.sample is not None:
            raise InputError("--sample takes prompts from a journal: pass --from-journal DIR with it.")
        if args.tasks is None:
            raise InputError("pass --tasks FILE, or --from-journal DIR --sample N to take the prompts from a journal.")
        return args.tasks
    if args.sample is None:
        raise InputError("--from-journal needs --sample N: how many distinct prompts to take.")
    if args.tasks is not None:
        return args.tasks
    return args.output.with_name(args.output.name.removesuffix(".jsonl") + ".tasks.jsonl")


def run(args: argparse.Namespace) -> int:
    from benchgen_router.collect import STOPPED_AT_COST_CAP, CollectConfig, JournalInUse, JournalWriteFailed, collect

    config = CollectConfig(
        tasks=_tasks_path(args),
        pool=args.pool,
        output=args.output,
        rewards_output=args.rewards_output,
        repetitions=args.repetitions,
        limit=args.limit,
        concurrency=args.concurrency,
        max_cost_usd=args.max_cost_usd,
        resume=args.resume,
        timeout_s=args.timeout_s,
        max_tokens=args.max_tokens,
        retries=args.retries,
        pool_version=args.pool_version,
        math_equivalence=args.math_equivalence,
        progress=not args.no_progress,
        judge=args.judge,
        judge_pool=args.judge_pool,
    )
    try:
        if args.from_journal is None:
            result = collect(config)
        else:
            from benchgen_router.collect.run import holding_journal
            from benchgen_router.collect.traffic import JournalSource, collect_from_journal

            # The lock first: a run refused for another holding this output samples, writes and removes nothing.
            with holding_journal(config):
                sample, result = collect_from_journal(config, JournalSource(args.from_journal, args.sample, args.seed))
            print(_sample_line(sample))
    except (JournalInUse, JournalWriteFailed) as err:
        print(f"error: {err.for_command_line()}", file=sys.stderr)
        return EXIT_JOURNAL_IN_USE if isinstance(err, JournalInUse) else EXIT_WRITE_FAILED
    print(
        f"collect: {result.made} calls made, {result.reused} reused, {result.failed} failed; "
        f"{result.cost_usd:.4f} USD ({result.total_cost_usd:.4f} USD in the journal); "
        f"{result.calls_per_s:.2f} calls/s over {result.seconds:.1f} s"
    )
    if args.judge is not None or args.judge_pool is not None:
        print(
            f"judge: {result.rated} of {result.judged} answers rated this run ({result.judge_cost_usd:.4f} USD); "
            f"{result.ungraded} answers ungraded in {result.output}"
        )
    print(f"wrote {result.tasks_written} of {result.tasks} tasks to {result.output} and {result.rewards_output}")
    if result.tasks_rated < result.tasks_written:
        logger.warning(
            "warning: %d tasks left out of %s: an agent has no graded answer there (the judge gave no rating); "
            "they are in %s",
            result.tasks_written - result.tasks_rated,
            result.rewards_output,
            result.output,
        )
    if result.failed:
        logger.warning(
            "warning: %d calls failed after their retries; they are recorded with their error and count as wrong "
            "answers (--verbose shows each)",
            result.failed,
        )
    if result.grader_timeouts:
        from benchgen_router.collect.grading import GRADE_TIME_LIMIT_S

        logger.warning(
            "warning: %d answers graded wrong: their grade ran past its %g s limit (math-verify on an answer such "
            "as \\boxed{9^{9^{9^{9}}}}); --verbose names each",
            result.grader_timeouts,
            GRADE_TIME_LIMIT_S,
        )
    if result.stopped == STOPPED_AT_COST_CAP:
        logger.warning(
            "warning: stopped at --max-cost-usd %g: %d calls not asked; --resume with a higher cap asks them",
            args.max_cost_usd,
            result.cells - result.reused - result.made,
        )
        return EXIT_SKIPPED
    return EXIT_OK


def _sample_line(sample: Any) -> str:
    if sample.reused:
        return f"journal: {sample.sampled} prompts sampled before, kept in {sample.tasks} (--resume)"
    shares = ", ".join(f"{agent} {count}" for agent, count in sample.by_agent.items())
    left_out = (  # what the journal held that cannot be a task; named only when there is some
        (sample.truncated, "cut by the gateway"),
        (sample.damaged_lines, "damaged lines"),
        (sample.repeated_calls, f"repeated request ids ({sample.conflicting_ids} with another text)"),
    )
    skipped = ", ".join(f"{count} {what}" for count, what in left_out if count)
    return (
        f"journal: {sample.calls} calls, {sample.without_text} without text, {sample.prompts} distinct prompts; "
        + (f"skipped {skipped}; " if skipped else "")
        + f"sampled {sample.sampled} ({shares}; {sample.with_feedback} with feedback) into {sample.tasks}"
    )
