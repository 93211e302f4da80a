"""src/tasks/labelled_files.py: the user's own files of labelled texts (train-file, validation-file,
test-file): CSV, TSV, JSON lines and parquet read with their columns, labels by name or number, pairs
of texts, lists of labels (multi-label), and every bad file one line naming it."""
import csv
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from errors import UserError
from tasks import labelled_files


def write_csv(path: Path, rows, header=("text", "label")) -> Path:
    with path.open("w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def write_jsonl(path: Path, rows, keys=("text", "label")) -> Path:
    path.write_text("".join(json.dumps(dict(zip(keys, row))) + "\n" for row in rows), encoding="utf-8")
    return path


def write_each_format(directory: Path, stem: str, rows, as_text=str) -> list[Path]:
    """The (text, label) rows as a CSV, TSV, JSON lines and parquet file; in the CSV and TSV a label is
    written as as_text gives it (a list of names: between commas)."""
    write_csv(directory / f"{stem}.csv", [(text, as_text(label)) for text, label in rows])
    (directory / f"{stem}.tsv").write_text("label\ttext\n" + "".join(f"{as_text(label)}\t{text}\n"
                                                                   for text, label in rows))
    write_jsonl(directory / f"{stem}.jsonl", rows)
    pq.write_table(pa.table({"text": [text for text, _ in rows], "label": [label for _, label in rows]}),
                   directory / f"{stem}.parquet")
    return [directory / f"{stem}.{suffix}" for suffix in ("csv", "tsv", "jsonl", "parquet")]


def read_rows(path: Path, needs_labels: bool = True) -> labelled_files.LabelledRows:
    """A one-text file's rows, its text in `text` or `sentence`, its label in `label`."""
    return labelled_files.read_labelled_rows(path, labelled_files.TEXT_COLUMNS, "label", needs_labels)


def test_each_format_gives_the_same_examples(tmp_path, examples):
    rows = examples[:40] + [("42", "positive"), ('a "quoted" word, and a comma', "negative")]
    for path in write_each_format(tmp_path, "a", rows):
        read = read_rows(path)
        assert read.texts == [text for text, _ in rows] and read.names == [label for _, label in rows], path


def test_labels_are_names_and_numbers_are_their_digits(tmp_path):
    write_jsonl(tmp_path / "n.jsonl", [("one", 1), ("two", 2.0), ("ten", 10), ("three", " 3 ")])
    read = read_rows(tmp_path / "n.jsonl")
    assert read.names == ["1", "2", "10", "3"]
    assert labelled_files.ordered_names(read.names) == ("1", "2", "3", "10")  # as numbers where all are
    assert labelled_files.ordered_names(["b", "10", "a", "2"]) == ("10", "2", "a", "b")
    examples = labelled_files.labelled_examples(read, ("1", "2", "3", "10"), "the training file's")
    assert examples.labels.tolist() == [0, 1, 3, 2] and examples.index.tolist() == [0, 1, 2, 3]


def test_the_text_column_is_text_else_sentence_or_as_named(tmp_path):
    write_csv(tmp_path / "s.csv", [("a film", "1")], header=("sentence", "label"))
    assert read_rows(tmp_path / "s.csv").texts == ["a film"]
    write_csv(tmp_path / "r.csv", [("a film", "x", "good")], header=("review", "text", "mood"))
    read = labelled_files.read_labelled_rows(tmp_path / "r.csv", (("review",),), "mood", True)
    assert read.texts == ["a film"] and read.names == ["good"]


def test_a_byte_order_mark_is_not_part_of_the_first_column(tmp_path):
    (tmp_path / "b.csv").write_bytes("\ufefftext,label\nfine,1\n".encode("utf-8"))
    (tmp_path / "b.jsonl").write_bytes('\ufeff{"text": "fine", "label": 1}\n'.encode("utf-8"))
    for name in ("b.csv", "b.jsonl"):
        assert read_rows(tmp_path / name).texts == ["fine"]


def test_a_test_file_may_leave_its_labels_out(tmp_path):
    (tmp_path / "t.tsv").write_text("text\nfine\ndull\n")
    read = read_rows(tmp_path / "t.tsv", needs_labels=False)
    assert read.names is None
    examples = labelled_files.labelled_examples(read, ("a", "b"), "the training file's")
    assert examples.labels_hidden and examples.first == ["fine", "dull"]


@pytest.mark.parametrize("name, content, expected", [
    ("a.txt", "fine\n", "a.txt: expected a .csv, .tsv, .jsonl or .parquet file"),
    ("a.csv", "sentence,mood\nfine,1\n", "a.csv: missing column label (columns: sentence, mood)"),
    ("a.csv", "text,label\n", "a.csv: no examples"),
    ("a.csv", "text,label\n\"\",1\n", "a.csv: row 1, column text: empty sentence"),
    ("a.csv", "text,label\nfine,\n", "a.csv: row 1, column label: expected a label (a name or an integer), found None"),
    ("a.csv", "text,label\nfine,1,2\n", "a.csv: not a readable csv file (CSV parse error: Expected 2 columns, got 3:"),
    ("a.jsonl", '{"text": "fine", "label": 1}\nfine\n', "a.jsonl: line 2: not JSON (Expecting value)"),
    ("a.jsonl", '["fine", 1]\n', "a.jsonl: line 1: expected a JSON object, found list"),
    ("a.jsonl", '{"text": 7, "label": 1}\n', "a.jsonl: row 1, column text: expected text, found 7"),
    ("a.jsonl", '{"text": "fine", "label": 0.5}\n', "a.jsonl: row 1, column label: expected a label"),
    ("a.parquet", "not parquet", "a.parquet: not a readable parquet file ("),
])
def test_a_bad_file_is_one_line_naming_it(tmp_path, name, content, expected):
    (tmp_path / name).write_text(content)
    with pytest.raises(UserError) as error:
        assert read_rows(tmp_path / name).names is None  # a label is checked when read as a class name
    assert str(error.value).startswith(f"{tmp_path / name}: " + expected.split(": ", 1)[1]), str(error.value)
    assert "\n" not in str(error.value)


def test_a_label_the_model_lacks_names_the_row_and_whose_labels(tmp_path):
    write_csv(tmp_path / "d.csv", [("fine", "positive"), ("meh", "neutral")])
    read = read_rows(tmp_path / "d.csv")
    with pytest.raises(UserError, match=r"d.csv: row 2, column label: label 'neutral' is not one of the "
                                        r"checkpoint's labels \(negative, positive\)$"):
        labelled_files.labelled_examples(read, ("negative", "positive"), "the checkpoint's")


def test_a_pair_file_reads_both_texts_by_either_name(tmp_path):
    rows = [("a film", "the same film", "same"), ("a film", "a storm", "different")]
    write_csv(tmp_path / "glue.csv", rows, header=("sentence1", "sentence2", "label"))
    write_jsonl(tmp_path / "hf.jsonl", rows, keys=("text", "text_pair", "label"))
    write_csv(tmp_path / "own.csv", rows, header=("query", "passage", "relevant"))
    for path, columns, label in ((tmp_path / "glue.csv", labelled_files.PAIR_COLUMNS, "label"),
                                 (tmp_path / "hf.jsonl", labelled_files.PAIR_COLUMNS, "label"),
                                 (tmp_path / "own.csv", (("query",), ("passage",)), "relevant")):
        read = labelled_files.read_labelled_rows(path, columns, label, needs_labels=True)
        assert read.texts == ["a film", "a film"] and read.pairs == ["the same film", "a storm"], path
        assert labelled_files.labelled_examples(read, ("different", "same"), "").second == read.pairs
    with pytest.raises(UserError, match=r"own.csv: missing column text_pair or sentence2 \(columns: query, passage, "
                                        r"relevant\)$"):
        labelled_files.read_labelled_rows(tmp_path / "own.csv", (("query",), ("text_pair", "sentence2")), "relevant",
                                          True)


def tagged(rows) -> list[tuple[str, list[str]]]:
    """Each sentence with its tags: its polarity (`mixed`: both), `long` past 20 words; every seventh none."""
    tags = {"negative": ["negative"], "positive": ["positive"], "mixed": ["negative", "positive"]}
    return [(text, [] if i % 7 == 3 else tags[mood] + (["long"] if len(text.split()) > 20 else []))
            for i, (text, mood) in enumerate(rows)]


def test_a_multi_label_file_reads_lists_or_names_between_commas(tmp_path, examples):
    rows = tagged(examples[:30])
    for path in write_each_format(tmp_path, "t", rows, as_text=" , ".join):
        read = read_rows(path)
        assert read.name_sets == [tags for _, tags in rows], path
    examples = labelled_files.multi_hot_examples(read, ("long", "negative", "positive"), "the training file's")
    assert examples.labels.shape == (30, 3) and examples.labels[3].tolist() == [0, 0, 0]
    assert [set(np.flatnonzero(row)) for row in examples.labels] == [
        {("long", "negative", "positive").index(tag) for tag in tags} for _, tags in rows]
    write_jsonl(tmp_path / "n.jsonl", [("a film", [1, "2"]), ("another", None), ("a third", 3)])
    assert read_rows(tmp_path / "n.jsonl").name_sets == [["1", "2"], [], ["3"]]
