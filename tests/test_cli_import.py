"""`benchgen-router import` as users run it: RouteLLM's files (a slice of the real ones) into the three files,
which `train` and `evaluate` then read; the long format with a pool; bad input as one line, exit 2, nothing
written."""

from __future__ import annotations

import csv
import json
import pickle

import pytest

from helpers import SHARED, cli, write_csv

MMLU = SHARED / "routellm-evals" / "mmlu"
SLICE = [MMLU / "responses" / "mmlu_machine_learning.csv", MMLU / "responses" / "mmlu_college_chemistry.csv"]
needs_routellm = pytest.mark.skipif(
    not (MMLU / "responses").is_dir(), reason=f"RouteLLM's evaluation data not found at {MMLU.parent} (CI has it)"
)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


@pytest.mark.slow  # imports, trains and evaluates a slice of RouteLLM's MMLU through the command
@needs_routellm
def test_routellm_slice_imports_and_train_and_evaluate_read_it(tmp_path, backbone_dir, capsys):
    contaminated = {
        json.loads(line)["eval_prompt"] for line in (MMLU / "contaminated_prompts.jsonl").read_text().splitlines()
    }
    rows = []
    for path in SLICE:
        with open(path, newline="", encoding="utf-8") as handle:
            rows.extend(csv.DictReader(handle))
    dropped = sum(row["prompt"] in contaminated for row in rows)
    out = tmp_path / "mmlu"
    assert (
        cli("import", "--routellm", *SLICE, "--contaminated", MMLU / "contaminated_prompts.jsonl", "--output-dir", out)
        == 0
    )
    stdout = capsys.readouterr().out
    assert f"import: {len(rows) - dropped} tasks x 2 agents from 2 files, 2 groups; {dropped} contaminated" in stdout
    assert "cost counts calls (not USD)" in stdout and "mean cost 1 per call (counted in calls, not USD)" in stdout
    tasks = [json.loads(line) for line in (out / "tasks.jsonl").read_text().splitlines()]
    assert len(tasks) == len(rows) - dropped and not {task["prompt"] for task in tasks} & contaminated

    common = ["--rewards", out / "rewards.jsonl", "--tasks", out / "tasks.jsonl", "--no-progress"]
    trained = cli(
        "train", *common, "--calls", out / "calls.jsonl", "--backbone", backbone_dir, "--generations", "3",
        "--cv-folds", "0", "--output-dir", tmp_path / "run", "--export", tmp_path / "router",
        "--cache-dir", tmp_path / "cache",
    )  # fmt: skip
    assert trained == 0, capsys.readouterr().err
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["n_total"] == len(rows) - dropped
    assert manifest["agent_order"] == ["mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview"]
    assert cli("evaluate", "--model", tmp_path / "router", *common) == 0, capsys.readouterr().err


def test_long_file_with_a_pool_is_priced_per_token(tmp_path, capsys):
    path = write_csv(
        tmp_path / "toolkit.csv",
        ["question", "model", "isCorrect", "output_tokens"],
        [["q1", "small", "True", 1000], ["q1", "large", "True", 2000], ["q2", "small", "False", 500],
         ["q2", "large", "True", 4000]],
    )  # fmt: skip
    pool = tmp_path / "agents.json"
    pool.write_text(json.dumps([
        {"agent_id": "small", "price_per_1m_prompt_usd": 0.1, "price_per_1m_output_usd": 1.0},
        {"agent_id": "large", "price_per_1m_prompt_usd": 2.0, "price_per_1m_output_usd": 10.0},
    ]))  # fmt: skip
    assert cli("import", "--long", path, "--pool", pool, "--output-dir", tmp_path / "out") == 0
    stdout = capsys.readouterr().out
    assert "small: mean reward 0.5000, mean cost 0.00075 USD per call" in stdout  # (1000 + 500) / 2 tokens at $1/1M
    assert "large: mean reward 1.0000, mean cost 0.03 USD per call" in stdout  # (2000 + 4000) / 2 tokens at $10/1M
    calls = [json.loads(line) for line in (tmp_path / "out" / "calls.jsonl").read_text().splitlines()]
    assert [call["cost_usd"] for call in calls[1]["calls"]] == [500 * 1.0 / 1e6, 4000 * 10.0 / 1e6]
    assert [call["completion_tokens"] for call in calls[1]["calls"]] == [500, 4000]


@pytest.mark.parametrize(
    ("files", "args", "message"),
    [
        (
            {"o.csv": b"prompt,model,correct\nq,a,1\nq,b,yes\nr,a,1\n"},
            ["--long", "o.csv"],
            "o.csv: prompt 'r' (line 4) has no row for model 'b'; every task needs one row per model, or pass "
            "--drop-incomplete to leave such tasks out.",
        ),
        (
            {"o.csv": b"prompt,model,correct\nq,a,0.5\nq,b,1\n"},
            ["--long", "o.csv"],
            "pass --correct-at SCORE to count a score from SCORE up as correct",
        ),
        ({"o.pkl": pickle.dumps([1])}, ["--long", "o.pkl"], "o.pkl is a pickle"),
        ({"o.csv": pickle.dumps({"a": 1})}, ["--routellm", "o.csv"], "o.csv holds a pickle"),
        ({"s.csv": b"prompt,m1,m2\nq,True,Nope\n"}, ["--routellm", "s.csv"], "s.csv line 2: 'm2' is 'Nope'"),
        (
            {"o.csv": b"prompt,model,correct\nq,a,1\n", "c.jsonl": b'{"train_prompt": "x"}\n'},
            ["--long", "o.csv", "--contaminated", "c.jsonl"],
            "c.jsonl line 1 has no eval_prompt",
        ),
        ({"o.csv": b"q,who,ok\nq,a,1\n"}, ["--long", "o.csv"], "Pass --prompt-column NAME"),
        ({"o.csv": b"prompt,model,correct\nq,a,1\n"}, ["--long", "o.csv", "--models", "a"], "--models is for"),
        ({"s.csv": b"prompt,m\nq,True\n"}, ["--routellm", "s.csv", "--correct-at", "0.5"], "are for --long"),
        ({"s.csv": b"prompt,m\nq,True\n"}, ["--routellm", "s.csv", "--call-cost", "m"], "must be AGENT=COST"),
        (
            {"s.csv": b"prompt,m,n\nq,True,False\n"},
            ["--routellm", "s.csv", "--call-cost", "m=1"],
            "--call-cost must name every agent ['m', 'n'] once (missing: ['n']",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, monkeypatch, files, args, message):
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    monkeypatch.chdir(tmp_path)
    assert cli("import", *args, "--output-dir", "out") == 2
    lines = error_lines(capsys.readouterr().err)
    assert message in lines[-1] and lines[-1].startswith(("error: ", "usage: ", "benchgen-router import: error: "))
    assert "Traceback" not in "\n".join(lines)
    assert not (tmp_path / "out").exists()


def test_a_failed_import_leaves_earlier_files_as_they_were(tmp_path, capsys):
    good = write_csv(tmp_path / "good.csv", ["prompt", "model", "correct"], [["q", "a", 1], ["q", "b", 0]])
    assert cli("import", "--long", good, "--output-dir", tmp_path / "out") == 0
    before = {path.name: path.read_bytes() for path in (tmp_path / "out").iterdir()}
    bad = write_csv(tmp_path / "bad.csv", ["prompt", "model", "correct"], [["q", "a", 1], ["q", "a", 0]])
    assert cli("import", "--long", bad, "--output-dir", tmp_path / "out") == 2
    assert "bad.csv line 3 repeats prompt 'q' for model 'a'" in capsys.readouterr().err
    assert {path.name: path.read_bytes() for path in (tmp_path / "out").iterdir()} == before


@needs_routellm
def test_routellm_with_strong_1_weak_0_costs_the_share_of_strong_calls(tmp_path, capsys):
    args = ["--routellm", SLICE[0], "--call-cost", "gpt-4-1106-preview=1", "--call-cost-unit", "calls"]
    args += ["--call-cost", "mistralai/Mixtral-8x7B-Instruct-v0.1=0", "--output-dir", tmp_path / "out"]
    assert cli("import", *args) == 0
    stdout = capsys.readouterr().out
    assert "gpt-4-1106-preview: mean reward" in stdout and "mean cost 1 per call (counted in calls, not USD)" in stdout
    assert "mean cost 0 per call (counted in calls, not USD)" in stdout and "cost counts calls" not in stdout
    row = json.loads((tmp_path / "out" / "calls.jsonl").read_text().splitlines()[0])
    assert [(call["agent"], call["cost_usd"]) for call in row["calls"]] == [
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", 0.0),
        ("gpt-4-1106-preview", 1.0),
    ]


def test_a_per_sample_log_imports_by_id(tmp_path, capsys):
    questions = tmp_path / "questions.jsonl"
    questions.write_text(
        "".join(
            json.dumps({"question_id": qid, "category": group, "prompt": prompt}) + "\n"
            for qid, group, prompt in [(7, "law", "Same text"), (8, "law", "Same text"), (9, "math", "2+2?")]
        )
    )
    outcomes = write_csv(
        tmp_path / "outcomes.csv",
        ["question_id", "model", "correct", "cost_usd"],
        [[7, "a", 1, 0.1], [7, "b", 0, 0.2], [8, "a", 0, 0.1], [8, "b", 1, 0.2], [9, "a", 1, 0.1]],
    )
    args = ["--long", outcomes, "--prompts", questions, "--id-column", "question_id", "--cost-column", "cost_usd"]
    assert cli("import", *args, "--drop-incomplete", "--output-dir", tmp_path / "out") == 0
    stdout = capsys.readouterr().out
    assert (
        "import: 2 tasks x 2 agents from" in stdout and "1 tasks without a row for every model were left out" in stdout
    )
    tasks = [json.loads(line) for line in (tmp_path / "out" / "tasks.jsonl").read_text().splitlines()]
    assert [task["task_id"] for task in tasks] == ["7", "8"] and {task["task_group"] for task in tasks} == {"law"}
    assert cli("import", "--long", outcomes, "--id-column", "question_id", "--output-dir", tmp_path / "x") == 2
    assert "--id-column names the id --prompts is joined on" in capsys.readouterr().err
    assert cli("import", "--routellm", outcomes, "--prompts", questions, "--output-dir", tmp_path / "x") == 2
    assert not (tmp_path / "x").exists()


MMLU_PRO = SHARED / "mmlu-pro-outcomes"


@pytest.mark.slow  # 347,215 rows
@pytest.mark.skipif(not MMLU_PRO.is_dir(), reason=f"MMLU-Pro's outcomes not found at {MMLU_PRO} (CI has them)")
def test_mmlu_pro_imports_as_published(tmp_path, capsys):
    """The whole published matrix: 12,032 questions, 29 models, 159 prompts under two ids each. Expected
    figures are counted here from the files with the csv module."""
    cells: dict[str, dict[str, tuple[str, str]]] = {}
    with open(MMLU_PRO / "outcomes.csv", newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            cells.setdefault(row["question_id"], {})[row["model"]] = (row["correct"], row["cost_usd"])
    models = {model for by_model in cells.values() for model in by_model}
    complete = [qid for qid, by_model in cells.items() if len(by_model) == len(models)]
    out = tmp_path / "mmlu-pro"
    args = ["--long", MMLU_PRO / "outcomes.csv", "--prompts", MMLU_PRO / "questions.jsonl"]
    args += ["--id-column", "question_id", "--cost-column", "cost_usd", "--drop-incomplete", "--output-dir", out]
    assert cli("import", *args) == 0
    assert f"import: {len(complete)} tasks x {len(models)} agents" in capsys.readouterr().out
    rewards = [json.loads(line) for line in (out / "rewards.jsonl").read_text().splitlines()]
    assert sorted(row["task_id"] for row in rewards) == sorted(complete)
    order = rewards[0]["agent_order"]
    best = "gemini-1.5-pro-002"
    expected = sum(cells[qid][best][0] == "1" for qid in complete) / len(complete)
    got = sum(row["mean_reward"][order.index(best)] for row in rewards) / len(rewards)
    assert got == pytest.approx(expected, abs=1e-12) and len(complete) == 10326
    prompts = [json.loads(line)["prompt"] for line in (out / "tasks.jsonl").read_text().splitlines()]
    assert len(prompts) - len(set(prompts)) > 0  # repeated prompts stay separate tasks
