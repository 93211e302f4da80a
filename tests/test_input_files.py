"""Reading input text: chunks end at line ends, a line without end is cut at spaces, and a one-line
corpus gives the same ids as the same words in many lines, in bounded pieces."""
import io

import numpy as np

import input_files
import prepare_mlm_dataset
import tokenize_text
from input_files import read_chunks, short_lines
from shards import read_shard
from token_stream import read_token_stream
from vocab import Vocab


def test_chunks_end_at_line_ends_or_at_a_space_of_a_line_that_runs_on():
    text = b"short line\n" + b"word " * 50 + b"end\n" + b"last"
    chunks = list(read_chunks(io.BytesIO(text), 16))
    assert b"".join(chunks) == text
    assert chunks[0] == b"short line\n" + b"word " * 4  # the next line runs on: cut at its last space in reach
    assert all(len(chunk) <= 32 for chunk in chunks)
    assert all(chunk.endswith((b"\n", b" ")) for chunk in chunks[:-1])


def test_a_long_run_without_spaces_is_cut_anyway():
    text = b"x" * 100
    chunks = list(read_chunks(io.BytesIO(text), 16))
    assert b"".join(chunks) == text and max(map(len, chunks)) <= 32
    assert short_lines(["y" * 25], limit=10) == ["y" * 10, "y" * 10, "y" * 5]


def test_short_lines_cut_at_spaces_and_keep_every_character():
    lines = ["a b c d e f g h", "short"]
    cut = short_lines(lines, limit=4)
    assert "".join(cut) == "".join(lines) and max(map(len, cut)) <= 4
    assert cut[:4] == ["a b ", "c d ", "e f ", "g h"]
    assert short_lines(lines, limit=100) is lines  # nothing to cut: the same list


def one_line_corpus(imdb_corpus, tmp_path):
    """The corpus's first 2,000 lines as many lines and as one."""
    lines = imdb_corpus.read_text(encoding="utf-8").splitlines()[:2000]
    many, one = tmp_path / "many.txt", tmp_path / "one.txt"
    many.write_text("\n".join(lines) + "\n", encoding="utf-8")
    one.write_text(" ".join(lines) + "\n", encoding="utf-8")
    return many, one


def test_a_one_line_corpus_is_tokenized_in_bounded_pieces_to_the_same_ids(imdb_corpus, vocab_dir, tmp_path,
                                                                         monkeypatch):
    many, one = one_line_corpus(imdb_corpus, tmp_path)
    longest, original = [], Vocab.encode
    monkeypatch.setattr(Vocab, "encode", lambda self, texts: longest.append(max(map(len, texts))) or
                        original(self, texts))
    monkeypatch.setattr(input_files, "MAX_LINE_CHARS", 10_000)
    monkeypatch.setattr(input_files.short_lines, "__defaults__", (10_000,))
    ids = {}
    for path in (many, one):
        tokenize_text.main(["-i", str(path), "-o", str(path.with_suffix(".ids")), "-v", str(vocab_dir), "-n", "1",
                            "--chunk-mb", "0.05"])
        ids[path.name] = np.concatenate(list(read_token_stream(path.with_suffix(".ids"))[1]))
    assert one.stat().st_size > 200_000 and max(longest) <= 10_000
    np.testing.assert_array_equal(ids["one.txt"], ids["many.txt"])


def test_a_one_line_corpus_packs_to_the_same_samples(imdb_corpus, vocab_dir, tmp_path, monkeypatch):
    many, one = one_line_corpus(imdb_corpus, tmp_path)
    monkeypatch.setattr(input_files.short_lines, "__defaults__", (10_000,))
    samples = {}
    for path in (many, one):
        out = tmp_path / path.stem
        prepare_mlm_dataset.main(["-i", str(path), "-l", "imdb", "-o", str(out), "-m", "64", "-v", str(vocab_dir),
                                  "--chunk-mb", "0.05"])
        shard = read_shard(out / "train_imdb_64_123.msgpack.gz")
        samples[path.name] = (shard.tokens, shard.offsets)
    for many_array, one_array in zip(samples["many.txt"], samples["one.txt"]):
        np.testing.assert_array_equal(many_array, one_array)
