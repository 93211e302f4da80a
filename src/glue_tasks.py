"""The GLUE benchmark as the field reports it: one table of its tasks, readers for both layouts on
disk (Hugging Face parquet, the GLUE distribution's TSV), sentence-pair encoding, its metrics and
averages, and the GLUE server's submission files.
"""
import csv
import difflib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from atomic import atomic_write
from batching import gather_padded
from errors import UserError

HIDDEN_LABEL = -1  # what test splits hold where the label is kept back (HF parquet, and ours in memory)
HIDDEN_SCORE = float("nan")  # STS-B's hidden label in memory: -1 would pass for a (bad) score
SIMILARITY_RANGE = (0.0, 5.0)  # STS-B's scores
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


ENTAILMENT = ("entailment", "not_entailment")
NLI = ("entailment", "neutral", "contradiction")
MNLI_SPLITS = {"train": "train.tsv", "validation_matched": "dev_matched.tsv",
               "validation_mismatched": "dev_mismatched.tsv", "test_matched": "test_matched.tsv",
               "test_mismatched": "test_mismatched.tsv"}
PAIR = ("sentence1", "sentence2")

# name, TSV folder, parquet text columns, TSV text columns, TSV label column, label names, metrics,
# headline metric, whether the server wants label names; then what differs from the usual
TASKS = {task.name: task for task in (
    _task("cola", "CoLA", ("sentence",), ("sentence",), "label", ("unacceptable", "acceptable"),
          ("matthews",), "matthews", False, submission_file="CoLA.tsv",
          tsv_headerless={"label": 1, "sentence": 3}),  # source, label, original mark, sentence
    _task("sst2", "SST-2", ("sentence",), ("sentence",), "label", ("negative", "positive"),
          ("accuracy",), "accuracy", False, submission_file="SST-2.tsv"),
    _task("mrpc", "MRPC", PAIR, ("#1 String", "#2 String"), "Quality", ("not_equivalent", "equivalent"),
          ("f1", "accuracy"), "f1", False, submission_file="MRPC.tsv"),
    _task("qqp", "QQP", ("question1", "question2"), ("question1", "question2"), "is_duplicate",
          ("not_duplicate", "duplicate"), ("f1", "accuracy"), "f1", False, submission_file="QQP.tsv",
          tsv_index_column="id", allows_empty_text=True, skips_broken_tsv_rows=True),
    _task("stsb", "STS-B", PAIR, PAIR, "score", (), ("pearson", "spearman"), "spearman", False,
          submission_file="STS-B.tsv"),
    _task("mnli", "MNLI", ("premise", "hypothesis"), PAIR, "gold_label", NLI, ("accuracy",), "accuracy", True,
          tsv_files=MNLI_SPLITS,
          dev_results={"validation_matched": "mnli_matched", "validation_mismatched": "mnli_mismatched"},
          submission_files={"test_matched": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv"}),
    _task("qnli", "QNLI", ("question", "sentence"), ("question", "sentence"), "label", ENTAILMENT,
          ("accuracy",), "accuracy", True, submission_file="QNLI.tsv"),
    _task("rte", "RTE", PAIR, PAIR, "label", ENTAILMENT, ("accuracy",), "accuracy", True,
          submission_file="RTE.tsv"),
    _task("wnli", "WNLI", PAIR, PAIR, "label", ENTAILMENT[::-1], ("accuracy",), "accuracy", False,
          submission_file="WNLI.tsv"),  # WNLI's 1 is entailment, the reverse of QNLI and RTE
    # The diagnostic set: test only, predicted by an MNLI model, scored by the server alone.
    _task("ax", "diagnostic", ("premise", "hypothesis"), PAIR, None, NLI, (), None, True,
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


# ----------------------------------------------------------------------------- finding the files

def parquet_shards(folder: Path, split: str) -> list[Path]:
    """`split-0000N-of-0000M.parquet` in folder, in order; an incomplete set is an error."""
    pattern = re.compile(rf"{re.escape(split)}-(\d+)-of-(\d+)\.parquet")
    shards = {}
    for path in folder.glob(f"{split}-*-of-*.parquet"):
        match = pattern.fullmatch(path.name)
        if match:
            shards[(int(match[1]), int(match[2]))] = path
    if not shards:
        return []
    total = max(count for _, count in shards)
    expected = [(number, total) for number in range(total)]
    for number, count in expected:
        if (number, count) not in shards:
            raise UserError(f"{folder}: {split}-{number:05d}-of-{count:05d}.parquet is missing "
                            f"({len(shards)} of the split's {total} files are there)")
    return [shards[key] for key in expected]


def find_split_files(directory: Path, task: GlueTask, split: str) -> list[Path]:
    """The files of a task's split under `directory`: nyu-mll/glue's parquet (`sst2/`), the GLUE
    distribution's TSV (`SST-2/`), or either directly in `directory` (the SST-2/CoLA layouts this
    program read before). Parquet wins where both are there."""
    split = task_split(task, split)
    directory = Path(directory)
    tsv_name = task.tsv_files[split]
    for folder in (directory / task.name, directory):
        shards = parquet_shards(folder, split) if folder.is_dir() else []
        if shards:
            return shards
    for folder in (directory / task.tsv_folder, directory):
        if (folder / tsv_name).is_file():
            return [folder / tsv_name]
    raise UserError(f"{directory}: no {task.name} {split} split: expected {task.name}/{split}-00000-of-00001.parquet "
                    f"(Hugging Face) or {task.tsv_folder}/{tsv_name} (GLUE TSV)")


# ----------------------------------------------------------------------------- reading

@dataclass
class Examples:
    """A split in memory: texts, labels and the data set's own index (for submission files)."""
    first: list[str]
    second: list[str] | None  # None for single-sentence tasks
    labels: np.ndarray  # int64 class ids (HIDDEN_LABEL where hidden), float32 scores for STS-B (NaN)
    index: np.ndarray  # int64
    files: tuple[Path, ...] = ()
    skipped_lines: tuple[int, ...] = ()  # broken TSV rows left out (QQP), by line number

    def __len__(self) -> int:
        return len(self.first)

    @property
    def labels_hidden(self) -> bool:
        """Whether no label is known (a test split): then there are predictions to submit, no score."""
        return bool(np.all(np.isnan(self.labels) if self.labels.dtype.kind == "f" else self.labels == HIDDEN_LABEL))

    def select(self, rows: np.ndarray) -> "Examples":
        pick = lambda texts: None if texts is None else [texts[row] for row in rows]  # noqa: E731
        return Examples(pick(self.first), pick(self.second), self.labels[rows], self.index[rows], self.files,
                        self.skipped_lines)


class Column(NamedTuple):
    name: str  # as the file calls it, for error messages
    values: list


Place = Callable[[int], str]  # row number from 0 -> "row 3" (parquet) or "line 4" (TSV)


def read_split(directory: Path, task: "GlueTask | str", split: str) -> Examples:
    """A task's split found under `directory` (see find_split_files), checked: any bad value is a
    one-line UserError naming the file, row or line, and column."""
    task = glue_task(task) if isinstance(task, str) else task
    split = task_split(task, split)
    files = find_split_files(directory, task, split)
    reader = read_parquet_examples if files[0].suffix == ".parquet" else read_tsv_examples
    parts = [reader(path, task, split) for path in files]
    return concatenated(parts, tuple(files))


def concatenated(parts: list[Examples], files: tuple[Path, ...]) -> Examples:
    if len(parts) == 1:
        return parts[0]
    second = None if parts[0].second is None else [text for part in parts for text in part.second]
    return Examples([text for part in parts for text in part.first], second,
                    np.concatenate([part.labels for part in parts]), np.concatenate([part.index for part in parts]),
                    files)


def read_parquet_examples(path: Path, task: GlueTask, split: str) -> Examples:
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as error:
        raise UserError(f"{path}: not a readable parquet file ({error.__class__.__name__})") from None
    required = task.text_columns + (() if is_test_split(split) or task.tsv_label_column is None else ("label",))
    for name in required:
        if name not in table.column_names:
            raise UserError(f"{path}: missing column {name} (columns: {', '.join(table.column_names)})")
    column = lambda name: Column(name, table.column(name).to_pylist()) if name in table.column_names else None  # noqa: E731
    return checked_examples(path, task, split, lambda row: f"row {row + 1}", table.num_rows,
                            [column(name) for name in task.text_columns], column("label"), column("idx"))


def read_tsv_rows(path: Path) -> list[list[str]]:
    """Tab-separated fields, quotes taken as text: GLUE's files are not quoted, and a question that
    starts with `"` (QQP, MNLI) must not swallow the tabs and lines up to the next quote."""
    try:  # utf-8-sig: MRPC's files start with a byte-order mark, which would hide `Quality`
        with path.open(encoding="utf-8-sig", newline="") as file:
            return list(csv.reader(file, delimiter="\t", quoting=csv.QUOTE_NONE))
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{path}: cannot read ({error})") from None


def tsv_layout(path: Path, task: GlueTask, header: list[str]) -> tuple[dict[str, int], bool]:
    """Column name -> position, read from the header; and whether the first line is a header.
    CoLA's train and dev files have no header: their columns go by position."""
    positions = {name.strip().lower(): position for position, name in enumerate(header)}
    if all(name.lower() in positions for name in task.tsv_text_columns):
        wanted = (*task.tsv_text_columns, task.tsv_label_column, task.tsv_index_column)
        return {name: positions[name.lower()] for name in wanted if name and name.lower() in positions}, True
    if task.tsv_headerless and len(header) == max(task.tsv_headerless.values()) + 1:
        return dict(task.tsv_headerless), False
    missing = next(name for name in task.tsv_text_columns if name.lower() not in positions)
    raise UserError(f"{path}: line 1: missing column {missing} (header: {', '.join(header)})")


def read_tsv_examples(path: Path, task: GlueTask, split: str) -> Examples:
    rows = read_tsv_rows(path)
    if not rows:
        raise UserError(f"{path}: empty file")
    columns, has_header = tsv_layout(path, task, rows[0])
    label = task.tsv_label_column if task.tsv_label_column in columns else None
    if label is None and task.tsv_label_column and not is_test_split(split):
        raise UserError(f"{path}: line 1: missing column {task.tsv_label_column} (header: {', '.join(rows[0])})")
    first_line = 2 if has_header else 1
    body, lines, skipped = complete_rows(path, task, rows[first_line - 1:], columns, first_line)
    column = lambda name: Column(name, [fields[columns[name]] for fields in body]) if name in columns else None  # noqa: E731
    examples = checked_examples(path, task, split, lambda row: f"line {lines[row]}", len(body),
                                [column(name) for name in task.tsv_text_columns], column(label),
                                column(task.tsv_index_column))
    examples.skipped_lines = skipped
    return examples


def complete_rows(path: Path, task: GlueTask, rows: list[list[str]], columns: dict[str, int],
                  first_line: int) -> tuple[list[list[str]], list[int], tuple[int, ...]]:
    """The rows holding every column read, with their line numbers, and the lines left out: a
    short row is an error, except in QQP, whose rows cut in two by a newline in a question are
    left out as Hugging Face's loader leaves them out."""
    kept, lines, skipped = [], [], []
    for line, fields in enumerate(rows, start=first_line):
        short = [name for name, position in columns.items() if position >= len(fields)]
        if not short:
            kept.append(fields)
            lines.append(line)
        elif task.skips_broken_tsv_rows:
            skipped.append(line)
        else:
            raise UserError(f"{path}: line {line}, column {short[0]}: missing "
                            f"(the line has {len(fields)} tab-separated fields)")
    return kept, lines, tuple(skipped)


# ----------------------------------------------------------------------------- checking values

def checked_examples(path: Path, task: GlueTask, split: str, place: Place, count: int, texts: list[Column],
                     label: Column | None, index: Column | None) -> Examples:
    """Examples from a file's columns, each value checked; `label` or `index` None where the file
    has no such column (labels hidden, index by position)."""
    if count == 0:
        raise UserError(f"{path}: no examples")
    sentences = [checked_texts(path, column, place, task.allows_empty_text) for column in texts]
    if label is None:
        labels = np.full(count, HIDDEN_SCORE if task.is_regression else HIDDEN_LABEL,
                         np.float32 if task.is_regression else np.int64)
    elif task.is_regression:
        labels = checked_scores(path, label, place, is_test_split(split))
    else:
        labels = checked_classes(path, label, place, task.label_names, is_test_split(split))
    positions = np.arange(count, dtype=np.int64)
    return Examples(sentences[0], sentences[1] if task.is_pair else None, labels,
                    positions if index is None else checked_index(path, index, place), (path,))


def checked_texts(path: Path, column: Column, place: Place, allow_empty: bool) -> list[str]:
    for row, value in enumerate(column.values):
        if not isinstance(value, str):
            raise UserError(f"{path}: {place(row)}, column {column.name}: expected text, found {value!r}")
        if not allow_empty and not value.strip():
            raise UserError(f"{path}: {place(row)}, column {column.name}: empty sentence")
    return column.values


def checked_classes(path: Path, column: Column, place: Place, names: tuple[str, ...], may_hide: bool) -> np.ndarray:
    """Class ids from numbers (1, 1.0, "1") or the task's label names ("entailment")."""
    labels = np.empty(len(column.values), np.int64)
    expected = f"0 to {len(names) - 1} or {', '.join(names)}"
    for row, value in enumerate(column.values):
        label = names.index(value.strip()) if isinstance(value, str) and value.strip() in names else as_integer(value)
        if label == HIDDEN_LABEL and not may_hide:
            raise UserError(f"{path}: {place(row)}, column {column.name}: found {value!r}, a hidden label, "
                            f"outside a test split; expected {expected}")
        if label is None or not (0 <= label < len(names) or label == HIDDEN_LABEL):
            raise UserError(f"{path}: {place(row)}, column {column.name}: expected {expected}, found {value!r}")
        labels[row] = label
    return labels


def checked_scores(path: Path, column: Column, place: Place, may_hide: bool) -> np.ndarray:
    """STS-B's similarity scores, 0 to 5; a hidden one (-1, test splits only) becomes NaN."""
    low, high = SIMILARITY_RANGE
    scores = np.empty(len(column.values), np.float32)
    for row, value in enumerate(column.values):
        score = as_number(value)
        if score == HIDDEN_LABEL and may_hide:
            score = HIDDEN_SCORE
        elif score is None or not low <= score <= high:
            raise UserError(f"{path}: {place(row)}, column {column.name}: expected a similarity score "
                            f"from {low:g} to {high:g}, found {value!r}")
        scores[row] = score
    return scores


def checked_index(path: Path, column: Column, place: Place) -> np.ndarray:
    index = np.empty(len(column.values), np.int64)
    for row, value in enumerate(column.values):
        number = as_integer(value)
        if number is None:
            raise UserError(f"{path}: {place(row)}, column {column.name}: expected an integer, found {value!r}")
        index[row] = number
    return index


def as_integer(value) -> int | None:
    """An integer from an int, an integral float or a string of digits; None for anything else
    (text, 0.7, null, True)."""
    number = as_number(value)
    return int(number) if number is not None and number.is_integer() else None


def as_number(value) -> float | None:
    """A finite number from an int, a float or numeric text; None for anything else."""
    if isinstance(value, (bool, np.bool_)) or value is None:
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if not isinstance(value, (int, float, np.integer, np.floating)) or not math.isfinite(value):
        return None
    return float(value)


# ----------------------------------------------------------------------------- encoding

@dataclass
class EncodedExamples:
    """`[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]` per example, stored end to end (ragged)."""
    tokens: np.ndarray  # int64 token ids
    segments: np.ndarray  # int8: 0 up to and including the first [SEP], 1 after it
    offsets: np.ndarray  # example i is tokens[offsets[i]:offsets[i + 1]]

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def padded(self, rows: np.ndarray, width: int, pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """[len(rows), width] input ids, segment ids (0 on padding) and the mask of real tokens."""
        input_ids, real = gather_padded(self.tokens, self.offsets, rows, width, pad_id)
        segments, _ = gather_padded(self.segments, self.offsets, rows, width, 0)
        return input_ids, segments, real


def kept_lengths(first: int, second: int, room: int) -> tuple[int, int]:
    """How many word pieces of A and B fit in `room`, as transformers' tokenizers cut a pair
    (truncation="longest_first"): the longer side is cut first; if the shorter must be cut too, each
    keeps half, the longer (B on a tie) the odd piece. Google's run_classifier, popping one piece at a
    time, gives that odd piece to A instead; we match transformers, so that run_glue sees our inputs."""
    if first + second <= room:
        return first, second
    shorter, longer = sorted((first, second))
    kept_shorter, kept_longer = shorter, max(shorter, room - shorter)
    if kept_shorter + kept_longer > room:
        kept_shorter, kept_longer = room // 2, room // 2 + room % 2
    return (kept_longer, kept_shorter) if first > second else (kept_shorter, kept_longer)


def encode_examples(vocab, first: list[str], second: list[str] | None, seq_len: int) -> EncodedExamples:
    """Token ids and segment ids of every example, cut to seq_len with the vocabulary's tokenizer
    (as classification_task encodes single sentences: `vocab.encode`, then [CLS]/[SEP] added)."""
    if seq_len < (4 if second is not None else 3):
        raise ValueError(f"seq_len {seq_len} leaves no room for a word piece")
    first_pieces = vocab.encode(first)
    second_pieces = vocab.encode(second) if second is not None else [None] * len(first_pieces)
    samples, segments = [], []
    for a, b in zip(first_pieces, second_pieces):
        if b is None:
            a = a[:seq_len - 2]
            samples.append([vocab.cls_id, *a, vocab.sep_id])
            segments.append(len(a) + 2)
            continue
        keep_a, keep_b = kept_lengths(len(a), len(b), seq_len - 3)
        samples.append([vocab.cls_id, *a[:keep_a], vocab.sep_id, *b[:keep_b], vocab.sep_id])
        segments.append(keep_a + 2)
    return ragged(samples, segments)


def ragged(samples: list[list[int]], first_segment_lengths: list[int]) -> EncodedExamples:
    lengths = np.fromiter((len(sample) for sample in samples), np.int64, len(samples))
    offsets = np.zeros(len(samples) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = np.fromiter((token for sample in samples for token in sample), np.int64, int(offsets[-1]))
    # within each example, a position is in segment 1 once it is past A's [CLS] A [SEP]
    position = np.arange(offsets[-1]) - np.repeat(offsets[:-1], lengths)
    segments = (position >= np.repeat(np.asarray(first_segment_lengths, np.int64), lengths)).astype(np.int8)
    return EncodedExamples(tokens, segments, offsets)


# ----------------------------------------------------------------------------- metrics

def accuracy(labels: np.ndarray, predictions: np.ndarray) -> float:
    return float(np.mean(np.asarray(labels) == np.asarray(predictions)))


def f1_score(labels: np.ndarray, predictions: np.ndarray) -> float:
    """F1 of class 1 (MRPC's equivalent, QQP's duplicate), as GLUE scores it; 0 with no true positive."""
    labels, predictions = np.asarray(labels) == 1, np.asarray(predictions) == 1
    true_positives = int(np.sum(labels & predictions))
    wrong = int(np.sum(labels != predictions))
    return 2 * true_positives / (2 * true_positives + wrong) if true_positives else 0.0


def matthews_correlation(labels: np.ndarray, predictions: np.ndarray) -> float:
    """Matthews correlation (CoLA), for any number of classes (Gorodkin's R_K, as scikit-learn's
    matthews_corrcoef); 0 where undefined, e.g. a model that always predicts one class."""
    labels, predictions = np.asarray(labels, np.int64), np.asarray(predictions, np.int64)
    classes = int(max(labels.max(), predictions.max())) + 1
    return matthews_from_confusion(
        np.bincount(labels * classes + predictions, minlength=classes * classes).reshape(classes, classes))


def matthews_from_confusion(confusion: np.ndarray) -> float:
    """Matthews correlation from counts[true, predicted]; 0 where undefined."""
    total, correct = float(confusion.sum()), float(np.trace(confusion))
    true_counts, predicted_counts = confusion.sum(1).astype(float), confusion.sum(0).astype(float)
    numerator = correct * total - true_counts @ predicted_counts
    denominator = math.sqrt(total ** 2 - predicted_counts @ predicted_counts) * math.sqrt(
        total ** 2 - true_counts @ true_counts)
    return numerator / denominator if denominator else 0.0


def pearson(labels: np.ndarray, predictions: np.ndarray) -> float:
    """Pearson correlation (STS-B); 0 where undefined (a constant prediction), where scipy says NaN."""
    x = np.asarray(labels, np.float64) - np.mean(labels)
    y = np.asarray(predictions, np.float64) - np.mean(predictions)
    denominator = math.sqrt(float(x @ x) * float(y @ y))
    return float(x @ y) / denominator if denominator else 0.0


def spearman(labels: np.ndarray, predictions: np.ndarray) -> float:
    """Spearman correlation (STS-B): Pearson's on the ranks, ties at their average rank."""
    return pearson(average_ranks(labels), average_ranks(predictions))


def average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, tied values sharing the mean of their ranks (scipy's rankdata, 'average')."""
    values = np.asarray(values, np.float64)
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    sizes = np.diff(np.r_[starts, len(values)])
    ranks = np.empty(len(values))
    ranks[order] = np.repeat(starts + (sizes + 1) / 2, sizes)
    return ranks


METRICS = {"matthews": matthews_correlation, "accuracy": accuracy, "f1": f1_score, "pearson": pearson,
           "spearman": spearman}


def task_metrics(task: GlueTask, labels: np.ndarray, predictions: np.ndarray) -> dict[str, float]:
    """The task's GLUE metrics of one dev split (fractions, not percent): class ids for a
    classification task, scores for STS-B."""
    return {name: METRICS[name](labels, predictions) for name in task.metrics}


def task_score(task: GlueTask, metrics: dict[str, float]) -> float:
    """The one number GLUE gives a task: its metric, or the mean of its two (MRPC and QQP: F1 and
    accuracy; STS-B: Pearson and Spearman). best.pt is picked by it."""
    return float(np.mean([metrics[name] for name in task.metrics]))


# ----------------------------------------------------------------------------- averages

def result_task(result: str) -> GlueTask:
    """The task a result belongs to: `mnli_matched` is MNLI's."""
    return next(task for task in TASKS.values() if result in task.dev_results.values())


def leaderboard_average(results: dict[str, dict[str, float]]) -> float | None:
    """The GLUE leaderboard's score: the mean of nine task scores (CoLA, SST-2, MRPC, STS-B, QQP,
    MNLI, QNLI, RTE, WNLI), each the mean of the task's metrics, MNLI's the mean of its matched and
    mismatched accuracy; AX does not count. Checked against the BERT paper's test results: BERT-large
    (60.5, 94.9, 89.3/85.4, 87.6/86.5, 72.1/89.3, 86.7/85.9, 92.7, 70.1, 65.1) gives 80.5, its
    leaderboard score; counting MNLI-m and MNLI-mm as two tasks would give 81.1.

    `results` maps result names (`cola`, `mnli_matched`, `mnli_mismatched`, ...) to task_metrics;
    None while a task is missing."""
    names = [result for task in TASKS.values() if task.name != "ax" for result in task.dev_results.values()]
    if any(name not in results for name in names):
        return None
    scores = {name: task_score(result_task(name), results[name]) for name in names}
    scores["mnli"] = (scores.pop("mnli_matched") + scores.pop("mnli_mismatched")) / 2
    return float(np.mean(list(scores.values())))


def cramming_average(results: dict[str, dict[str, float]]) -> float | None:
    """The average Cramming reports, the BERT paper's (Table 1): WNLI left out, MNLI matched and
    mismatched counted as two, and one metric per task: F1 for MRPC and QQP, Spearman for STS-B,
    Matthews for CoLA, accuracy elsewhere. Checked: the BERT paper's BERT-large numbers above
    give its 82.1. None while a task is missing."""
    names = [result for task in TASKS.values() if task.name not in ("ax", "wnli")
             for result in task.dev_results.values()]
    if any(name not in results for name in names):
        return None
    return float(np.mean([results[name][result_task(name).headline_metric] for name in names]))


# ----------------------------------------------------------------------------- submission files

def submission_lines(task: GlueTask, predictions: np.ndarray, index: np.ndarray) -> list[str]:
    """The GLUE server's file: `index<TAB>prediction`, the prediction a label name for MNLI, AX,
    QNLI and RTE, a class number for CoLA, SST-2, MRPC, QQP and WNLI, a score for STS-B."""
    if len(predictions) != len(index):
        raise ValueError(f"{len(predictions)} predictions for {len(index)} examples")
    if task.is_regression:
        shown = [f"{float(score):.3f}" for score in predictions]
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


def label_names(task: str, num_labels: int) -> tuple[str, ...]:
    """What class i of a task's classifier means: GLUE's label names, STS-B's one "similarity"
    score, or the class numbers of `classify`."""
    if task in TASKS:
        return TASKS[task].label_names or ("similarity",)
    return tuple(str(label) for label in range(num_labels))
