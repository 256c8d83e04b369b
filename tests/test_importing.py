"""importing.py: RouteLLM's response CSVs (a slice of the real files) and the long format (NVIDIA's toolkit
CSV, LLMRouter's routing JSONL) read into Outcomes, and written in the formats train reads.

Expected values are read from the files here with the csv/json modules, independently of the package."""

from __future__ import annotations

import csv
import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from benchgen_router.costs import load_cost_data, load_pool
from benchgen_router.data import join_rewards, load_rows
from benchgen_router.errors import InputError
from benchgen_router.importing import (
    LongColumns,
    read_contaminated,
    read_long_outcomes,
    read_routellm_csvs,
    with_call_costs,
    with_prices,
    write_outcomes,
)
from helpers import SHARED

ROUTELLM = SHARED / "routellm-evals"
MMLU = ROUTELLM / "mmlu"
GSM8K = ROUTELLM / "gsm8k"
SLICE = [MMLU / "responses" / "mmlu_machine_learning.csv", MMLU / "responses" / "mmlu_college_chemistry.csv"]
STRONG, WEAK = "gpt-4-1106-preview", "mistralai/Mixtral-8x7B-Instruct-v0.1"
needs_routellm = pytest.mark.skipif(
    not (MMLU / "responses").is_dir(), reason=f"RouteLLM's evaluation data not found at {ROUTELLM} (CI has it)"
)


def csv_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def eval_prompts(path: Path) -> set[str]:
    return {json.loads(line)["eval_prompt"] for line in path.read_text(encoding="utf-8").splitlines() if line}


def write_csv(path: Path, header: list[str], rows: list[list[object]]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# ---------------------------------------------------------------------------------------------
# RouteLLM's response CSVs, on a slice of the real files


@needs_routellm
def test_routellm_slice_is_read_row_for_row_with_the_contaminated_prompts_dropped():
    contaminated = eval_prompts(MMLU / "contaminated_prompts.jsonl")
    outcomes = read_routellm_csvs(SLICE, [MMLU / "contaminated_prompts.jsonl"])
    expected_ids, expected_rewards, dropped = [], [], 0
    for path in SLICE:
        for index, row in enumerate(csv_rows(path), start=1):
            if row["prompt"] in contaminated:
                dropped += 1
                continue
            expected_ids.append(f"{path.stem}:{index}")
            expected_rewards.append([row[WEAK] == "True", row[STRONG] == "True"])
    assert dropped >= 1  # the slice holds contaminated prompts, so the drop is exercised
    assert outcomes.dropped_contaminated == dropped
    assert outcomes.agents == [WEAK, STRONG]  # the files' column order
    assert outcomes.task_ids == expected_ids
    np.testing.assert_array_equal(outcomes.rewards, np.asarray(expected_rewards, dtype=float))
    assert not set(outcomes.prompts) & contaminated
    assert outcomes.groups == [task_id.split(":")[0] for task_id in expected_ids]
    assert outcomes.responses is None and np.isnan(outcomes.cost_usd).all()


@needs_routellm
def test_routellm_task_ids_do_not_move_when_the_contamination_list_changes():
    plain = read_routellm_csvs(SLICE)
    cleaned = read_routellm_csvs(SLICE, [MMLU / "contaminated_prompts.jsonl"])
    assert len(plain) == len(cleaned) + cleaned.dropped_contaminated and plain.dropped_contaminated == 0
    positions = {task_id: i for i, task_id in enumerate(plain.task_ids)}
    for i, task_id in enumerate(cleaned.task_ids):
        assert plain.prompts[positions[task_id]] == cleaned.prompts[i]
    assert read_routellm_csvs(SLICE).task_ids == plain.task_ids  # deterministic


@needs_routellm
def test_routellm_gsm8k_keeps_each_models_response_and_a_chosen_model_order():
    outcomes = read_routellm_csvs([GSM8K / "gsm8k_responses.csv"], models=[STRONG, WEAK])
    rows = csv_rows(GSM8K / "gsm8k_responses.csv")
    assert outcomes.agents == [STRONG, WEAK] and len(outcomes) == len(rows)
    assert outcomes.responses is not None
    assert outcomes.responses[7] == [rows[7][STRONG + "_response"], rows[7][WEAK + "_response"]]
    np.testing.assert_array_equal(outcomes.rewards[:, 0], [row[STRONG] == "True" for row in rows])


@needs_routellm
def test_a_routellm_file_without_a_chosen_model_is_named(tmp_path):
    with pytest.raises(InputError, match=r"mmlu_machine_learning.csv has no column 'gpt-5'"):
        read_routellm_csvs(SLICE, models=["gpt-5"])


def test_routellm_values_other_than_true_false_name_the_line(tmp_path):
    path = write_csv(tmp_path / "subject.csv", ["prompt", "a", "b"], [["q1", "True", "False"], ["q2", "maybe", "True"]])
    with pytest.raises(InputError, match=r"subject.csv line 3: 'a' is 'maybe'; it must be True/False"):
        read_routellm_csvs([path])


def test_a_folder_of_routellm_files_is_read_in_name_order_with_stems_as_groups(tmp_path):
    write_csv(tmp_path / "b_subject.csv", ["prompt", "m1", "m2"], [["q3", "True", "True"]])
    write_csv(tmp_path / "a_subject.csv", ["prompt", "m1", "m2", "m1_response"], [["q1", "False", "True", "x"]])
    outcomes = read_routellm_csvs([tmp_path])
    assert outcomes.task_ids == ["a_subject:1", "b_subject:1"] and outcomes.groups == ["a_subject", "b_subject"]
    assert outcomes.rewards.tolist() == [[0.0, 1.0], [1.0, 1.0]]
    assert outcomes.responses == [["x", None], [None, None]]


# ---------------------------------------------------------------------------------------------
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
# Writing: what train and evaluate read


def test_written_files_are_read_back_by_the_training_readers(tmp_path):
    rows = llmrouter_rows()
    for row in rows:
        row["cost_usd"] = 0.001 * row["output_tokens"]
    outcomes = read_long_outcomes(write_jsonl(tmp_path / "routing.jsonl", rows), dataset="demo")
    written = write_outcomes(outcomes, tmp_path / "out")
    assert [path.name for path in written.paths] == ["tasks.jsonl", "rewards.jsonl", "calls.jsonl"]
    data = join_rewards(
        load_rows(str(tmp_path / "out" / "rewards.jsonl"), "rewards"),
        load_rows(str(tmp_path / "out" / "tasks.jsonl"), "tasks"),
        min_rows=1,
    )
    assert data.task_ids == outcomes.task_ids and data.prompts == outcomes.prompts
    np.testing.assert_array_equal(data.rewards, outcomes.rewards)
    costs = load_cost_data(tmp_path / "out" / "calls.jsonl", tmp_path / "out" / "rewards.jsonl")
    np.testing.assert_allclose(costs.cost_usd, [[0.010, 0.011], [0.010, 0.011]])
    np.testing.assert_allclose(costs.latency_s, [[1.5, 2.5], [1.5, 2.5]])
    rewards = read_jsonl(tmp_path / "out" / "rewards.jsonl")
    assert [row["task_group"] for row in rewards] == ["gsm8k", "mmlu"] and rewards[0]["dataset"] == "demo"
    assert rewards[0]["best_agents"] == ["llama3-70b-instruct"] and rewards[0]["repetitions"] == 1
    assert written.cost_unit == "usd" and not any("cost counts calls" in note for note in written.notes)


def test_without_costs_or_a_pool_each_call_costs_one(tmp_path):
    path = write_csv(tmp_path / "plain.csv", ["prompt", "model", "correct"], [["q", "a", 1], ["q", "b", 0]])
    written = write_outcomes(read_long_outcomes(path), tmp_path / "out")
    calls = read_jsonl(tmp_path / "out" / "calls.jsonl")[0]["calls"]
    assert [call["cost_usd"] for call in calls] == [1.0, 1.0] and written.cost_unit == "calls"
    assert [call["latency_ms"] for call in calls] == [0.0, 0.0]
    assert any("cost counts calls" in note for note in written.notes)
    assert any("latency_ms is written as 0" in note for note in written.notes)


def test_a_pool_without_tokens_to_price_is_refused(tmp_path):
    outcomes = read_long_outcomes(
        write_csv(tmp_path / "plain.csv", ["prompt", "model", "correct"], [["q", "a", 1], ["q", "b", 0]])
    )
    prices = {"a": None, "b": None}
    with pytest.raises(InputError, match=r"model 'a' has no cost and no token counts to price"):
        with_prices(outcomes, prices)


def test_partly_known_costs_are_refused_before_anything_is_written(tmp_path):
    path = write_csv(
        tmp_path / "part.csv", ["prompt", "model", "correct", "cost"], [["q", "a", 1, 0.1], ["q", "b", 0, ""]]
    )
    out = tmp_path / "out"
    out.mkdir()
    (out / "rewards.jsonl").write_text("previous\n")
    with pytest.raises(InputError, match=r"model 'b' has no cost while other calls have one"):
        write_outcomes(read_long_outcomes(path), out)
    assert sorted(p.name for p in out.iterdir()) == ["rewards.jsonl"]
    assert (out / "rewards.jsonl").read_text() == "previous\n"


def test_fixed_costs_per_call_fill_unknown_costs_and_keep_known_ones(tmp_path):
    path = write_csv(
        tmp_path / "mixed.csv",
        ["prompt", "model", "correct", "cost"],
        [["q1", "weak", 1, ""], ["q1", "strong", 1, ""], ["q2", "weak", 0, 0.5], ["q2", "strong", 1, ""]],
    )
    outcomes = with_call_costs(read_long_outcomes(path), {"strong": 1.0, "weak": 0.0}, unit="calls")
    assert outcomes.cost_usd.tolist() == [[0.0, 1.0], [0.5, 1.0]] and outcomes.cost_unit == "calls"
    with pytest.raises(InputError, match=r"call_cost must name every agent .*missing: \['strong'\]"):
        with_call_costs(read_long_outcomes(path), {"weak": 0.0})
    with pytest.raises(InputError, match=r"call_cost of 'weak' is -1"):
        with_call_costs(read_long_outcomes(path), {"weak": -1, "strong": 1.0})


def test_an_output_that_cannot_be_written_leaves_no_temporary_file(tmp_path):
    path = write_csv(tmp_path / "plain.csv", ["prompt", "model", "correct"], [["q", "a", 1], ["q", "b", 0]])
    out = tmp_path / "out"
    (out / "calls.jsonl").mkdir(parents=True)  # the third file's path is a folder
    with pytest.raises(InputError, match=r"output .*calls.jsonl is a folder"):
        write_outcomes(read_long_outcomes(path), out)
    assert [p.name for p in out.iterdir()] == ["calls.jsonl"]
