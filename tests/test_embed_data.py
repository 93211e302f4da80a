"""src/tasks/embed_data.py: sentence pairs read from JSON lines or parquet, with hard negatives or
without, retrieval read in BEIR's layout, and their bad files one line naming the file and line."""
import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from errors import UserError
from tasks import embed_data


def write_jsonl(path: Path, rows: list):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))


def test_pairs_are_read_from_either_layout_with_or_without_negatives(tmp_path):
    rows = [{"anchor": "a dull film", "positive": "a boring movie", "negative": "a great cast"},
            {"anchor": "the plot", "positive": "the story", "negative": "the score"}]
    write_jsonl(tmp_path / "jsonl" / "embed" / "train.jsonl", rows)
    folder = tmp_path / "parquet"
    folder.mkdir()
    pq.write_table(pa.table({name: [row[name] for row in rows] for name in ("anchor", "positive")}),
                   folder / "train-00000-of-00001.parquet")
    from_jsonl, from_parquet = embed_data.read_pairs(tmp_path / "jsonl"), embed_data.read_pairs(folder)
    assert from_jsonl.columns == [["a dull film", "the plot"], ["a boring movie", "the story"],
                                  ["a great cast", "the score"]]
    assert from_parquet.columns == from_jsonl.columns[:2] and from_parquet.negatives is None


def test_bad_files_are_one_line_naming_file_and_line(tmp_path):
    path = tmp_path / "train.jsonl"
    cases = {"line 2: positive missing": [{"anchor": "a", "positive": "b"}, {"anchor": "c"}],
             "line 1: anchor ' '; expected a non-empty text": [{"anchor": " ", "positive": "b"}],
             "line 2: not JSON": [{"anchor": "a", "positive": "b"}, "{anchor"],
             "line 1: a JSON list; expected an object": ["[1, 2]"],
             "line 2: a negative, unlike the first row": [{"anchor": "a", "positive": "b"},
                                                          {"anchor": "a", "positive": "b", "negative": "c"}],
             "line 2: negative missing": [{"anchor": "a", "positive": "b", "negative": "c"},
                                          {"anchor": "a", "positive": "b"}]}
    for message, rows in cases.items():
        write_jsonl(path, rows)
        with pytest.raises(UserError, match=re.escape(f"{path}: {message}")):
            embed_data.read_pairs(tmp_path)
    path.unlink()
    pq.write_table(pa.table({"anchor": ["a"]}), tmp_path / "train-00000-of-00001.parquet")
    with pytest.raises(UserError, match="train-00000-of-00001.parquet: missing column positive"):
        embed_data.read_pairs(tmp_path)


def write_retrieval(folder: Path, qrels: str):
    write_jsonl(folder / "retrieval" / "corpus.jsonl", [{"_id": "d1", "title": "Jaws", "text": "a shark film"},
                                                        {"_id": 2, "text": "a western"}])
    write_jsonl(folder / "retrieval" / "queries.jsonl", [{"_id": "q1", "text": "sharks"}, {"_id": "q2", "text": "x"}])
    (folder / "retrieval" / "qrels").mkdir(parents=True, exist_ok=True)
    (folder / "retrieval" / "qrels" / "dev.tsv").write_text(qrels)


def test_retrieval_is_read_in_beirs_layout_and_its_errors_name_file_and_line(tmp_path):
    write_retrieval(tmp_path, "query-id\tcorpus-id\tscore\nq1\td1\t2\nq1\t2\t0\nq2\t2\t0\n")
    retrieval = embed_data.read_retrieval(tmp_path, "validation")
    assert retrieval.queries == ["sharks"] and retrieval.relevant == [{0: 2.0}]  # q2 has nothing relevant
    assert retrieval.documents == ["Jaws a shark film", "a western"]  # the title before the text
    qrels = tmp_path / "retrieval" / "qrels" / "dev.tsv"
    for text, message in (("q\tc\ts\n", "expected the header query-id, corpus-id, score"),
                          ("query-id\tcorpus-id\tscore\nq1\td1\thigh\n", "line 2: expected query-id, corpus-id and a "
                                                                         "numeric score"),
                          ("query-id\tcorpus-id\tscore\nq1\td9\t1\n", "corpus-id d9 is not in"),
                          ("query-id\tcorpus-id\tscore\nq7\td1\t1\n", "query-id q7 is not in")):
        qrels.write_text(text)
        with pytest.raises(UserError, match=re.escape(f"{qrels}: {message}")):
            embed_data.read_retrieval(tmp_path, "validation")
