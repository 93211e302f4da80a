"""classify's and classify_pair's examples from the user's own files (train-file, validation-file,
test-file): .csv, .tsv, .jsonl or .parquet, a text (or a pair's two) and a label a row. A label is a
class by name, a list of them (multi-label), or a number to predict (num-labels = 1); any bad value is
one line naming the file, row and column. GLUE's layouts are glue_data.py's.
"""
import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from errors import UserError
from tasks.glue_data import HIDDEN_LABEL, HIDDEN_SCORE, Column, Examples, as_integer, as_number, checked_texts

LABELLED_FORMATS = (".csv", ".tsv", ".jsonl", ".parquet")
# Where text-column (text-pair-column) is empty, the first of these names a file has: one text, or a pair's two.
TEXT_COLUMNS = (("text", "sentence"),)
PAIR_COLUMNS = (("text", "sentence1"), ("text_pair", "sentence2"))


def labelled_file(config, split: str) -> Path:
    """The user's own file of a split (train-file, validation-file, test-file)."""
    path = {"train": config.train_file, "validation": config.validation_file, "test": config.test_file}[split]
    if not path:
        raise UserError(f"--test needs test-file: task-type = {config.task_type} reads its examples from "
                        f"train-file, validation-file and test-file")
    return Path(path)


def text_columns(config) -> tuple[tuple[str, ...], ...]:
    """The columns a user's file holds its texts in: each the one its key names, else the first of
    TEXT_COLUMNS' (PAIR_COLUMNS') candidates the file has."""
    if config.task_type == "classify":
        return ((config.text_column,),) if config.text_column else TEXT_COLUMNS
    first, second = PAIR_COLUMNS
    return ((config.text_column,) if config.text_column else first,
            (config.text_pair_column,) if config.text_pair_column else second)


@dataclass
class LabelledRows:
    """A user's file of examples: its texts (a pair's second ones too), and its label column's values
    as read (None: no label column)."""
    path: Path
    texts: list[str]
    pairs: list[str] | None
    column: str
    values: list | None

    @functools.cached_property
    def names(self) -> list[str] | None:
        """The labels as names: text as written (less surrounding spaces), an integer (1, 1.0) as its digits."""
        return None if self.values is None else [label_text(self.path, self.column, row, value)
                                                 for row, value in enumerate(self.values)]

    @functools.cached_property
    def name_sets(self) -> list[list[str]] | None:
        """A multi-label file's labels, each row's names: a list (JSON lines, parquet), or names between
        commas (CSV, TSV; a number alone is one); empty, null or []: none of the classes."""
        return None if self.values is None else [label_list(self.path, self.column, row, value)
                                                 for row, value in enumerate(self.values)]


def read_labelled_rows(path: Path, text_columns: tuple[tuple[str, ...], ...], label_column: str,
                       needs_labels: bool) -> LabelledRows:
    """Each row's text (or pair of texts) and label; each text from the first of its candidate
    columns the file has (TEXT_COLUMNS, PAIR_COLUMNS, or the one a key names). A test file may leave the
    label column out (needs_labels False): its labels are then hidden."""
    columns = read_columns(path, tuple(name for candidates in text_columns for name in candidates))
    chosen = [next((name for name in candidates if name in columns), " or ".join(candidates))
              for candidates in text_columns]
    for name in (*chosen, label_column) if needs_labels else chosen:
        if name not in columns:
            raise UserError(f"{path}: missing column {name} (columns: {', '.join(columns) or 'none'})")
    if not columns[chosen[0]]:
        raise UserError(f"{path}: no examples")
    texts = [checked_texts(path, Column(name, columns[name]), row_place, allow_empty=False) for name in chosen]
    return LabelledRows(path, texts[0], texts[1] if len(texts) > 1 else None, label_column, columns.get(label_column))


def row_place(row: int) -> str:
    return f"row {row + 1}"


def read_columns(path: Path, text_columns: tuple[str, ...]) -> dict[str, list]:
    """A file's columns by name, in its format (by suffix); text_columns stay text in a CSV or TSV
    (`42` is a sentence there, not a number)."""
    suffix = path.suffix.lower()
    if suffix not in LABELLED_FORMATS:
        raise UserError(f"{path}: expected a {', '.join(LABELLED_FORMATS[:-1])} or {LABELLED_FORMATS[-1]} file")
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    if suffix == ".jsonl":
        return read_json_lines(path)
    try:
        if suffix == ".parquet":
            table = pq.read_table(path)
        else:  # a TSV is read as GLUE's are: unquoted, a field ends at the tab or the line
            parse = pa_csv.ParseOptions(delimiter="\t", quote_char=False) if suffix == ".tsv" else \
                pa_csv.ParseOptions(newlines_in_values=True)
            convert = pa_csv.ConvertOptions(column_types={name: pa.string() for name in text_columns},
                                            strings_can_be_null=False)
            table = pa_csv.read_csv(path, parse_options=parse, convert_options=convert)
    except (OSError, pa.ArrowException) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else error.__class__.__name__
        raise UserError(f"{path}: not a readable {suffix[1:]} file ({reason})") from None
    return {name: table.column(name).to_pylist() for name in table.column_names}


def read_json_lines(path: Path) -> dict[str, list]:
    """A JSON object a line (blank lines skipped) as columns; a key a row lacks is None there."""
    rows = []
    try:
        with path.open(encoding="utf-8-sig") as file:
            for number, line in enumerate(file, start=1):
                if line.strip():
                    rows.append((number, json.loads(line)))
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise UserError(f"{path}: line {number}: not JSON ({error.msg})") from None
    for number, row in rows:
        if not isinstance(row, dict):
            raise UserError(f"{path}: line {number}: expected a JSON object, found {type(row).__name__}")
    names = list(dict.fromkeys(name for _, row in rows for name in row))
    return {name: [row.get(name) for _, row in rows] for name in names}


def label_text(path: Path, column: str, row: int, value) -> str:
    """A label as a name: text as written (less surrounding spaces), an integer (1, 1.0) as its digits."""
    if isinstance(value, str) and value.strip():
        return value.strip()
    number = as_integer(value)
    if number is None:
        raise UserError(f"{path}: {row_place(row)}, column {column}: expected a label (a name or an integer), "
                        f"found {value!r}")
    return str(number)


def label_list(path: Path, column: str, row: int, value) -> list[str]:
    """A multi-label row's names (LabelledRows.name_sets)."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [label_text(path, column, row, each) for each in value]
    if isinstance(value, str):
        return [name.strip() for name in value.split(",") if name.strip()]
    return [label_text(path, column, row, value)]


def ordered_names(labels: list[str]) -> tuple[str, ...]:
    """The distinct labels in the model's order: as numbers where every one is an integer (2 before
    10), else as text."""
    distinct = set(labels)
    numbers = all(re.fullmatch(r"-?\d+", name) for name in distinct)
    return tuple(sorted(distinct, key=int if numbers else None))


def labelled_examples(rows: LabelledRows, names: tuple[str, ...], whose: str) -> Examples:
    """The rows as Examples, each label the index of its name; a label not among `names` is one line
    naming the file, row and label, and `whose` names they are (the training file's, the checkpoint's)."""
    if rows.names is None:
        labels = np.full(len(rows.texts), HIDDEN_LABEL, np.int64)
    else:
        ids = {name: index for index, name in enumerate(names)}
        for row, label in enumerate(rows.names):
            if label not in ids:
                raise unknown_label(rows, row, label, names, whose)
        labels = np.array([ids[label] for label in rows.names], np.int64)
    return Examples(rows.texts, rows.pairs, labels, np.arange(len(rows.texts), dtype=np.int64), (rows.path,))


def multi_hot_examples(rows: LabelledRows, names: tuple[str, ...], whose: str) -> Examples:
    """The rows of a multi-label file as Examples: labels [examples, classes], 1 where a row names the
    class, else 0 (NaN rows where the file has no labels)."""
    labels = np.full((len(rows.texts), len(names)), HIDDEN_SCORE if rows.values is None else 0.0, np.float32)
    ids = {name: index for index, name in enumerate(names)}
    for row, chosen in enumerate(rows.name_sets or ()):
        for label in chosen:
            if label not in ids:
                raise unknown_label(rows, row, label, names, whose)
            labels[row, ids[label]] = 1.0
    return Examples(rows.texts, rows.pairs, labels, np.arange(len(rows.texts), dtype=np.int64), (rows.path,))


def unknown_label(rows: LabelledRows, row: int, label: str, names: tuple[str, ...], whose: str) -> UserError:
    """One line naming the file, row and label, and `whose` the labels are (the training file's, the checkpoint's)."""
    shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
    return UserError(f"{rows.path}: {row_place(row)}, column {rows.column}: label {label!r} is not one "
                     f"of {whose} labels ({shown})")


def scored_examples(rows: LabelledRows) -> Examples:
    """The rows as Examples of a regression (num-labels = 1), each label a finite number; NaN where hidden."""
    scores = np.full(len(rows.texts), HIDDEN_SCORE, np.float32)
    for row, value in enumerate(rows.values or ()):
        score = as_number(value)
        if score is None:
            raise UserError(f"{rows.path}: {row_place(row)}, column {rows.column}: expected a number (num-labels "
                            f"= 1: a score to predict), found {value!r}")
        scores[row] = score
    return Examples(rows.texts, rows.pairs, scores, np.arange(len(rows.texts), dtype=np.int64), (rows.path,))
