"""Every reader of a text file a user writes: a UTF-8 byte-order mark (Windows editors write one) is
not part of the text, so a file reads the same with it as without; and JSON nested thousands deep is
one line naming the file, not a RecursionError."""
import gzip
import json
from pathlib import Path

import pytest

import classify
from tasks import embed_data
import glue
from tasks import glue_data
from interop import hf_import
import ini
import qa
from tasks import squad_data
from tasks import token_data
import vocab
from errors import UserError
from corpus.input_files import BadRecords, find_inputs, read_documents

BOM = "\ufeff"
SQUAD = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": "A western from 1959.", "qas": [
    {"id": "q1", "question": "When was it made?", "answers": [{"text": "1959", "answer_start": 15}]}]}]}]}


def documents(path: Path) -> list[list[str]]:
    return list(read_documents(find_inputs([str(path)])))


def gzipped_documents(path: Path) -> list[list[str]]:
    packed = path.with_name(path.name + ".gz")
    packed.write_bytes(gzip.compress(path.read_bytes()))
    return documents(packed)


def tagged(path: Path):
    split = token_data.read_split(path.parent, "train", "ner_tags")
    return split.words, split.tags, split.label_names


def questions(path: Path):
    split = squad_data.read_split(path.parent, "squad", "train")
    return split.ids, split.questions, split.contexts, split.answers


def pairs(path: Path):
    read = embed_data.read_jsonl_pairs(path)
    return read.anchors, read.positives, read.negatives


# (the file's name, its text, what its reader makes of it, in a form that compares)
READERS = {
    "conll": ("train.txt", "-DOCSTART- O\n\nA O\nwestern B-GENRE\n\nThe O\nend O\n", tagged),
    "squad json": ("train-v1.1.json", json.dumps(SQUAD), questions),
    "sentence pairs": ("train.jsonl", '{"anchor": "a western", "positive": "a film of the west"}\n', pairs),
    "beir qrels": ("dev.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t1\n", embed_data.read_qrels),
    "beir corpus": ("corpus.jsonl", '{"_id": "d1", "title": "West", "text": "A western."}\n',
                    lambda path: embed_data.read_texts(path, with_title=True)),
    "glue tsv": ("train.tsv", "sentence\tlabel\na fine western\t1\n", glue_data.read_tsv_rows),
    "corpus text": ("corpus.txt", "A western from 1959.\nThe end.\n", documents),
    "corpus text gz": ("corpus.txt", "A western from 1959.\nThe end.\n", gzipped_documents),
    "corpus jsonl": ("corpus.jsonl", '{"text": "A western from 1959."}\n', documents),
    "vocab.txt": ("vocab.txt", "".join(f"{token}\n" for token in (*vocab.SPECIAL_TOKENS, "a", "western")),
                  lambda path: vocab.load_vocab(path).tokens),
    "a model's json": ("config.json", '{"do_lower_case": true}', lambda path: vocab.read_json_object(path, "x")),
    "config.ini": ("config.ini", "seq-len = 64\n", lambda path: ini.read_ini(path)[0]),
    "glue recipe": ("glue.ini", "[all]\nseq-len = 64\n", glue.read_recipe),
    "sentences -i": ("sentences.txt", "a western\nthe end\n", classify.read_sentences),
    "questions -i": ("questions.jsonl", '{"question": "When?", "context": "In 1959."}\n', qa.read_questions),
}


@pytest.mark.parametrize("name, text, read", READERS.values(), ids=READERS.keys())
def test_a_byte_order_mark_is_not_part_of_the_text(tmp_path, name, text, read):
    """A CoNLL file's mark before -DOCSTART- once made a word tagged O, a bogus sentence."""
    plain, marked = tmp_path / "plain" / name, tmp_path / "marked" / name
    for path, prefix in ((plain, ""), (marked, BOM)):
        path.parent.mkdir()
        path.write_text(prefix + text, encoding="utf-8")
    assert read(marked) == read(plain)


def deep(depth: int = 100_000) -> str:
    return "[" * depth + "]" * depth


# (the file's name, its reader)
JSON_READERS = {
    "squad json": ("train-v1.1.json", lambda path: squad_data.read_split(path.parent, "squad", "train")),
    "sentence pairs": ("train.jsonl", embed_data.read_jsonl_pairs),
    "a model's json": ("config.json", lambda path: vocab.read_json_object(path, "the model's settings")),
    "sentence-transformers modules": ("modules.json", lambda path: hf_import.embedding_settings(path.parent, 512)),
    "qa.py's questions": ("questions.jsonl", qa.read_questions),
    "corpus jsonl": ("corpus.jsonl", lambda path: list(read_documents(find_inputs([str(path)]), "text",
                                                                      BadRecords(skip=False)))),
}


@pytest.mark.parametrize("name, read", JSON_READERS.values(), ids=JSON_READERS.keys())
def test_json_nested_too_deep_is_one_line_naming_the_file(tmp_path, name, read):
    path = tmp_path / name
    path.write_text(deep() + "\n", encoding="utf-8")
    with pytest.raises(UserError, match=f"^{path}"):
        read(path)
