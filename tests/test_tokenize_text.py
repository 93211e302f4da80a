"""Tests for scripts/tokenize_text.py: the same ids whatever -n and --chunk-mb, clean failures.

Real IMDB reviews (conftest.imdb_corpus, ~2.5 MB) and the vocabulary trained on them.
"""
from pathlib import Path

import numpy as np
import pytest

from corpus import token_stream
import tokenize_text
from corpus.input_files import find_inputs
from corpus.token_stream import read_token_stream
from vocab import load_vocab


def read_ids(path: Path) -> tuple[dict, np.ndarray]:
    header, blocks = read_token_stream(path)
    return header, np.concatenate(list(blocks))


def run_main(argv: list[str]) -> None:
    tokenize_text.main([str(arg) for arg in argv])


@pytest.fixture(scope="module")
def serial_output(imdb_corpus, vocab_dir, tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("serial") / "imdb.ids"
    run_main(["-i", imdb_corpus, "-o", output, "-v", vocab_dir, "-n", "1", "--chunk-mb", "0.5"])
    return output


def test_ids_are_each_line_encoded_and_concatenated(serial_output, imdb_corpus, vocab_dir):
    vocab = load_vocab(vocab_dir)
    lines = imdb_corpus.read_text(encoding="utf-8").splitlines()
    expected = np.concatenate([np.array(ids, dtype=vocab.id_dtype) for ids in vocab.encode(lines)])
    header, ids = read_ids(serial_output)
    assert ids.dtype == vocab.id_dtype
    np.testing.assert_array_equal(ids, expected)
    assert header["tokens"] == len(expected)
    assert (header["vocab_size"], header["vocab_checksum"]) == (vocab.size, vocab.checksum)
    assert header["source_files"] == [str(imdb_corpus)]


def test_parallel_output_is_byte_identical_to_serial(serial_output, imdb_corpus, vocab_dir, tmp_path):
    output = tmp_path / "parallel.ids"
    run_main(["-i", imdb_corpus, "-o", output, "-v", vocab_dir, "-n", "2", "--chunk-mb", "0.5"])
    assert output.read_bytes() == serial_output.read_bytes()


def test_tiny_chunks_give_the_same_file_as_one_chunk(imdb_corpus, vocab_dir, tmp_path, monkeypatch):
    # Blocks of 10,000 tokens, so that the corpus spans many blocks and chunks end inside them.
    monkeypatch.setattr(tokenize_text, "TOKENS_PER_STREAM_BLOCK", 10_000)
    monkeypatch.setattr(token_stream, "TOKENS_PER_STREAM_BLOCK", 10_000)
    one_chunk, tiny_chunks = tmp_path / "one.ids", tmp_path / "tiny.ids"
    inputs = find_inputs([str(imdb_corpus)])
    tokenize_text.tokenize_files(inputs, vocab_dir, one_chunk, 1, chunk_bytes=64 << 20, show_progress=False)
    tokens = tokenize_text.tokenize_files(inputs, vocab_dir, tiny_chunks, 1, chunk_bytes=1000, show_progress=False)
    assert tokens == read_ids(one_chunk)[0]["tokens"]
    assert tiny_chunks.read_bytes() == one_chunk.read_bytes()
    assert {len(block) for block in read_token_stream(tiny_chunks)[1]} == {10_000, tokens % 10_000}


def test_blocks_are_cut_to_a_fixed_size_whatever_the_arrays():
    arrays = [np.arange(start, start + length) for start, length in ((0, 3), (3, 0), (3, 9), (12, 1), (13, 4))]
    blocks = list(tokenize_text.fixed_size_blocks(iter(arrays), block_tokens=4))
    assert [len(block) for block in blocks] == [4, 4, 4, 4, 1]
    np.testing.assert_array_equal(np.concatenate(blocks), np.arange(17))
    assert list(tokenize_text.fixed_size_blocks(iter([]), block_tokens=4)) == []


def test_glob_of_several_files_keeps_their_order(serial_output, imdb_corpus, vocab_dir, tmp_path):
    lines = imdb_corpus.read_text(encoding="utf-8").splitlines(keepends=True)
    half = len(lines) // 2
    (tmp_path / "part-1.txt").write_text("".join(lines[:half]), encoding="utf-8")
    (tmp_path / "part-2.txt").write_text("".join(lines[half:]), encoding="utf-8")
    output = tmp_path / "parts.ids"
    run_main(["-i", tmp_path / "part-*.txt", "-o", output, "-v", vocab_dir, "-n", "1"])
    np.testing.assert_array_equal(read_ids(output)[1], read_ids(serial_output)[1])


def bad_invocations(corpus: Path, vocab_dir: Path, tmp: Path) -> dict[str, list]:
    empty = tmp / "empty.txt"
    empty.touch()
    not_utf8 = tmp / "latin1.txt"
    not_utf8.write_bytes(corpus.read_bytes()[:200_000] + "café\n".encode("latin-1"))
    blank = tmp / "blank.txt"
    blank.write_text(" \n\t\n\n", encoding="utf-8")
    no_specials = tmp / "words.txt"
    no_specials.write_text("the\nmovie\n", encoding="utf-8")
    out = tmp / "out.ids"
    not_utf8_line = corpus.read_bytes()[:200_000].count(b"\n") + 1
    return {
        "missing input": (["-i", tmp / "absent.txt", "-o", out, "-v", vocab_dir], "absent.txt"),
        "glob matching nothing": (["-i", tmp / "none-*.txt", "-o", out, "-v", vocab_dir], "none-*.txt"),
        "empty input": (["-i", empty, "-o", out, "-v", vocab_dir], "empty.txt"),
        "whitespace only": (["-i", blank, "-o", out, "-v", vocab_dir], "blank.txt: no tokens in the input"),
        "input not UTF-8": (["-i", not_utf8, "-o", out, "-v", vocab_dir, "-n", "2"], "latin1.txt"),
        "input not UTF-8, late": (["-i", not_utf8, "-o", out, "-v", vocab_dir, "--chunk-mb", "0.01"],
                                   f"latin1.txt:{not_utf8_line}: not UTF-8 text"),
        "missing vocab": (["-i", corpus, "-o", out, "-v", tmp / "no-vocab"], "no-vocab"),
        "not a vocab": (["-i", corpus, "-o", out, "-v", no_specials], "words.txt"),
        "output directory missing": (["-i", corpus, "-o", tmp / "absent" / "out.ids", "-v", vocab_dir], "absent"),
        "output is a directory": (["-i", corpus, "-o", tmp, "-v", vocab_dir], str(tmp)),
        "no processes": (["-i", corpus, "-o", out, "-v", vocab_dir, "-n", "0"], "-n 0"),
        "no chunk": (["-i", corpus, "-o", out, "-v", vocab_dir, "--chunk-mb", "0"], "--chunk-mb 0"),
    }


def test_bad_inputs_exit_2_with_one_line_and_leave_nothing(imdb_corpus, vocab_dir, tmp_path, capsys):
    for case, (argv, named) in bad_invocations(imdb_corpus, vocab_dir, tmp_path).items():
        before = sorted(tmp_path.rglob("*"))
        with pytest.raises(SystemExit) as exit_info:
            run_main(argv)
        stderr = capsys.readouterr().err
        assert exit_info.value.code == 2, case
        # A failure found mid-way follows the progress bar, drawn with carriage returns.
        lines = [line for line in stderr.split("\n") if line and not line.startswith("\r")]
        assert len(lines) == 1 and lines[0].startswith("error: "), (case, stderr)
        assert named in stderr, (case, stderr)
        assert sorted(tmp_path.rglob("*")) == before, case
