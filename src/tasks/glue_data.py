"""GLUE's data on disk, in either layout (Hugging Face parquet, the GLUE distribution's TSV): a task's
split found, read and checked, any bad value a one-line error naming the file, row or line, and column.
The user's own files (classify, classify_pair) are labelled_files.py's.
"""
import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from errors import UserError
from tasks.glue_tasks import GlueTask, glue_task, is_test_split, task_split

HIDDEN_LABEL = -1  # what test splits hold where the label is kept back (HF parquet, and ours in memory)
HIDDEN_SCORE = float("nan")  # STS-B's hidden label in memory: -1 would pass for a (bad) score
SIMILARITY_RANGE = (0.0, 5.0)  # STS-B's scores
# csv's default (131,072 characters) stops at a long scraped sentence. Unquoted, a field ends at its
# line, so the limit guards against nothing here; this one is the largest every platform accepts.
TSV_FIELD_LIMIT = 2**31 - 1


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
    labels: np.ndarray  # int64 class ids (HIDDEN_LABEL where hidden), float32 scores (NaN), or multi-label
    # float32 rows of 0 or 1 a class (NaN)
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
    if all(part.labels_hidden for part in parts):
        check_unique_index(parts, files)
    return concatenated(parts, tuple(files))


def check_unique_index(parts: list[Examples], files: list[Path]):
    """Where the labels are hidden, the index names one example each: the server's file has a row
    per index, and two rows with one index are no submission."""
    seen: dict[int, Path] = {}
    for part, path in zip(parts, files):
        for number in part.index.tolist():
            if number in seen:
                elsewhere = "" if seen[number] == path else f" (one in {seen[number]})"
                raise UserError(f"{path}: index {number} is on two test examples{elsewhere}; "
                                f"the submission needs one row per example")
            seen[number] = path


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
    default_limit = csv.field_size_limit(TSV_FIELD_LIMIT)
    try:  # utf-8-sig: MRPC's files start with a byte-order mark, which would hide `Quality`
        with path.open(encoding="utf-8-sig", newline="") as file:
            return list(csv.reader(file, delimiter="\t", quoting=csv.QUOTE_NONE))
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{path}: cannot read ({error})") from None
    finally:
        csv.field_size_limit(default_limit)


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

