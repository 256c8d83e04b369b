"""Re-grade the pilot's recorded calls with benchgen_router.graders and compare with the pilot's own
grading: agreement on `extracted` and on `correct`, per grader and overall, then every call where
they differ, with the reason found by reading it. Run from the project root:

    python scripts/regrade_pilot.py [--pilot ../shared/benchgen-pilot]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchgen_router.errors import InputError
from benchgen_router.files import read_jsonl
from benchgen_router.graders import GRADERS, MATH_EQUIVALENCES, Graded, grade

PILOT = Path(__file__).resolve().parents[1].parent / "shared" / "benchgen-pilot"
# The pilot judged math_expression answers by string equality once spaces were removed and \dfrac
# read as \frac (that rule reproduces all 204 of its non-empty verdicts); math-verify compares values,
# so it passes these answers, equal to the task's, that the pilot failed. Keyed by (task_id, recorded
# extracted); the reason says how the answer differs in writing only.
REASONS = {
    ("math500/test/000037", "72^\\circ"): "72^\\circ is 72 with a degree sign, and degrees are asked",
    ("math500/test/000037", "$72^\\circ$"): "no \\boxed{}: the last line, $72^\\circ$, is 72 degrees",
    ("math500/test/000092", "\\frac{2240}{78125}"): "2240/78125 is 448/15625 unreduced",
    ("math500/test/000198", "10080"): "10080 is 10,\\!080 without LaTeX's thousands separator",
    ("math500/test/000219", "\\frac12"): "\\frac12 is \\frac{1}{2} without braces",
    ("math500/test/000219", "\\dfrac12"): "\\dfrac12 is \\frac{1}{2} without braces",
    ("math500/test/000219", "1/2"): "1/2 is \\frac{1}{2} written inline",
}


@dataclass(frozen=True)
class Regraded:
    """One recorded call: the pilot's grading and ours."""

    task_id: str
    agent: str
    repetition: int
    grader: str
    recorded: Graded
    ours: Graded

    @property
    def agrees(self) -> bool:
        return self.recorded == self.ours

    @property
    def reason(self) -> str:
        why = REASONS.get((self.task_id, self.recorded.extracted))
        return "not explained yet" if why is None else f"{why}; the pilot compared strings, not values"


def regrade(pilot: Path, math_equivalence: str = "value") -> list[Regraded]:
    """Every call of the pilot's raw reward matrix, graded again against its task's answer."""
    tasks = {task["task_id"]: task for task in read_jsonl(pilot / "tasks.v1.jsonl", "tasks")}
    regraded = []
    for row in read_jsonl(pilot / "rewards.v1-pilot.jsonl", "pilot rewards"):
        task = tasks.get(row["task_id"])
        if task is None:
            raise InputError(f"task {row['task_id']!r} of the pilot rewards is not in {pilot / 'tasks.v1.jsonl'}.")
        for call in row["calls"]:
            recorded = Graded(call["extracted"], call["correct"])
            ours = grade(raw_response=call["raw_response"], math_equivalence=math_equivalence, **task)
            key = (task["task_id"], call["agent"], call["repetition"], task["grader"])
            regraded.append(Regraded(*key, recorded, ours))
    return regraded


def agreement(calls: Sequence[Regraded], field: str) -> float:
    """The share of `calls` whose `field` (extracted or correct) we grade as the pilot did."""
    return sum(getattr(c.recorded, field) == getattr(c.ours, field) for c in calls) / len(calls)


def report(calls: Sequence[Regraded]) -> None:
    print(f"Agreement with the pilot's grading, {len(calls)} calls:")
    print("| grader | calls | extracted | correct |")
    print("| --- | ---: | ---: | ---: |")
    groups = {name: [c for c in calls if c.grader == name] for name in sorted(GRADERS)}
    for name, group in [*groups.items(), ("all", list(calls))]:
        if group:
            shares = [agreement(group, field) for field in ("extracted", "correct")]
            cells = " | ".join(f"{round(share * len(group))}/{len(group)} ({share:.1%})" for share in shares)
            print(f"| {name} | {len(group)} | {cells} |")
    differing = [c for c in calls if not c.agrees]
    print(f"\nDisagreements: {len(differing)}")
    if differing:
        print("| task_id | agent | repetition | grader | recorded extracted, correct | ours | reason |")
        print("| --- | --- | ---: | --- | --- | --- | --- |")
    for c in differing:
        recorded = f"{c.recorded.extracted!r}, {c.recorded.correct}"
        ours = f"{c.ours.extracted!r}, {c.ours.correct}"
        print(f"| {c.task_id} | {c.agent} | {c.repetition} | {c.grader} | {recorded} | {ours} | {c.reason} |")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Re-grade the pilot's recorded calls and compare with its grading.")
    parser.add_argument("--pilot", type=Path, default=PILOT, help="the pilot data folder (default: %(default)s)")
    parser.add_argument(
        "--math-equivalence",
        choices=MATH_EQUIVALENCES,
        default="value",
        help="math_expression by value (math-verify, the default) or by the pilot's string rule",
    )
    args = parser.parse_args(argv)
    try:
        report(regrade(args.pilot, args.math_equivalence))
    except InputError as err:
        print(err, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
