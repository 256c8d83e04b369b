"""importing/routellm.py: RouteLLM's response CSVs (a slice of the real files) read into Outcomes.

Expected values are read from the files here with the csv/json modules, independently of the package."""

from __future__ import annotations

import numpy as np
import pytest
from test_importing_long import csv_rows, eval_prompts, write_csv

from benchgen_router.errors import InputError
from benchgen_router.importing import read_routellm_csvs
from helpers import SHARED

ROUTELLM = SHARED / "routellm-evals"
MMLU = ROUTELLM / "mmlu"
GSM8K = ROUTELLM / "gsm8k"
SLICE = [MMLU / "responses" / "mmlu_machine_learning.csv", MMLU / "responses" / "mmlu_college_chemistry.csv"]
STRONG, WEAK = "gpt-4-1106-preview", "mistralai/Mixtral-8x7B-Instruct-v0.1"
needs_routellm = pytest.mark.skipif(
    not (MMLU / "responses").is_dir(), reason=f"RouteLLM's evaluation data not found at {ROUTELLM} (CI has it)"
)


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
