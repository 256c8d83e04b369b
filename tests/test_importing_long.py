"""importing/long.py: the long format (NVIDIA's toolkit CSV, LLMRouter's routing JSONL, a per-sample log's
outcomes joined by id to its prompts) read into Outcomes; malformed input as one line naming file and line.

Expected values are read from the files here with the csv/json modules, independently of the package."""

from __future__ import annotations

import csv
import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from benchgen_router.costs import load_pool
from benchgen_router.errors import InputError
from benchgen_router.importing import LongColumns, read_contaminated, read_long_outcomes, read_prompts, with_prices
from helpers import write_csv, write_jsonl


def csv_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def eval_prompts(path: Path) -> set[str]:
    return {json.loads(line)["eval_prompt"] for line in path.read_text(encoding="utf-8").splitlines() if line}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# The long format


def test_nvidia_toolkit_csv_needs_no_flags_and_prices_output_tokens_from_the_pool(tmp_path):
    path = write_csv(
        tmp_path / "toolkit.csv",
        ["question", "model", "isCorrect", "output_tokens"],
        [
            ["What is 2+2?", "small", "True", 10],
            ["What is 2+2?", "large", "True", 300],
            ["Prove it.", "small", "False", 50],
            ["Prove it.", "large", "True", 900],
        ],
    )
    pool = tmp_path / "agents.json"
    pool.write_text(
        json.dumps(
            [
                {"agent_id": "large", "price_per_1m_prompt_usd": 5.0, "price_per_1m_output_usd": 20.0},
                {"agent_id": "small", "price_per_1m_prompt_usd": 0.1, "price_per_1m_output_usd": 0.4},
            ]
        )
    )
    outcomes = read_long_outcomes(path)
    assert outcomes.agents == ["small", "large"] and outcomes.prompts == ["What is 2+2?", "Prove it."]
    assert outcomes.rewards.tolist() == [[1.0, 1.0], [0.0, 1.0]]
    priced = with_prices(outcomes, load_pool(pool, outcomes.agents))
    expected = np.array([[10 * 0.4, 300 * 20.0], [50 * 0.4, 900 * 20.0]]) / 1e6
    np.testing.assert_allclose(priced.cost_usd, expected, rtol=1e-12)
    assert any("no prompt token count" in note for note in priced.notes)


def llmrouter_rows() -> list[dict]:
    """LLMRouter's routing data fields (llmrouter/data/README.md): the query fields plus model_name,
    response, token_num, input_tokens, output_tokens, response_time (s), performance, embedding_id."""
    rows = []
    for k, (task, query) in enumerate([("gsm8k", "Janet has 4 apples..."), ("mmlu", "Capital of France?")]):
        for j, model in enumerate(["qwen2.5-7b-instruct", "llama3-70b-instruct"]):
            rows.append(
                {
                    "task_name": task,
                    "query": query,
                    "ground_truth": "2",
                    "metric": "em_mc",
                    "choices": None,
                    "task_id": None,
                    "model_name": model,
                    "response": f"answer {j}",
                    "token_num": 110 + j,
                    "input_tokens": 100,
                    "output_tokens": 10 + j,
                    "response_time": 1.5 + j,
                    "api_key_used": "",
                    "performance": float((k + j) % 2),
                    "embedding_id": k,
                    "user_id": None,
                    "fig_id": None,
                }
            )
    return rows


def test_llmrouter_routing_jsonl_needs_no_flags(tmp_path):
    outcomes = read_long_outcomes(write_jsonl(tmp_path / "routing.jsonl", llmrouter_rows()))
    assert outcomes.agents == ["qwen2.5-7b-instruct", "llama3-70b-instruct"]
    assert outcomes.groups == ["gsm8k", "mmlu"] and outcomes.rewards.tolist() == [[0.0, 1.0], [1.0, 0.0]]
    assert outcomes.latency_ms.tolist() == [[1500.0, 2500.0], [1500.0, 2500.0]]  # response_time is in seconds
    assert outcomes.prompt_tokens.tolist() == [[100, 100], [100, 100]]
    assert outcomes.completion_tokens.tolist() == [[10, 11], [10, 11]]
    assert outcomes.responses == [["answer 0", "answer 1"], ["answer 0", "answer 1"]]
    assert outcomes.task_ids[0].startswith("gsm8k:") and outcomes.task_ids[1].startswith("mmlu:")


def test_long_task_ids_do_not_depend_on_row_order(tmp_path):
    rows = llmrouter_rows()
    forward = read_long_outcomes(write_jsonl(tmp_path / "a.jsonl", rows))
    backward = read_long_outcomes(write_jsonl(tmp_path / "b.jsonl", rows[::-1]))
    assert dict(zip(forward.task_ids, forward.prompts, strict=True)) == dict(
        zip(backward.task_ids, backward.prompts, strict=True)
    )
    assert len(set(forward.task_ids)) == 2


def test_scores_between_0_and_1_need_a_threshold(tmp_path):
    rows = llmrouter_rows()
    rows[1]["performance"] = 0.75
    rows[3]["performance"] = 0.25
    path = write_jsonl(tmp_path / "scores.jsonl", rows)
    with pytest.raises(
        InputError, match=r"scores.jsonl line 2: 'performance' is the score 0.75; .* correct_at='SCORE'"
    ):
        read_long_outcomes(path)
    assert read_long_outcomes(path, correct_at=0.5).rewards.tolist() == [[0.0, 1.0], [1.0, 0.0]]
    assert read_long_outcomes(path, correct_at=0.8).rewards.tolist() == [[0.0, 0.0], [1.0, 0.0]]


def test_chosen_columns_and_latency_unit(tmp_path):
    path = write_csv(
        tmp_path / "custom.tsv".replace(".tsv", ".csv"),
        ["Q", "who", "ok", "secs", "usd"],
        [["q1", "a", 1, 0.5, 0.002], ["q1", "b", 0, 2, 0.01]],
    )
    columns = LongColumns(prompt="Q", model="who", correct="ok", latency="secs", latency_unit="s", cost="usd")
    outcomes = read_long_outcomes(path, columns)
    assert outcomes.latency_ms.tolist() == [[500.0, 2000.0]] and outcomes.cost_usd.tolist() == [[0.002, 0.01]]
    with pytest.raises(InputError, match=r"custom.csv has none of the usual model columns .* Pass model_column='NAME'"):
        read_long_outcomes(path, LongColumns(prompt="Q", correct="ok"))


def test_a_missing_cell_names_the_prompt_or_is_dropped_on_request(tmp_path):
    path = write_csv(
        tmp_path / "gaps.csv",
        ["prompt", "model", "correct"],
        [
            ["first", "a", "True"],
            ["first", "b", "False"],
            ["second", "a", "True"],
            ["third", "b", "True"],
            ["third", "a", "False"],
        ],
    )
    with pytest.raises(InputError, match=r"gaps.csv: prompt 'second' \(line 4\) has no row for model 'b'"):
        read_long_outcomes(path)
    outcomes = read_long_outcomes(path, drop_incomplete=True)
    assert outcomes.prompts == ["first", "third"] and outcomes.dropped_incomplete == 1
    assert outcomes.rewards.tolist() == [[1.0, 0.0], [0.0, 1.0]]


def test_a_repeated_cell_names_both_lines(tmp_path):
    path = write_csv(
        tmp_path / "twice.csv", ["prompt", "model", "correct"], [["p", "a", 1], ["p", "b", 0], ["p", "a", 0]]
    )
    with pytest.raises(InputError, match=r"twice.csv line 4 repeats prompt 'p' for model 'a' \(first at line 2\)"):
        read_long_outcomes(path)


def test_long_format_contamination_list_drops_rows(tmp_path):
    path = write_csv(tmp_path / "c.csv", ["prompt", "model", "correct"], [["keep", "a", 1], ["leak", "a", 0]])
    listing = write_jsonl(tmp_path / "contaminated.jsonl", [{"eval_prompt": "leak", "train_prompt": "x", "sim": 0.9}])
    outcomes = read_long_outcomes(path, contaminated=[listing])
    assert outcomes.prompts == ["keep"] and outcomes.dropped_contaminated == 1
    assert read_contaminated([listing]) == {"leak"}


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("outcomes.pkl", b"anything", "is a pickle"),
        ("outcomes.csv", pickle.dumps({"prompt": "x"}), "holds a pickle"),
        ("outcomes.jsonl", pickle.dumps([1, 2]), "holds a pickle"),
        ("outcomes.csv", b'prompt,model,correct\n"open,a,1\n', "line 2 has 1 fields for 3 columns"),
        ("outcomes.csv", b"prompt,model,correct\nq,a,1,extra\n", "line 2 has 4 fields for 3 columns"),
        ("outcomes.csv", b"prompt,model,correct\nq,a,\xff\n", "line 2 is not UTF-8 text"),
        ("outcomes.jsonl", b'{"prompt": "q", "model": "a", "correct": true}\n{oops\n', "line 2 is not valid JSON"),
        ("outcomes.jsonl", b'{"prompt": "q", "model": "a", "correct": 2}\n', "line 1: 'correct' is 2"),
        ("outcomes.jsonl", b'{"prompt": "", "model": "a", "correct": 1}\n', "line 1: 'prompt' is empty"),
        ("outcomes.csv", b"prompt,model,correct,latency_ms\nq,a,1,-5\n", "'latency_ms' is '-5'"),
        ("outcomes.xlsx", b"PK", "are read from .csv, .tsv, .jsonl or .ndjson"),
    ],
)
def test_malformed_input_is_one_line_naming_the_file_and_line(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(InputError, match=message) as raised:
        read_long_outcomes(path)
    assert "\n" not in str(raised.value) and name in str(raised.value)


def test_a_pickle_contamination_list_is_refused(tmp_path):
    path = tmp_path / "contaminated.jsonl"
    path.write_bytes(pickle.dumps({"eval_prompt": "x"}))
    with pytest.raises(InputError, match="holds a pickle"):
        read_contaminated([path])


# ---------------------------------------------------------------------------------------------
# A per-sample log: outcomes keyed by id, the prompts in a file of their own


def per_sample_log(folder: Path) -> tuple[Path, Path]:
    """(outcomes.csv, questions.jsonl) as MMLU-Pro publishes them: two ids share one prompt, ids are numbers
    in the JSON lines and text in the CSV, one question has no outcome, and q3 lacks model b."""
    questions = write_jsonl(
        folder / "questions.jsonl",
        [
            {"question_id": 1, "category": "law", "prompt": "Is it legal?", "answer": "A"},
            {"question_id": 2, "category": "law", "prompt": "Is it legal?", "answer": "B"},
            {"question_id": 3, "category": "math", "prompt": "What is 2+2?", "answer": "C"},
            {"question_id": 4, "category": "math", "prompt": "Never asked.", "answer": "D"},
        ],
    )
    outcomes = write_csv(
        folder / "outcomes.csv",
        ["question_id", "model", "pred", "correct", "cost_usd"],
        [
            [2, "a", "B", 1, 0.002],
            [1, "a", "A", 1, 0.001],
            [1, "b", "C", 0, 0.01],
            [2, "b", "", 0, 0.02],
            [3, "a", "C", 1, 0.003],
        ],
    )
    return outcomes, questions


def test_outcomes_join_their_prompts_by_id_and_repeated_prompts_stay_two_tasks(tmp_path):
    outcomes_path, questions_path = per_sample_log(tmp_path)
    prompts = read_prompts(questions_path, LongColumns(id="question_id"))
    assert prompts.ids == ["1", "2", "3", "4"] and prompts.groups == ["law", "law", "math", "math"]
    with pytest.raises(InputError, match=r"outcomes.csv: id '3' \(questions.jsonl line 3\) has no row for model 'b'"):
        read_long_outcomes(outcomes_path, prompts=prompts)
    outcomes = read_long_outcomes(outcomes_path, prompts=prompts, drop_incomplete=True)
    # Tasks in the prompts file's order, agents in the order they first appear; the cells where they belong.
    assert outcomes.task_ids == ["1", "2"] and outcomes.prompts == ["Is it legal?", "Is it legal?"]
    assert outcomes.groups == ["law", "law"] and outcomes.agents == ["a", "b"]
    assert outcomes.rewards.tolist() == [[1.0, 0.0], [1.0, 0.0]]
    assert outcomes.cost_usd.tolist() == [[0.001, 0.01], [0.002, 0.02]]
    assert outcomes.sources == ["questions.jsonl:1", "questions.jsonl:2"] and outcomes.dropped_incomplete == 1
    assert any("1 prompts of questions.jsonl have no outcome rows" in note for note in outcomes.notes)


@pytest.mark.parametrize(
    ("prompts_rows", "outcome_rows", "message"),
    [
        (  # an outcome whose id has no prompt
            [{"question_id": 1, "prompt": "p"}],
            [[1, "a", 1], [9, "a", 0]],
            r"outcomes.csv line 3 has id '9', which the prompts file .*prompts.jsonl does not have",
        ),
        (  # an id twice in the prompts file
            [{"question_id": 1, "prompt": "p"}, {"question_id": 1, "prompt": "q"}],
            [[1, "a", 1]],
            r"prompts.jsonl line 2 repeats id '1' \(first at line 1\); each id needs one prompt",
        ),
        (  # a prompts file without the id column
            [{"id_of_question": 1, "prompt": "p"}],
            [[1, "a", 1]],
            r"prompts.jsonl has no column 'question_id' for the task id; it has 'id_of_question', 'prompt'",
        ),
        (  # a (task, model) pair twice
            [{"question_id": 1, "prompt": "p"}],
            [[1, "a", 1], [1, "a", 0]],
            r"outcomes.csv line 3 repeats id '1' for model 'a' \(first at line 2\)",
        ),
    ],
)
def test_join_errors_are_one_line_naming_the_id_and_the_line(tmp_path, prompts_rows, outcome_rows, message):
    prompts_path = write_jsonl(tmp_path / "prompts.jsonl", prompts_rows)
    outcomes_path = write_csv(tmp_path / "outcomes.csv", ["question_id", "model", "correct"], outcome_rows)
    with pytest.raises(InputError, match=message) as raised:
        read_long_outcomes(outcomes_path, prompts=read_prompts(prompts_path, LongColumns(id="question_id")))
    assert "\n" not in str(raised.value)


def test_an_outcomes_file_without_the_id_column_names_it(tmp_path):
    prompts = read_prompts(write_jsonl(tmp_path / "prompts.jsonl", [{"task_id": "t1", "prompt": "p"}]))
    assert prompts.id_column == "task_id"  # found among the usual id columns
    outcomes_path = write_csv(tmp_path / "outcomes.csv", ["id", "model", "correct"], [["t1", "a", 1]])
    with pytest.raises(InputError, match=r"outcomes.csv has no column 'task_id', the id of the prompts file"):
        read_long_outcomes(outcomes_path, prompts=prompts)


def test_a_contaminated_prompt_drops_its_outcomes_by_id(tmp_path):
    outcomes_path, questions_path = per_sample_log(tmp_path)
    listing = write_jsonl(tmp_path / "contaminated.jsonl", [{"eval_prompt": "What is 2+2?"}])
    outcomes = read_long_outcomes(outcomes_path, contaminated=[listing], prompts=read_prompts(questions_path))
    assert outcomes.task_ids == ["1", "2"] and outcomes.dropped_contaminated == 1 and outcomes.dropped_incomplete == 0
