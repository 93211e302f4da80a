"""The GLUE benchmark's tasks in one table: where each split lives in either layout on disk, what
the labels mean, how a task is scored (glue_metrics.py) and the GLUE server's submission files.
glue_data.py reads the splits."""
import difflib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from architecture import GLUE_LABELS
from atomic import atomic_write
from errors import UserError

STANDARD_SPLITS = {"train": "train.tsv", "validation": "dev.tsv", "test": "test.tsv"}
SPLIT_ALIASES = ("val", "dev")  # this program's and GLUE's name for a task's (first) dev split


@dataclass(frozen=True)
class GlueTask:
    """One GLUE task: where its data lives in each layout, what its labels mean, how it is scored
    and submitted. Split names are Hugging Face's (`validation_matched`)."""
    name: str  # the task type, and the folder of nyu-mll/glue's parquet files
    tsv_folder: str  # the folder in the GLUE distribution (glue_data/MRPC)
    text_columns: tuple[str, ...]  # parquet: one column, or two for a sentence pair
    tsv_text_columns: tuple[str, ...]  # the TSV header's names for the same texts
    tsv_label_column: str | None  # None where no split has labels (ax)
    label_names: tuple[str, ...]  # class i means label_names[i]; empty for STS-B (regression)
    metrics: tuple[str, ...]  # GLUE's metrics for the task; best.pt goes by their mean (task_score)
    headline_metric: str | None  # the one metric the BERT paper's table (and Cramming's) shows
    tsv_files: dict[str, str]  # split -> file in tsv_folder
    dev_results: dict[str, str]  # dev split -> name of its result ("mnli_matched")
    submission_files: dict[str, str]  # test split -> the file the GLUE server expects
    server_wants_names: bool  # the server takes "entailment" for MNLI, AX, QNLI, RTE; numbers elsewhere
    tsv_index_column: str = "index"
    tsv_headerless: dict[str, int] = field(default_factory=dict)  # CoLA's train/dev: column -> position
    allows_empty_text: bool = False  # QQP's train split holds two empty question2 (HF datasets #277)
    skips_broken_tsv_rows: bool = False  # QQP's train.tsv has rows cut in two by a newline in a question
    multi_label: bool = False  # classify(_pair)'s own files: any number of the classes an example

    @property
    def is_regression(self) -> bool:
        return not self.label_names

    @property
    def num_labels(self) -> int:
        """Outputs of the model's head: one score for STS-B, one logit per class otherwise."""
        return 1 if self.is_regression else len(self.label_names)

    @property
    def is_pair(self) -> bool:
        return len(self.text_columns) == 2

    @property
    def dev_splits(self) -> tuple[str, ...]:
        return tuple(self.dev_results)

    @property
    def test_splits(self) -> tuple[str, ...]:
        return tuple(self.submission_files)


def _task(name, tsv_folder, text_columns, tsv_text_columns, tsv_label_column, label_names, metrics,
          headline_metric, server_wants_names, **options) -> GlueTask:
    """A task with the usual train/validation/test splits unless options say otherwise."""
    submission = options.pop("submission_file", None)
    options.setdefault("tsv_files", STANDARD_SPLITS)
    options.setdefault("dev_results", {"validation": name})
    options.setdefault("submission_files", {"test": submission})
    return GlueTask(name, tsv_folder, text_columns, tsv_text_columns, tsv_label_column, label_names, metrics,
                    headline_metric, server_wants_names=server_wants_names, **options)


MNLI_SPLITS = {"train": "train.tsv", "validation_matched": "dev_matched.tsv",
               "validation_mismatched": "dev_mismatched.tsv", "test_matched": "test_matched.tsv",
               "test_mismatched": "test_mismatched.tsv"}
PAIR = ("sentence1", "sentence2")

# name, TSV folder, parquet text columns, TSV text columns, TSV label column, label names, metrics,
# headline metric, whether the server wants label names; then what differs from the usual
TASKS = {task.name: task for task in (
    _task("cola", "CoLA", ("sentence",), ("sentence",), "label", GLUE_LABELS["cola"],
          ("matthews",), "matthews", False, submission_file="CoLA.tsv",
          tsv_headerless={"label": 1, "sentence": 3}),  # source, label, original mark, sentence
    _task("sst2", "SST-2", ("sentence",), ("sentence",), "label", GLUE_LABELS["sst2"],
          ("accuracy",), "accuracy", False, submission_file="SST-2.tsv"),
    _task("mrpc", "MRPC", PAIR, ("#1 String", "#2 String"), "Quality", GLUE_LABELS["mrpc"],
          ("f1", "accuracy"), "f1", False, submission_file="MRPC.tsv"),
    _task("qqp", "QQP", ("question1", "question2"), ("question1", "question2"), "is_duplicate",
          GLUE_LABELS["qqp"], ("f1", "accuracy"), "f1", False, submission_file="QQP.tsv",
          tsv_index_column="id", allows_empty_text=True, skips_broken_tsv_rows=True),
    _task("stsb", "STS-B", PAIR, PAIR, "score", GLUE_LABELS["stsb"], ("pearson", "spearman"), "spearman", False,
          submission_file="STS-B.tsv"),
    _task("mnli", "MNLI", ("premise", "hypothesis"), PAIR, "gold_label", GLUE_LABELS["mnli"], ("accuracy",),
          "accuracy", True,
          tsv_files=MNLI_SPLITS,
          dev_results={"validation_matched": "mnli_matched", "validation_mismatched": "mnli_mismatched"},
          submission_files={"test_matched": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv"}),
    _task("qnli", "QNLI", ("question", "sentence"), ("question", "sentence"), "label", GLUE_LABELS["qnli"],
          ("accuracy",), "accuracy", True, submission_file="QNLI.tsv"),
    _task("rte", "RTE", PAIR, PAIR, "label", GLUE_LABELS["rte"], ("accuracy",), "accuracy", True,
          submission_file="RTE.tsv"),
    _task("wnli", "WNLI", PAIR, PAIR, "label", GLUE_LABELS["wnli"], ("accuracy",), "accuracy", False,
          submission_file="WNLI.tsv"),
    # The diagnostic set: test only, predicted by an MNLI model, scored by the server alone.
    _task("ax", "diagnostic", ("premise", "hypothesis"), PAIR, None, GLUE_LABELS["mnli"], (), None, True,
          tsv_files={"test": "diagnostic.tsv"}, dev_results={}, submission_files={"test": "AX.tsv"}),
)}


def glue_task(name: str) -> GlueTask:
    """The task called `name`; GLUE's spellings (SST-2, STS-B) work too."""
    key = name.strip().lower().replace("-", "")
    if key in TASKS:
        return TASKS[key]
    close = difflib.get_close_matches(key, TASKS, n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    raise UserError(f"unknown GLUE task {name!r}{hint} (tasks: {', '.join(TASKS)})")


def task_split(task: GlueTask, split: str) -> str:
    """The split's Hugging Face name; `val` and `dev` mean the task's first dev split."""
    if split in SPLIT_ALIASES and task.dev_splits:
        return task.dev_splits[0]
    if split not in task.tsv_files:
        raise UserError(f"{task.name} has no split {split!r}; its splits: {', '.join(task.tsv_files)}")
    return split


def is_test_split(split: str) -> bool:
    return split.startswith("test")


# ----------------------------------------------------------------------------- submission files

def submission_lines(task: GlueTask, predictions: np.ndarray, index: np.ndarray) -> list[str]:
    """The GLUE server's file: `index<TAB>prediction`, the prediction a label name for MNLI, AX,
    QNLI and RTE, a class number for CoLA, SST-2, MRPC, QQP and WNLI, a score for STS-B; for a
    multi-label model, the names of the classes predicted, between commas (none: empty)."""
    if len(predictions) != len(index):
        raise ValueError(f"{len(predictions)} predictions for {len(index)} examples")
    if task.is_regression:
        shown = [f"{float(score):.3f}" for score in predictions]
    elif task.multi_label:
        shown = [",".join(name for name, chosen in zip(task.label_names, row) if chosen) for row in predictions]
    elif task.server_wants_names:
        shown = [task.label_names[int(label)] for label in predictions]
    else:
        shown = [str(int(label)) for label in predictions]
    return ["index\tprediction"] + [f"{int(i)}\t{p}" for i, p in zip(index, shown)]


def write_submission(directory: Path, task: GlueTask, split: str, predictions: np.ndarray,
                     index: np.ndarray) -> Path:
    """Write the server's file for a test split (MNLI's test_matched: MNLI-m.tsv) into directory."""
    path = Path(directory) / task.submission_files[task_split(task, split)]
    text = "\n".join(submission_lines(task, predictions, index)) + "\n"
    atomic_write(path, lambda temp: temp.write_text(text, encoding="utf-8"))
    return path
