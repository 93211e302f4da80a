"""src/tasks/token_data.py: windows and first-piece labels as pure functions, CoNLL text and parquet
read with their tags by name, their one-line errors, and where a split's files are found."""
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from model import IGNORE_INDEX
from tasks import token_data
from tasks.token_data import TaggedSentences, best_windows, encode_sentences, windows


def test_windows_cover_every_piece_and_each_piece_is_scored_where_it_has_most_context():
    assert windows(5, 8) == [(0, 5)]
    assert windows(10, 4) == [(0, 4), (2, 6), (4, 8), (6, 10)]
    best = best_windows(windows(10, 4), 10)
    # pieces 0-2 in the first window (piece 2 has 1 on each side there and in the second: the earlier wins)
    assert best.tolist() == [0, 0, 0, 1, 1, 2, 2, 3, 3, 3]


def test_a_words_label_sits_on_its_first_piece_and_long_sentences_score_each_word_once(vocab):
    words = ["unbelievably", "good", "acting"] * 20
    tags = [1, 0, 2] * 20
    data = TaggedSentences([words], [tags], ("O", "B-X", "I-X"), ())
    pieces = vocab.tokenizer.encode(words, is_pretokenized=True, add_special_tokens=False)
    assert len(pieces.ids) > 30  # "unbelievably" is more than one piece: the sentence needs windows
    encoded = encode_sentences(vocab, data, seq_len=32)
    assert len(encoded) > 1 and (encoded.lengths <= 32).all()
    first_window = slice(encoded.offsets[0], encoded.offsets[1])
    assert encoded.tokens[first_window][0] == vocab.cls_id and encoded.tokens[first_window][-1] == vocab.sep_id
    word_ids = [-1 if word is None else word for word in pieces.word_ids]
    first_pieces = [i for i, word in enumerate(word_ids) if i == 0 or word != word_ids[i - 1]]
    expected = [IGNORE_INDEX] * len(word_ids)
    for piece in first_pieces:
        expected[piece] = tags[word_ids[piece]]
    assert encoded.labels[first_window][1:-1].tolist() == expected[:30]
    scored = encoded.scored_words[encoded.scored_words >= 0]
    assert sorted(scored.tolist()) == list(range(len(words)))  # every word scored, in exactly one window


CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
call NN I-NP O

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER
"""


def test_conll_text_reads_the_chosen_column_and_skips_document_starts(tmp_path):
    (tmp_path / "train.txt").write_text(CONLL, encoding="utf-8")
    data = token_data.read_split(tmp_path, "train", "ner_tags")
    assert data.words == [["EU", "rejects", "German", "call"], ["Peter", "Blackburn"]]
    assert data.label_names == ("O", "B-MISC", "B-ORG", "B-PER", "I-PER")
    assert data.tag_names(1) == ["B-PER", "I-PER"]
    chunks = token_data.read_split(tmp_path, "train", "chunk_tags")
    assert chunks.tag_names(0) == ["B-NP", "B-VP", "B-NP", "I-NP"]
    assert token_data.read_split(tmp_path, "train", "2").tag_names(1) == ["NNP", "NNP"]


def write_parquet(path, tokens, tags, names=("O", "B-X", "I-X")):
    features = {"ner_tags": {"feature": {"names": list(names), "_type": "ClassLabel"}, "_type": "Sequence"}}
    table = pa.table({"tokens": tokens, "ner_tags": tags})
    if names:
        table = table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})
    pq.write_table(table, path)


def test_bad_files_are_one_line_naming_file_and_line_or_row(tmp_path):
    (tmp_path / "train.txt").write_text(CONLL, encoding="utf-8")
    (tmp_path / "valid.txt").write_text("Paris B-LOC\n", encoding="utf-8")
    with pytest.raises(token_data.UserError, match=r"valid.txt: tag B-LOC \(line 1\) is not among the model's "
                                                   r"labels \(O, B-MISC"):
        labels = token_data.read_split(tmp_path, "train", "ner_tags").label_names
        token_data.read_split(tmp_path, "validation", "ner_tags", labels)
    (tmp_path / "valid.txt").write_text("Paris B-LOC\nis O\nnice B-ADJ\n\nRome B-LOC\n", encoding="utf-8")
    with pytest.raises(token_data.UserError, match=r"valid.txt: tags B-LOC \(line 1\), B-ADJ \(line 3\) are not "
                                                   r"among the checkpoint's labels \(O, B-MISC"):
        token_data.read_split(tmp_path, "validation", "ner_tags", labels, whose="the checkpoint's")
    (tmp_path / "valid.txt").write_text("Paris\n", encoding="utf-8")
    with pytest.raises(token_data.UserError, match=r"valid.txt: line 1: 1 column\(s\), expected a word and its tag"):
        token_data.read_split(tmp_path, "validation", "ner_tags", ("O",))
    folder = tmp_path / "ner"
    folder.mkdir()
    cases = {"missing column ner_tags": lambda path: pq.write_table(pa.table({"tokens": [["a"]]}), path),
             "row 2: tag 7 in ner_tags is not a label id (0 to 2": lambda path: write_parquet(
                 path, [["a"], ["b"]], [[0], [7]]),
             "row 1: 2 tokens but 1 tags": lambda path: write_parquet(path, [["a", "b"]], [[0]]),
             "column ner_tags holds tag ids without their names": lambda path: write_parquet(
                 path, [["a"]], [[0]], names=())}
    for message, write in cases.items():
        path = folder / "train-00000-of-00001.parquet"
        write(path)
        escaped = message.replace("(", r"\(")
        with pytest.raises(token_data.UserError, match=f"{path}: {escaped}"):
            token_data.read_split(tmp_path, "train", "ner_tags")
    write_parquet(folder / "train-00000-of-00001.parquet", [["a"]], [[1]], names=())
    given = token_data.read_split(tmp_path, "train", "ner_tags", id_names=("O", "B-X"))
    assert given.tag_names(0) == ["B-X"]
    path = folder / "train-00000-of-00001.parquet"
    write_parquet(path, [["a"]], [[1]], names=("O", "B-X", "B-X"))
    with pytest.raises(token_data.UserError, match=f"{path}: the Hugging Face metadata of ner_tags: B-X named twice"):
        token_data.read_split(tmp_path, "train", "ner_tags")


def test_a_parquet_files_tag_ids_are_read_by_their_names_not_their_order(tmp_path):
    folder = tmp_path / "ner"
    folder.mkdir()
    write_parquet(folder / "test-00000-of-00001.parquet", [["a", "b", "c"]], [[2, 1, 0]], names=("I-X", "B-X", "O"))
    data = token_data.read_split(tmp_path, "test", "ner_tags", ("O", "B-X", "I-X"))
    assert data.tags == [[0, 1, 2]] and data.tag_names(0) == ["O", "B-X", "I-X"]
    write_parquet(folder / "test-00000-of-00001.parquet", [["a", "b"]], [[0, 1]], names=("O", "B-Y", "I-X"))
    with pytest.raises(token_data.UserError, match=r"tag B-Y \(row 1\) is not among the model's labels "
                                                   r"\(O, B-X, I-X\)"):
        token_data.read_split(tmp_path, "test", "ner_tags", ("O", "B-X", "I-X"))


def test_the_ner_folders_text_wins_over_another_tasks_parquet_beside_it(tmp_path):
    """The demo's datasets/ holds SST-2's parquet; a CoNLL text in datasets/ner/ is the NER data."""
    (tmp_path / "ner").mkdir()
    (tmp_path / "ner" / "train.txt").write_text("A O\nwestern B-GENRE\n", encoding="utf-8")
    (tmp_path / "train-00000-of-00001.parquet").write_bytes(b"SST-2's")
    assert token_data.find_files(tmp_path, "train") == [tmp_path / "ner" / "train.txt"]
