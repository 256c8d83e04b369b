"""The judge grader (collect/judge.py): its prompts and verdict parser, and collect runs whose agents and
judge are scripted OpenAI-compatible upstreams on loopback (tests/upstream_server.py's ReplayUpstream),
so that every rating, and so every reward, is known in advance: rewards N/10, a verdict without a rating
asked again once and then left ungraded (out of the mean, never 0), the judge's cost beside the judged
call and within the cost cap, a resume that asks neither agent nor judge again, and bad input as one
line. Everything here is fast."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchgen_router.collect import CollectConfig, collect
from benchgen_router.collect.asking import STOPPED_AT_COST_CAP
from benchgen_router.collect.judge import (
    GENERAL_TEMPLATE,
    REFERENCE_TEMPLATE,
    SYSTEM_PROMPT,
    UNPARSEABLE,
    judge_messages,
    parse_rating,
)
from benchgen_router.costs import load_cost_data
from benchgen_router.data import join_rewards
from benchgen_router.errors import InputError
from helpers import cli
from upstream_server import ReplayUpstream

pytest_plugins = ["upstream_server"]
httpx = pytest.importorskip("httpx")

AGENT_COST, JUDGE_COST = 0.01, 0.001  # what the scripted upstreams bill per call (usage.cost)
ANSWERS = {"m-a": "alpha", "m-b": "beta", "m-c": ""}  # what each agent's model answers; c answers nothing
START, END = "[The Start of Assistant's Answer]\n", "\n[The End of Assistant's Answer]"


def agent_reply(body: dict) -> str:
    return ANSWERS[body["model"]]


def judged_answer(body: dict) -> str:
    """The answer a judge request asks about, read from its user message."""
    text = body["messages"][-1]["content"]
    return text[text.index(START) + len(START) : text.index(END)]


def scripted_judge(verdicts: dict[str, list[str]]) -> object:
    """A judge whose verdicts on each answer come from `verdicts[answer]` in turn, the last one repeated."""
    given: dict[str, int] = {}

    def reply(body: dict) -> str:
        answer = judged_answer(body)
        turn = given.get(answer, 0)
        given[answer] = turn + 1
        script = verdicts[answer]
        return script[min(turn, len(script) - 1)]

    return reply


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_pool(path: Path, base_url: str, agents: list[str]) -> Path:
    rows = [{"agent_id": agent, "base_url": base_url, "model": f"m-{agent}"} for agent in agents]
    path.write_text(json.dumps({"agents": rows}), encoding="utf-8")
    return path


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


TASKS = [
    {"task_id": "open", "prompt": "Write a line about a river."},  # no answer, no grader: the judge's
    {"task_id": "guided", "prompt": "What is 2 + 2?", "answer": "4", "grader": "judge"},  # reference-guided
    {"task_id": "checked", "prompt": "What is 1 + 1?", "answer": "2", "grader": "numeric_match"},
]


@pytest.fixture
def servers():
    agents = ReplayUpstream(agent_reply, {"prompt_tokens": 10, "completion_tokens": 10, "cost": AGENT_COST})
    judge_usage = {"prompt_tokens": 100, "completion_tokens": 20, "cost": JUDGE_COST}
    judge = ReplayUpstream(scripted_judge({"alpha": ["Clear. Rating: [[8]]"], "beta": ["Weak.\nRating: [[3]]"]}))
    judge.usage = judge_usage
    with agents, judge:
        yield agents, judge


def settings(
    folder: Path, agents: ReplayUpstream, judge_server: ReplayUpstream | None, **overrides: object
) -> CollectConfig:
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "tasks.jsonl").exists():
        write_jsonl(folder / "tasks.jsonl", TASKS)
    write_pool(folder / "pool.json", agents.base_url, ["a", "b", "c"])
    judge_pool = None
    if judge_server is not None:
        judge_pool = write_pool(folder / "judge.json", judge_server.base_url, ["judge"])
    values = {
        "tasks": folder / "tasks.jsonl",
        "pool": folder / "pool.json",
        "output": folder / "calls.jsonl",
        "repetitions": 2,
        "backoff_s": 0.01,
        "judge_pool": judge_pool,
    }
    return CollectConfig(**{**values, **overrides})


# ---------------------------------------------------------------------------------------------
# The prompts and the parser


@pytest.mark.parametrize(
    ("verdict", "rating"),
    [
        ("The answer is right.\n\nRating: [[7]]", 7),
        ("Rating: [[10]]", 10),
        ("Rating: [[1]]", 1),
        ("Rating: [[ 9 ]]", 9),
        ("Rating: [[8]] as said, [[8]]", 8),  # the same rating twice is one rating
        ("Rating: [[7]], that is [[07]], [[7.0]]", 7),  # ... however it is written: values are compared
        ("Rating: [[0]]", None),  # off the scale
        ("Rating: [[11]]", None),
        ("Rating: [[10.5]]", None),
        ("Rating: [[0.5]]", None),
        # A decimal, as GPT-4 writes it judging MT-Bench and FastChat's reader (\[\[(\d+\.?\d*)\]\]) reads it.
        ("Rating: [[8.5]]", 8.5),
        ("Rating: [[7.25]]", 7.25),
        ("Rating: [[8.]]", 8),
        ("Rating: [[10.0]]", 10),
        ("Rating: [[3]] no, Rating: [[8]]", None),  # two ratings: undecided
        ("Rating: [[3]] no, Rating: [[3.5]]", None),
        ("Rating: [8]", 8),  # FastChat's fallback: [N] when no [[N]] is found
        ("As [1] says, the answer is fine. Rating: [[6]]", 6),  # [[N]] first: a citation is no rating
        ("As [1] says, the answer is fine. Rating: [6]", None),  # two different [N]: undecided
        ("Rating: [[\u0667]]", None),  # Arabic-Indic seven: ASCII digits only
        ("Rating: [[\uff17]]", None),  # fullwidth seven
        ("Rating: [[7\u0665]]", None),
        ("Rating: [\u0667]", None),
        ("Rating: 7", None),  # not the [[N]] form
        ("I cannot rate this.", None),
        ("", None),
        (None, None),
    ],
)
def test_a_verdict_is_read_as_its_one_rating_from_1_to_10(verdict, rating):
    found = parse_rating(verdict)
    assert found == rating and type(found) is type(rating)  # a whole rating is an int, as journals hold it


def test_the_prompts_follow_mt_benchs_single_answer_convention():
    system, user = judge_messages("Q?", "my answer", None)
    assert system == {"role": "system", "content": SYSTEM_PROMPT} and user["role"] == "user"
    assert user["content"].startswith("[Instruction]\n") and 'for example "Rating: [[5]]"' in user["content"]
    assert user["content"].endswith("[Question]\nQ?\n\n[The Start of Assistant's Answer]\nmy answer\n"
                                    "[The End of Assistant's Answer]")  # fmt: skip
    general_rule = "for helpfulness, relevance, accuracy and level of detail"
    guided_rule = "Begin by comparing the assistant's answer with the reference answer"
    assert general_rule in GENERAL_TEMPLATE and general_rule in user["content"] and "Reference" not in user["content"]
    _, guided = judge_messages("Q?", "my answer", "42")
    assert guided_rule in REFERENCE_TEMPLATE and guided_rule in guided["content"]
    reference = "[Question]\nQ?\n\n[The Start of Reference Answer]\n42\n[The End of Reference Answer]\n\n"
    assert reference in guided["content"]
    assert guided["content"].endswith("[The Start of Assistant's Answer]\nmy answer\n[The End of Assistant's Answer]")


# ---------------------------------------------------------------------------------------------
# Runs against scripted upstreams


def test_judged_rewards_are_the_canned_ratings_over_10_and_the_judge_is_priced_beside_the_call(tmp_path, servers):
    agents, judge = servers
    cfg = settings(tmp_path, agents, judge)
    result = collect(cfg)
    # 3 tasks x 3 agents x 2 repetitions asked; the judge rates a's and b's answers to the two judged tasks
    # (c's empty answers are wrong without asking it): 2 x 2 x 2 verdicts, each in one call.
    assert len(agents.requests) == result.made == 18 and len(judge.requests) == result.judged == 8
    assert result.ungraded == 0 and result.tasks_written == result.tasks_rated == 3
    rewards = {row["task_id"]: row for row in read_rows(cfg.rewards_path)}
    assert rewards["open"]["mean_reward"] == [8 / 10, 3 / 10, 0.0] and rewards["open"]["best_agents"] == ["a"]
    assert rewards["guided"]["mean_reward"] == [8 / 10, 3 / 10, 0.0] and rewards["guided"]["n_ungraded"] == [0, 0, 0]
    assert rewards["checked"]["mean_reward"] == [0.0, 0.0, 0.0] and "n_ungraded" not in rewards["checked"]
    # Reference-guided for the task with an answer, the general prompt for the one without.
    guided = [body for body in judge.requests if "What is 2 + 2?" in body["messages"][-1]["content"]]
    reference = "[The Start of Reference Answer]\n4\n"
    assert len(guided) == 4 and all(reference in body["messages"][-1]["content"] for body in guided)
    assert all("Reference" not in b["messages"][-1]["content"] for b in judge.requests if b not in guided)
    assert all(body["temperature"] == 0.0 and body["model"] == "m-judge" for body in judge.requests)
    # The calls file: the agent's own cost as cost_usd, the judge's beside it; together what was billed.
    calls = {row["task_id"]: row["calls"] for row in read_rows(cfg.output)}
    first = calls["open"][0]
    assert (first["agent"], first["reward"], first["correct"], first["cost_usd"]) == ("a", 0.8, None, AGENT_COST)
    verdict = first["judge"]
    assert verdict["rating"] == 8 and verdict["cost_usd"] == JUDGE_COST and verdict["attempts"] == 1
    assert first["judge"]["judgment"] == "Clear. Rating: [[8]]" and first["judge"]["agent"] == "judge"
    empty = calls["open"][-1]
    assert (empty["agent"], empty["empty"], empty["reward"], empty["judge"]) == ("c", True, 0.0, None)
    billed = len(agents.requests) * AGENT_COST + len(judge.requests) * JUDGE_COST
    in_file = sum(c["cost_usd"] + (c.get("judge") or {}).get("cost_usd", 0.0) for row in calls.values() for c in row)
    assert result.total_cost_usd == pytest.approx(billed) and in_file == pytest.approx(billed)
    # train's cost reader: each agent costs what its own calls cost (the judge is a cost of measuring,
    # which a routed request never pays), and the judged rewards pass its check against the calls.
    costs = load_cost_data(cfg.output, cfg.rewards_path)
    assert costs.cost_usd.tolist() == [[AGENT_COST] * 3] * 3 and costs.rewards[0].tolist() == [0.8, 0.3, 0.0]
    # and train's rewards reader joins the judged rows with tasks that have no answer
    labelled = join_rewards(read_rows(cfg.rewards_path), TASKS, min_rows=1)
    assert labelled.task_ids == ["open", "guided", "checked"] and labelled.rewards[1].tolist() == [0.8, 0.3, 0.0]


def test_a_verdict_without_a_rating_is_asked_again_once_then_left_ungraded_not_wrong(tmp_path, servers):
    agents, judge = servers
    judge.reply = scripted_judge(
        {"alpha": ["Rating: [[8]]"], "beta": ["Looks fine.", "Rating: [[6]]", "garbage", "Rating: [[11]]"]}
    )
    write_jsonl(tmp_path / "tasks.jsonl", TASKS[:1])
    cfg = settings(tmp_path, agents, judge, concurrency=1)  # cells in order: the script's turns are known
    result = collect(cfg)
    assert len(judge.requests) == 2 + 4 and result.judged == 4 and result.ungraded == 1
    (row,) = read_rows(cfg.rewards_path)
    # b: rated 6 on its second try, ungraded after two on the other: its mean is over the graded answer only.
    assert row["mean_reward"] == [0.8, 0.6, 0.0] and row["n_ungraded"] == [0, 1, 0]
    (calls,) = [r["calls"] for r in read_rows(cfg.output)]
    b0, b1 = (call for call in calls if call["agent"] == "b")
    assert (b0["reward"], b0["judge"]["attempts"], b0["judge"]["error"]) == (0.6, 2, None)
    assert b0["judge"]["cost_usd"] == pytest.approx(2 * JUDGE_COST)  # both attempts were billed
    assert (b1["reward"], b1["judge"]["rating"], b1["judge"]["attempts"]) == (None, None, 2)
    assert b1["judge"]["error"] == f"{UNPARSEABLE} (2 attempts)" and b1["judge"]["judgment"] == "Rating: [[11]]"


def test_a_judge_that_is_down_leaves_answers_ungraded_not_wrong(tmp_path, servers, down_upstream_url):
    agents, _ = servers
    write_jsonl(tmp_path / "tasks.jsonl", TASKS[:1])
    cfg = settings(tmp_path, agents, None, repetitions=1, retries=1)
    write_pool(tmp_path / "judge.json", down_upstream_url, ["judge"])
    result = collect(CollectConfig(**{**cfg.__dict__, "judge_pool": tmp_path / "judge.json"}))
    assert (result.made, result.judged, result.ungraded, result.tasks_rated) == (3, 2, 2, 0)
    (row,) = read_rows(cfg.output)
    verdict = row["calls"][0]["judge"]
    assert row["calls"][0]["reward"] is None and verdict["attempts"] == 1 and verdict["cost_usd"] == 0.0
    error = verdict["error"]
    assert error.startswith("judge call failed: ConnectError") and error.endswith("(after 2 attempts)")


def test_a_task_whose_agent_has_no_rating_is_left_out_of_the_rewards_file(tmp_path, servers, capsys, caplog):
    """All of b's verdicts are garbage: b has no graded answer, so the task has no reward for b; it stays in
    the calls file and the summary counts the ungraded answers."""
    agents, judge = servers
    judge.reply = scripted_judge({"alpha": ["Rating: [[8]]"], "beta": ["no idea"]})
    write_jsonl(tmp_path / "tasks.jsonl", TASKS[:1])
    cfg = settings(tmp_path, agents, judge)
    args = ["--tasks", cfg.tasks, "--pool", cfg.pool, "--output", cfg.output, "--judge-pool", cfg.judge_pool]
    assert cli("collect", *args, "--repetitions", "2", "--no-progress") == 0
    out = capsys.readouterr().out
    assert "judge: 2 of 4 answers rated this run (0.0060 USD); 2 answers ungraded in" in out
    assert "warning: 1 tasks left out of" in caplog.text and read_rows(cfg.rewards_path) == []
    (row,) = read_rows(cfg.output)
    assert row["mean_reward"] == [0.8, None, 0.0]
    assert [call["reward"] for call in row["calls"]] == [0.8, 0.8, None, None, 0.0, 0.0]


def test_the_summary_counts_the_answers_the_judge_rated_not_those_it_was_asked_about(tmp_path, servers, capsys):
    agents, judge = servers
    judge.reply = scripted_judge({"alpha": ["no idea"], "beta": ["no idea"]})
    write_jsonl(tmp_path / "tasks.jsonl", TASKS[:1])
    cfg = settings(tmp_path, agents, judge, repetitions=1)
    args = ["--tasks", cfg.tasks, "--pool", cfg.pool, "--output", cfg.output, "--judge-pool", cfg.judge_pool]
    assert cli("collect", *args, "--repetitions", "1", "--no-progress") == 0
    out = capsys.readouterr().out
    assert len(judge.requests) == 4  # a's and b's answers, each asked twice: no rating either time
    assert "judge: 0 of 2 answers rated this run (0.0040 USD); 2 answers ungraded in" in out, out


def test_a_decimal_rating_is_a_reward_of_a_tenth_of_it_and_resumes(tmp_path, servers):
    """`Rating: [[8.5]]` (GPT-4 writes such ratings judging MT-Bench) is 0.85, not an ungraded answer; the
    journal holds it, so a resumed run asks nobody again and writes the same files."""
    agents, judge = servers
    judge.reply = scripted_judge({"alpha": ["Good. Rating: [[8.5]]"], "beta": ["Weak. Rating: [[3]]"]})
    write_jsonl(tmp_path / "tasks.jsonl", TASKS[:1])
    cfg = settings(tmp_path, agents, judge)
    result = collect(cfg)
    (row,) = read_rows(cfg.rewards_path)
    assert result.ungraded == 0 and row["mean_reward"] == [0.85, 0.3, 0.0]
    (calls,) = [r["calls"] for r in read_rows(cfg.output)]
    assert (calls[0]["reward"], calls[0]["judge"]["rating"]) == (0.85, 8.5)
    files = cfg.output.read_text(), cfg.rewards_path.read_text()
    again = collect(settings(tmp_path, agents, judge, resume=True))
    assert (again.made, again.judged) == (0, 0) and (cfg.output.read_text(), cfg.rewards_path.read_text()) == files


def test_a_huge_verdict_is_stored_cut_with_a_mark_and_its_rating_read(tmp_path, servers):
    """A 5 MB verdict was kept whole twice, in the journal and in the calls file; now both keep its start
    and its end (where the rating is) with a mark saying how much was cut."""
    from benchgen_router.collect.judge import MAX_JUDGMENT_CHARS

    agents, judge = servers
    rambling = "Let me think. " + "x" * 5_000_000 + " Rating: [[7]]"
    judge.reply = scripted_judge({"alpha": [rambling], "beta": ["Rating: [[3]]"]})
    write_jsonl(tmp_path / "tasks.jsonl", TASKS[:1])
    cfg = settings(tmp_path, agents, judge, repetitions=1)
    collect(cfg)
    (calls,) = [r["calls"] for r in read_rows(cfg.output)]
    stored = calls[0]["judge"]["judgment"]
    assert calls[0]["reward"] == 0.7 and len(stored) <= MAX_JUDGMENT_CHARS + 100
    assert stored.startswith("Let me think. xxx") and stored.endswith("xxx Rating: [[7]]")
    cut = len(rambling) - MAX_JUDGMENT_CHARS
    assert f"[... {cut:,} characters of the judge's verdict cut here ...]" in stored
    assert calls[1]["judge"]["judgment"] == "Rating: [[3]]"  # a verdict within the limit is kept whole
    assert cfg.journal_path.stat().st_size < 100_000 and cfg.output.stat().st_size < 100_000


def test_resuming_asks_neither_the_agents_nor_the_judge_again(tmp_path, servers):
    """A run stopped by Ctrl-C while the judge is asked; the resumed run judges only the answers the
    journal has no verdict on and asks no agent twice; a third run asks nothing and writes the same files."""
    from benchgen_router.collect import chat as http

    agents, judge = servers
    cfg = settings(tmp_path, agents, judge, concurrency=1)
    judge_calls: list[int] = []

    async def stopped_on_third(upstream, messages):
        judge_calls.append(1)
        if len(judge_calls) == 3:
            raise KeyboardInterrupt
        async with httpx.AsyncClient() as client:
            return await http.ask(client, upstream, messages, temperature=0.0)

    with pytest.raises(KeyboardInterrupt):
        collect(cfg, judge_ask=stopped_on_third)
    asked, judged = len(agents.requests), len(judge.requests)
    assert judged == 2 and asked >= 3  # the third answer was journaled; its verdict was not
    result = collect(settings(tmp_path, agents, judge, concurrency=1, resume=True))
    assert len(agents.requests) == 18 and len(judge.requests) == 8  # each cell, and each verdict, once
    assert result.made == 18 - asked and result.judged == 8 - judged
    files = cfg.output.read_text(), cfg.rewards_path.read_text()
    again = collect(settings(tmp_path, agents, judge, resume=True))
    assert (again.made, again.judged, len(agents.requests), len(judge.requests)) == (0, 0, 18, 8)
    assert (cfg.output.read_text(), cfg.rewards_path.read_text()) == files
    assert [row["mean_reward"] for row in read_rows(cfg.rewards_path)][:2] == [[0.8, 0.3, 0.0]] * 2


def test_a_torn_last_verdict_is_asked_again_and_a_damaged_one_is_named(tmp_path, servers):
    agents, judge = servers
    write_jsonl(tmp_path / "tasks.jsonl", TASKS[:1])
    cfg = settings(tmp_path, agents, judge, repetitions=1, concurrency=1)
    collect(cfg)
    lines = cfg.journal_path.read_text().splitlines(keepends=True)
    assert [("verdict" in json.loads(line)) for line in lines[1:]] == [False, True, False, True, False]
    cfg.journal_path.write_text("".join(lines[:-2]) + lines[-2][:25])  # the last verdict torn mid-line
    resumed = collect(settings(tmp_path, agents, judge, repetitions=1, concurrency=1, resume=True))
    assert (resumed.made, resumed.judged, len(agents.requests), len(judge.requests)) == (1, 1, 4, 3)
    damaged = cfg.journal_path.read_text().splitlines(keepends=True)
    damaged[2] = damaged[2].replace('"rating": 8', '"rating": 80')
    cfg.journal_path.write_text("".join(damaged))
    with pytest.raises(InputError, match=r"line 3 is damaged; remove that line to resume\.$"):
        collect(settings(tmp_path, agents, judge, repetitions=1, resume=True))


def test_answers_journaled_before_the_judge_are_judged_on_resume_without_asking_again(tmp_path, servers):
    """Tasks first measured with a reference grader, then resumed as judged tasks: only the judge is asked."""
    agents, judge = servers
    checked = [{**task, "answer": "alpha", "grader": "exact_match_ci"} for task in TASKS[:2]]
    write_jsonl(tmp_path / "tasks.jsonl", checked)
    first = collect(settings(tmp_path, agents, None))
    assert first.made == len(agents.requests) == 12 and judge.requests == []
    write_jsonl(tmp_path / "tasks.jsonl", [{**task, "grader": "judge"} for task in checked])
    second = collect(settings(tmp_path, agents, judge, resume=True))
    assert (second.made, len(agents.requests), second.judged, len(judge.requests)) == (0, 12, 8, 8)


def test_resuming_with_another_judge_is_refused(tmp_path, servers):
    agents, judge = servers
    write_jsonl(tmp_path / "tasks.jsonl", TASKS[:1])
    collect(settings(tmp_path, agents, judge, repetitions=1))
    asked = len(agents.requests)
    with pytest.raises(InputError, match=r"holds verdicts of judge 'judge' \(m-judge\), not of 'a' \(m-a\); resume"):
        collect(settings(tmp_path, agents, None, judge="a", repetitions=1, resume=True))
    assert len(agents.requests) == asked


def test_the_cost_cap_counts_the_judges_calls(tmp_path, servers):
    agents, judge = servers
    cap = 0.1  # the whole run costs 18 x 0.01 + 8 x 0.001 = 0.188 USD
    result = collect(settings(tmp_path, agents, judge, max_cost_usd=cap, concurrency=4))
    billed = len(agents.requests) * AGENT_COST + len(judge.requests) * JUDGE_COST
    assert result.stopped == STOPPED_AT_COST_CAP and result.total_cost_usd == pytest.approx(billed)
    assert billed <= cap + 1e-12 and judge.requests  # the judge was asked, and paid for within the cap


def test_a_judge_that_is_an_agent_of_the_pool(tmp_path, servers):
    """--judge b: b answers the tasks and rates everyone's answers; its verdicts cost beside the rated calls."""
    agents, _ = servers
    rate = scripted_judge({"alpha": ["Rating: [[9]]"], "beta": ["Rating: [[2]]"]})
    agents.reply = lambda body: rate(body) if body["messages"][0]["role"] == "system" else agent_reply(body)
    write_jsonl(tmp_path / "tasks.jsonl", TASKS[:1])
    result = collect(settings(tmp_path, agents, None, judge="b", repetitions=1))
    assert result.made == 3 and result.judged == 2 and len(agents.requests) == 5
    (row,) = read_rows(settings(tmp_path, agents, None).rewards_path)
    assert row["mean_reward"] == [0.9, 0.2, 0.0]


# ---------------------------------------------------------------------------------------------
# Bad input: one line, nothing asked


def test_a_judge_that_is_not_in_the_pool_is_one_line_exit_2_and_nothing_is_asked(tmp_path, servers, capsys):
    agents, _ = servers
    cfg = settings(tmp_path, agents, None)
    args = ["--tasks", cfg.tasks, "--pool", cfg.pool, "--output", cfg.output, "--no-progress"]
    assert cli("collect", *args, "--judge", "gpt-judge") == 2
    err = capsys.readouterr().err.strip()
    expected = "error: --judge gpt-judge is not an agent of the pool ['a', 'b', 'c']; name one of them, or pass "
    assert err == expected + "--judge-pool for a judge of its own."
    assert agents.requests == [] and not cfg.journal_path.exists() and not cfg.output.exists()


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (TASKS[0], "error: tasks file {tasks} row 1 (open) has no answer; every task needs the answer its grader "
                   "compares with (or pass --judge to have a judge rate the answers of tasks without one)."),
        (TASKS[1], "error: tasks file {tasks} row 1 (guided) asks for grader 'judge'; pass --judge or --judge-pool "
                   "to rate answers."),
    ],
)  # fmt: skip
def test_a_task_for_the_judge_without_a_judge_is_refused_in_one_line(tmp_path, servers, capsys, row, message):
    agents, _ = servers
    write_jsonl(tmp_path / "tasks.jsonl", [row])
    cfg = settings(tmp_path, agents, None)
    args = ["--tasks", cfg.tasks, "--pool", cfg.pool, "--output", cfg.output, "--no-progress"]
    assert cli("collect", *args) == 2
    assert capsys.readouterr().err.strip() == message.format(tasks=cfg.tasks)
    assert agents.requests == [] and not cfg.journal_path.exists()


def test_a_judge_pool_of_several_agents_needs_one_named(tmp_path, servers):
    agents, judge = servers
    cfg = settings(tmp_path, agents, judge)
    write_pool(cfg.judge_pool, judge.base_url, ["j1", "j2"])
    with pytest.raises(InputError, match=r"has 2 agents \['j1', 'j2'\]; pick one with judge\.$"):
        collect(cfg)
    result = collect(settings(tmp_path, agents, judge, judge="judge"))
    assert result.judged == 8
