"""benchgen-router import: public outcome matrices into the tasks, rewards and calls files train reads.

    benchgen-router import --routellm mmlu/responses --contaminated mmlu/contaminated_prompts.jsonl --output-dir mmlu/
    benchgen-router import --long outcomes.csv --pool agents.json --output-dir data/
    benchgen-router import --long outcomes.csv --prompts questions.jsonl --id-column question_id --output-dir data/
    benchgen-router train --rewards data/rewards.jsonl --tasks data/tasks.jsonl --calls data/calls.jsonl ...

--routellm reads RouteLLM's response CSVs (files or folders of *.csv): a prompt column and one
True/False column per model; a file's stem is its tasks' task_group. --long reads one row per
(prompt, model) from CSV, TSV or JSON lines, its columns found among the usual names (NVIDIA's
question,model,isCorrect,output_tokens and LLMRouter's query,model_name,performance,... need no
flags) or named by the --*-column flags; with --prompts, each row names its task by id (--id-column) and
the prompt and group come from the prompts file, as per-sample evaluation logs keep them. Prompts on a
--contaminated list are dropped. Cost per
call: the file's cost column, else its tokens at the --pool prices or each agent's --call-cost, else
1 per call (a count of calls, said so in the summary). Writes tasks.jsonl, rewards.jsonl and
calls.jsonl into --output-dir, all three or none. Details: docs/import.md.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from benchgen_router.cli.common import EXIT_CODES_HELP, EXIT_OK, positive_int

HELP = "read public outcome matrices (RouteLLM CSVs, long CSV/JSONL) into the files train reads"


def _score(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number from 0 to 1, got {value!r}") from None
    if not math.isfinite(number) or not 0 < number <= 1:
        raise argparse.ArgumentTypeError(f"must be a number above 0 and at most 1, got {value}")
    return number


def _call_cost(value: str) -> tuple[str, float]:
    agent, sep, amount = value.rpartition("=")
    try:
        cost = float(amount)
    except ValueError:
        cost = math.nan
    if not sep or not agent or not math.isfinite(cost) or cost < 0:
        raise argparse.ArgumentTypeError(f"must be AGENT=COST with a cost >= 0, got {value!r}")
    return agent, cost


def add_arguments(parser: argparse.ArgumentParser) -> None:
    summary, _, details = (__doc__ or "").partition("\n\n")
    parser.description, parser.epilog = summary, details + "\n" + EXIT_CODES_HELP
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    source = parser.add_argument_group("what to read (one of)").add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--routellm", nargs="+", type=Path, metavar="PATH", help="RouteLLM response CSVs, or folders of them"
    )
    source.add_argument("--long", type=Path, metavar="FILE", help="one row per (prompt, model): .csv, .tsv or .jsonl")
    data = parser.add_argument_group("what to keep")
    data.add_argument(
        "--contaminated",
        action="append",
        type=Path,
        metavar="FILE",
        default=[],
        help="a contamination list (JSONL with eval_prompt) whose prompts are dropped; repeatable",
    )
    data.add_argument("--models", nargs="+", metavar="NAME", help="--routellm: the correctness columns to read")
    data.add_argument("--pool", type=Path, metavar="FILE", help="pool file (agents.json) whose prices cost the tokens")
    data.add_argument(
        "--call-cost",
        action="append",
        type=_call_cost,
        metavar="AGENT=COST",
        default=[],
        help="a fixed cost per call of an agent, for calls the file gives no cost; one per agent (instead of --pool)",
    )
    data.add_argument(
        "--call-cost-unit",
        choices=("usd", "calls"),
        default="usd",
        help="what --call-cost counts: USD (default) or calls (strong=1 weak=0: the share of strong calls)",
    )
    data.add_argument("--limit", type=positive_int, metavar="N", help="only the first N tasks (a slice to try)")
    data.add_argument("--dataset", metavar="NAME", help="the dataset name the rows record (source.dataset)")
    data.add_argument("--pool-version", metavar="NAME", help="the pool_version the rows record (default: a digest)")
    long = parser.add_argument_group("--long columns (default: the first usual name found)")
    for name, usual in (
        ("prompt", "prompt, query, question, text, input"),
        ("model", "model, model_name, agent, llm"),
        ("correct", "correct, is_correct, isCorrect, performance, score, reward"),
        ("group", "task_group, task_name, subject, category"),
        ("prompt-tokens", "prompt_tokens, input_tokens"),
        ("completion-tokens", "completion_tokens, output_tokens"),
        ("cost", "cost_usd, cost"),
        ("latency", "latency_ms, latency_s, response_time"),
        ("response", "response, raw_response"),
    ):
        long.add_argument(f"--{name}-column", metavar="NAME", help=usual)
    long.add_argument(
        "--prompts",
        type=Path,
        metavar="FILE",
        help="the tasks' prompts (.jsonl, .csv or .tsv), one row per id: the outcomes name only the id",
    )
    long.add_argument(
        "--id-column",
        metavar="NAME",
        help="--prompts: the id column both files have (default: question_id, task_id, doc_id, sample_id or id)",
    )
    long.add_argument(
        "--latency-unit", choices=("ms", "s"), default="ms", help="unit of --latency-column (default: ms)"
    )
    long.add_argument(
        "--correct-at",
        type=_score,
        metavar="SCORE",
        help="count a score from SCORE up as correct (needed when scores lie between 0 and 1)",
    )
    long.add_argument(
        "--drop-incomplete",
        action="store_true",
        help="leave out prompts that lack a row for some model (default: an error naming the prompt)",
    )
    parser.add_argument("--output-dir", required=True, type=Path, metavar="DIR", help="where the three files go")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    long_only = [
        name
        for name in (
            "prompt",
            "model",
            "correct",
            "group",
            "prompt_tokens",
            "completion_tokens",
            "cost",
            "latency",
            "response",
        )
        if getattr(args, f"{name}_column") is not None
    ]
    if args.routellm and (long_only or args.correct_at is not None or args.drop_incomplete or args.prompts):
        parser.error("the --*-column, --correct-at, --drop-incomplete and --prompts flags are for --long")
    if args.id_column is not None and args.prompts is None:
        parser.error("--id-column names the id --prompts is joined on; pass --prompts FILE too")
    if args.latency_unit != "ms" and args.latency_column is None:
        parser.error("--latency-unit is the unit of --latency-column; pass both (usual columns carry their unit)")
    if args.call_cost and args.pool is not None:
        parser.error("pass --pool (prices per token) or --call-cost (a cost per call), not both")
    agents = [agent for agent, _ in args.call_cost]
    if len(set(agents)) != len(agents):
        parser.error(f"--call-cost names {sorted(a for a in agents if agents.count(a) > 1)[0]!r} twice")
    if args.long and args.models:
        parser.error("--models is for --routellm (--long names its model column with --model-column)")


def run(args: argparse.Namespace) -> int:
    from benchgen_router.costs import load_pool
    from benchgen_router.importing import (
        LongColumns,
        read_contaminated,
        read_long_outcomes,
        read_prompts,
        read_routellm_csvs,
        with_call_costs,
        with_prices,
        write_outcomes,
    )

    contaminated = read_contaminated(args.contaminated)
    if args.routellm:
        outcomes = read_routellm_csvs(args.routellm, contaminated, models=args.models, dataset=args.dataset)
        count = len({source.split(":")[0] for source in outcomes.sources})
        files = f"{count} file" + ("s" if count != 1 else "")
    else:
        columns = LongColumns(
            prompt=args.prompt_column,
            model=args.model_column,
            correct=args.correct_column,
            group=args.group_column,
            prompt_tokens=args.prompt_tokens_column,
            completion_tokens=args.completion_tokens_column,
            cost=args.cost_column,
            latency=args.latency_column,
            latency_unit=args.latency_unit,
            response=args.response_column,
            id=args.id_column,
        )
        prompts = None if args.prompts is None else read_prompts(args.prompts, columns)
        outcomes = read_long_outcomes(
            args.long, columns, args.correct_at, contaminated, args.drop_incomplete, args.dataset, prompts
        )
        files = str(args.long) if prompts is None else f"{args.long} and {args.prompts}"
    if args.limit is not None:
        outcomes = outcomes.head(args.limit)
    if args.pool is not None:
        outcomes = with_prices(outcomes, load_pool(args.pool, outcomes.agents))
    if args.call_cost:
        outcomes = with_call_costs(outcomes, dict(args.call_cost), args.call_cost_unit)
    written = write_outcomes(outcomes, args.output_dir, args.pool_version)

    groups = len({group for group in outcomes.groups if group is not None})
    print(
        f"import: {written.tasks} tasks x {len(written.agents)} agents from {files}"
        + (f", {groups} group" + ("s" if groups != 1 else "") if groups else "")
        + f"; {outcomes.dropped_contaminated} contaminated rows dropped"
    )
    for agent, reward, cost in zip(written.agents, written.mean_reward, written.mean_cost, strict=True):
        per_call = "USD per call" if written.cost_unit == "usd" else "per call (counted in calls, not USD)"
        spent = f"mean cost {cost:.6g} {per_call}"
        print(f"  {agent}: mean reward {reward:.4f}, {spent}")
    for note in written.notes:
        print(f"note: {note}")
    print("wrote " + ", ".join(str(path) for path in written.paths))
    return EXIT_OK
