"""The files collect writes, in the pilot's own formats, and the task rows it reads.

- The calls file (`--output`) is `rewards.v1-pilot.jsonl`: one row per task with `agent_order`,
  `best_agents`, `calls` (agent order, then repetition), `is_tie`, `mean_reward`, `pool_version`,
  `repetitions`, `task_id`.
- The rewards file (`--rewards-output`) is `rewards.jsonl`: the same task's `agent_order`,
  `best_agents`, `is_tie`, `mean_reward`, `pool_version`, `repetitions` and `task_id`, with
  `n_correct`, `n_empty`, `n_error` and the task's `split`, `domain`, `difficulty`, `task_group` and
  `dataset` (its `source.dataset`).

The definitions, checked against every pilot row: an agent's reward is the share of its calls graded
correct (an empty answer or an error counts as a wrong answer); `best_agents` are the agents whose
reward equals the highest, in agent order (all of them when every agent scores 0); `is_tie` is more
than one best agent. Rows are written as the pilot's were: keys sorted, non-ASCII text as is.

Judged tasks (`grader: "judge"`, collect/judge.py) extend this: each call carries `reward` (the
judge's rating / 10, 0 for a failed or empty call, None when the judge gave no rating) and `judge`
(the verdict and what it cost); an agent's reward is the mean over its graded calls, so an ungraded
call counts neither as right nor as wrong; the rewards row adds `n_ungraded`.

Tasks sampled from the gateway's traffic journal (collect/traffic.py) carry `feedback`: the users' scores
of the answers they were served, per agent that served them. Their rewards rows add `feedback_reward`
(`mean_reward` with each such agent's value replaced by the mean of its users' scores) and `n_feedback`.
"""

from __future__ import annotations

import codecs
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchgen_router.errors import InputError, setting_error
from benchgen_router.files import read_jsonl, to_json
from benchgen_router.graders import GRADERS, grade

JUDGE_GRADER = "judge"  # the grader of collect/judge.py, which rates answers instead of checking them
FEEDBACK_COLUMN = "feedback_reward"  # the rewards column of users' feedback, beside mean_reward

# The pilot's call fields (rewards.v1-pilot.jsonl), in its key order.
CALL_FIELDS = (
    "agent",
    "completion_tokens",
    "correct",
    "cost_usd",
    "empty",
    "error",
    "extracted",
    "generation_id",
    "latency_ms",
    "prompt_tokens",
    "raw_response",
    "repetition",
    "role",
)


@dataclass(frozen=True)
class Task:
    """One task to ask: what the agents are sent, how their answers are graded, and what the rewards
    file copies from it."""

    task_id: str
    prompt: str
    answer: str
    grader: str
    split: str | None = None
    domain: str | None = None
    difficulty: str | None = None
    task_group: str | None = None
    dataset: str | None = None
    # users' feedback scores of served answers, per agent that served them: ((agent, (score, ...)), ...)
    feedback: tuple[tuple[str, tuple[float, ...]], ...] | None = None

    @property
    def prompt_sha256(self) -> str:
        return hashlib.sha256(self.prompt.encode("utf-8")).hexdigest()


def dump_row(row: Mapping[str, Any]) -> str:
    """One JSON line as the pilot files are written: keys sorted, non-ASCII kept, no NaN."""
    return to_json(row, sort_keys=True, ensure_ascii=False) + "\n"


def _text(row: Mapping[str, Any], key: str) -> str | None:
    value = row.get(key)
    return None if value is None else str(value)


def _feedback(row: Mapping[str, Any], where: str) -> tuple[tuple[str, tuple[float, ...]], ...] | None:
    """A task's `feedback`, {agent: [score, ...]} with scores in [0, 1], or None when it has none."""
    value = row.get("feedback")
    if value is None:
        return None

    def score(number: Any) -> bool:
        return isinstance(number, int | float) and not isinstance(number, bool) and 0.0 <= number <= 1.0

    if not isinstance(value, Mapping) or not all(
        isinstance(agent, str) and isinstance(scores, list) and all(score(s) for s in scores)
        for agent, scores in value.items()
    ):
        raise InputError(f"{where} has feedback {value!r}; it must map agents to lists of scores from 0 to 1.")
    return tuple((agent, tuple(float(s) for s in scores)) for agent, scores in value.items())


def task_from_row(row: Mapping[str, Any], where: str, judge: bool = False) -> Task:
    """A task row (tasks.v1.jsonl: task_id, prompt, answer, grader, ...) checked, or one line naming
    what it lacks. A numeric answer is taken as written (70 is "70"). `grader: "judge"` asks the judge
    (its answer, when given, is the reference the judge compares with); with `judge`, a row with
    neither answer nor grader goes to the judge too."""
    task_id = row.get("task_id")
    if not isinstance(task_id, str) or not task_id:
        raise InputError(f"{where} has no task_id; every task needs task_id, prompt, answer and grader.")
    where = f"{where} ({task_id})"
    prompt = row.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise InputError(f"{where} has no prompt; every task needs the prompt text the agents are sent.")
    answer = row.get("answer")
    if isinstance(answer, int | float) and not isinstance(answer, bool):
        answer = str(answer)
    grader = row.get("grader")
    if grader is None and answer is None and judge:
        grader = JUDGE_GRADER
    if grader == JUDGE_GRADER:
        if not judge:
            raise setting_error(f"{where} asks for grader 'judge'; pass {{judge}} or {{judge_pool}} to rate answers.")
        if answer is not None and not isinstance(answer, str):
            raise InputError(f"{where} has answer {answer!r}; a reference answer must be text or a number.")
        answer = answer if isinstance(answer, str) and answer.strip() else ""
    else:
        if not isinstance(answer, str) or not answer.strip():
            raise setting_error(
                f"{where} has no answer; every task needs the answer its grader compares with "
                "(or pass {judge} to have a judge rate the answers of tasks without one)."
            )
        if not isinstance(grader, str):
            found = "no grader" if grader is None else f"grader {grader!r}"
            raise InputError(f"{where} has {found}; name one of {', '.join(sorted([*GRADERS, JUDGE_GRADER]))}.")
        try:
            grade(grader, None, answer)  # an unknown grader raises here; nothing is graded
        except InputError as err:
            raise InputError(f"{where}: {err}") from None
    source = row.get("source")
    dataset = source.get("dataset") if isinstance(source, Mapping) else row.get("dataset")
    return Task(
        task_id=task_id,
        prompt=prompt,
        answer=answer,
        grader=grader,
        split=_text(row, "split"),
        domain=_text(row, "domain"),
        difficulty=_text(row, "difficulty"),
        task_group=_text(row, "task_group"),
        dataset=None if dataset is None else str(dataset),
        feedback=_feedback(row, where),
    )


def read_tasks(path: str, limit: int | None = None, judge: bool = False) -> list[Task]:
    """The first `limit` tasks of a tasks file (all without a limit), checked; task ids must be unique.
    Each grader used is run once, so a missing dependency (math-verify) is reported before any call.
    `judge`: a judge is at hand, so tasks may ask for it (task_from_row)."""
    _check_not_utf16(Path(path))
    rows = read_jsonl(path, "tasks file")
    _check_utf8(Path(path))
    rows = rows if limit is None else rows[:limit]
    if not rows:
        raise InputError(f"tasks file {path} has no tasks; pass a JSON-lines file with one task per line.")
    tasks, seen = [], set()
    for number, row in enumerate(rows, start=1):
        task = task_from_row(row, f"tasks file {path} row {number}", judge)
        try:  # a lone surrogate written as a JSON escape ("\udc80") is valid JSON but no text
            to_json(row, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as err:
            raise InputError(
                f"tasks file {path} row {number} ({task.task_id}) holds a lone surrogate "
                f"({err.object[err.start]!a}), which is no text; fix that escape."
            ) from None
        if task.task_id in seen:
            raise InputError(f"tasks file {path} row {number} repeats task_id '{task.task_id}'; ids must be unique.")
        seen.add(task.task_id)
        tasks.append(task)
    for grader in sorted({task.grader for task in tasks} - {JUDGE_GRADER}):
        grade(grader, "0", "0")
    return tasks


# Byte-order marks of the encodings a tasks file is saved in by mistake (Windows editors call UTF-16
# "Unicode"); UTF-32's little-endian mark begins with UTF-16's, so it is tried first.
BYTE_ORDER_MARKS = (
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)


def _check_not_utf16(path: Path) -> None:
    """Refuse a file saved as UTF-16 or UTF-32, saying so (read as UTF-8, its first line is no JSON). A
    file that cannot be opened is left to read_jsonl, which names the problem."""
    try:
        with path.open("rb") as file:
            start = file.read(4)
    except OSError:
        return
    for mark, encoding in BYTE_ORDER_MARKS:
        if start.startswith(mark):
            raise InputError(
                f"tasks file {path} is {encoding} (it starts with a {encoding} byte-order mark), not UTF-8; save it "
                f"as UTF-8 (iconv -f {encoding} -t UTF-8 {path} > tasks.utf8.jsonl)."
            )


def _check_utf8(path: Path) -> None:
    """Refuse a file that is not UTF-8 text, naming the first line that is not (nothing could send or
    record such a prompt)."""
    data = path.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise InputError(
            f"tasks file {path} line {line} is not UTF-8 (byte 0x{data[err.start]:02x}); save the file as UTF-8."
        ) from None


def pool_digest(agents: Sequence[str], models: Sequence[str]) -> str:
    """The default pool_version: a digest of the agents and the model each one answers with, so that
    rows measured on different pools never share a version."""
    text = json.dumps([[agent, model] for agent, model in zip(agents, models, strict=True)])
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def call_reward(call: Mapping[str, Any]) -> float | None:
    """A call's reward: a judged call's `reward` (its rating / 10; None while ungraded), else 1 for an
    answer graded correct and 0 for any other (wrong, empty, failed)."""
    if "reward" in call:
        return call["reward"]
    return 1.0 if call["correct"] else 0.0


@dataclass(frozen=True)
class Tally:
    """Per agent, in agent order: calls, correct, empty, failed and ungraded calls, reward (the mean
    over its graded calls; None when it has none); the best agents."""

    n_calls: list[int]
    n_correct: list[int]
    n_empty: list[int]
    n_error: list[int]
    n_ungraded: list[int]
    mean_reward: list[float | None]
    best_agents: list[str]

    @property
    def is_tie(self) -> bool:
        return len(self.best_agents) > 1

    @property
    def rated(self) -> bool:
        """Every agent has a graded call: the row has a reward for each, as the rewards file needs."""
        return all(mean is not None for mean in self.mean_reward)


def tally(agent_order: Sequence[str], calls: Sequence[Mapping[str, Any]]) -> Tally:
    """The pilot's per-task figures from its calls (every agent must have at least one). An ungraded
    call (a judged answer the judge gave no rating) is left out of its agent's mean: it is neither
    right nor wrong."""
    counts = {agent: [0, 0, 0, 0, 0] for agent in agent_order}
    sums = dict.fromkeys(agent_order, 0.0)
    for call in calls:
        count = counts[call["agent"]]
        count[0] += 1
        count[1] += bool(call["correct"])
        count[2] += bool(call["empty"])
        count[3] += call["error"] is not None
        value = call_reward(call)
        if value is None:
            count[4] += 1
        else:
            sums[call["agent"]] += value
    rows = [counts[agent] for agent in agent_order]
    mean = [
        sums[agent] / (count[0] - count[4]) if count[0] > count[4] else None
        for agent, count in zip(agent_order, rows, strict=True)
    ]
    known = [value for value in mean if value is not None]
    best = [agent for agent, reward in zip(agent_order, mean, strict=True) if not known or reward == max(known)]
    return Tally(*([row[i] for row in rows] for i in range(5)), mean, best)


def sort_calls(agent_order: Sequence[str], calls: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    index = {agent: j for j, agent in enumerate(agent_order)}
    return sorted(calls, key=lambda call: (index[call["agent"]], call["repetition"]))


def calls_row(
    task_id: str, agent_order: Sequence[str], calls: Sequence[Mapping[str, Any]], repetitions: int, pool_version: str
) -> dict[str, Any]:
    """A task's row of the calls file (rewards.v1-pilot.jsonl)."""
    calls = sort_calls(agent_order, calls)
    figures = tally(agent_order, calls)
    return {
        "agent_order": list(agent_order),
        "best_agents": figures.best_agents,
        "calls": [dict(call) for call in calls],
        "is_tie": figures.is_tie,
        "mean_reward": figures.mean_reward,
        "pool_version": pool_version,
        "repetitions": repetitions,
        "task_id": task_id,
    }


def rewards_row(row: Mapping[str, Any], task: Task) -> dict[str, Any]:
    """A task's row of the rewards file (rewards.jsonl) from its calls-file row and its task."""
    figures = tally(row["agent_order"], row["calls"])
    extra = {"n_ungraded": figures.n_ungraded} if any("reward" in call for call in row["calls"]) else {}
    if task.feedback is not None:
        extra |= feedback_columns(row["agent_order"], figures.mean_reward, task.feedback)
    return extra | {
        "agent_order": list(row["agent_order"]),
        "best_agents": figures.best_agents,
        "dataset": task.dataset,
        "difficulty": task.difficulty,
        "domain": task.domain,
        "is_tie": figures.is_tie,
        "mean_reward": figures.mean_reward,
        "n_correct": figures.n_correct,
        "n_empty": figures.n_empty,
        "n_error": figures.n_error,
        "pool_version": row["pool_version"],
        "repetitions": row["repetitions"],
        "split": task.split,
        "task_group": task.task_group,
        "task_id": row["task_id"],
    }


def feedback_columns(
    agent_order: Sequence[str],
    mean_reward: Sequence[float | None],
    feedback: Sequence[tuple[str, Sequence[float]]],
) -> dict[str, Any]:
    """`feedback_reward`: the measured reward, with each agent that served users this prompt scored by
    the mean of their feedback instead (feedback covers only the agents that answered them, so every
    other agent keeps its measured reward); `n_feedback`: how many scores each agent's value rests on.
    Feedback naming an agent outside the pool is left out."""
    scores = dict(feedback)
    values = [
        sum(scores[agent]) / len(scores[agent]) if scores.get(agent) else measured
        for agent, measured in zip(agent_order, mean_reward, strict=True)
    ]
    return {FEEDBACK_COLUMN: values, "n_feedback": [len(scores.get(agent, ())) for agent in agent_order]}
