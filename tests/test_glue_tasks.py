"""src/tasks/glue_tasks.py: the table holds GLUE as the field reports it, GLUE's spellings of task names,
and the submission files as the GLUE server wants them."""
import csv

import numpy as np
import pytest

from errors import UserError
from tasks.glue_data import read_split
from tasks.glue_tasks import TASKS, glue_task, write_submission
from test_glue_data import ROWS, one_line_sentences, split_rows, write_tsv_split


@pytest.fixture(scope="module")
def sentences(rotten_tomatoes) -> list[str]:
    return one_line_sentences(rotten_tomatoes)


def test_the_table_holds_glue_as_issue_27_lists_it():
    assert list(TASKS) == ["cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli", "ax"]
    assert TASKS["cola"].label_names == ("unacceptable", "acceptable")
    assert TASKS["mrpc"].label_names == ("not_equivalent", "equivalent")
    assert TASKS["qqp"].label_names == ("not_duplicate", "duplicate")
    assert TASKS["mnli"].label_names == TASKS["ax"].label_names == ("entailment", "neutral", "contradiction")
    assert TASKS["qnli"].label_names == TASKS["rte"].label_names == ("entailment", "not_entailment")
    assert TASKS["wnli"].label_names == ("not_entailment", "entailment")  # reversed
    assert TASKS["stsb"].is_regression and TASKS["stsb"].num_labels == 1 and TASKS["mnli"].num_labels == 3
    assert TASKS["mnli"].dev_splits == ("validation_matched", "validation_mismatched")
    assert {task.metrics for task in TASKS.values()} == {
        ("matthews",), ("accuracy",), ("f1", "accuracy"), ("pearson", "spearman"), ()}
    assert sorted(file for task in TASKS.values() for file in task.submission_files.values()) == sorted(
        ["CoLA.tsv", "SST-2.tsv", "MRPC.tsv", "STS-B.tsv", "QQP.tsv", "MNLI-m.tsv", "MNLI-mm.tsv", "QNLI.tsv",
         "RTE.tsv", "WNLI.tsv", "AX.tsv"])
    assert {task.name for task in TASKS.values() if task.server_wants_names} == {"mnli", "ax", "qnli", "rte"}


def test_task_names_as_glue_spells_them_and_a_did_you_mean():
    assert glue_task("SST-2") is TASKS["sst2"] and glue_task("STS-B") is TASKS["stsb"]
    with pytest.raises(UserError, match="unknown GLUE task 'mrcp'; did you mean mrpc"):
        glue_task("mrcp")


@pytest.mark.parametrize("task_name, split", [(name, split) for name, task in TASKS.items()
                                              for split in task.submission_files])
def test_submission_files_as_the_glue_server_wants_them(tmp_path, sentences, task_name, split):
    task = TASKS[task_name]
    rows = split_rows(task, split, sentences) | {"index": np.arange(ROWS) + 100}
    write_tsv_split(tmp_path, task, split, rows)
    examples = read_split(tmp_path, task_name, split)
    predictions = (np.arange(ROWS) % 11 * 0.5 if task.is_regression else np.arange(ROWS) % task.num_labels)
    path = write_submission(tmp_path, task, split, predictions, examples.index)
    assert path.name == task.submission_files[split]
    with path.open(newline="", encoding="utf-8") as file:
        lines = list(csv.reader(file, delimiter="\t"))
    assert lines[0] == ["index", "prediction"] and [int(i) for i, _ in lines[1:]] == list(range(100, 100 + ROWS))
    shown = [prediction for _, prediction in lines[1:]]
    if task.is_regression:
        assert shown[:3] == ["0.000", "0.500", "1.000"]
    elif task.server_wants_names:
        assert shown[:3] == [task.label_names[i % task.num_labels] for i in range(3)]
    else:
        assert shown[:3] == ["0", "1", "0"]
