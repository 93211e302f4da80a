"""src/corpus/preparation.py and the two preparers that share it (prepare_mlm_dataset.py from text,
prepare_mlm_fixed_len_dataset_from_ids.py from a token-id stream): the split, static masking,
identical files whatever the chunking, bad inputs."""
import errno
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import atomic
import prepare_mlm_dataset
import prepare_mlm_fixed_len_dataset_from_ids as prepare_fixed_len
from packed_files import HeaderFirstFile
from corpus.preparation import SPLITS, assign_splits
from shards import read_shard

SEQ_LEN = 128


def run_text(out, corpus, vocab_dir, *extra):
    prepare_mlm_dataset.main(["-i", str(corpus), "-l", "imdb", "-o", str(out), "-m", str(SEQ_LEN),
                              "-v", str(vocab_dir), *extra])
    return out


def run_fixed_len(out, stream, vocab_dir, *extra):
    prepare_fixed_len.main(["-i", str(stream), "-l", "imdb", "-o", str(out), "-m", str(SEQ_LEN),
                            "-v", str(vocab_dir), *extra])
    return out


@pytest.fixture(scope="module")
def text_out(imdb_corpus, vocab_dir, tmp_path_factory):
    return run_text(tmp_path_factory.mktemp("text"), imdb_corpus, vocab_dir)


@pytest.fixture(scope="module")
def fixed_out(id_stream, vocab_dir, tmp_path_factory):
    return run_fixed_len(tmp_path_factory.mktemp("fixed"), id_stream, vocab_dir)


@pytest.fixture(scope="module")
def static_out(id_stream, vocab_dir, tmp_path_factory):
    return run_fixed_len(tmp_path_factory.mktemp("static"), id_stream, vocab_dir, "--masking", "static",
                         "--copies", "2")


def shard_files(out):
    return sorted(path.name for path in out.glob("*.msgpack.gz"))


def samples_in_order(out, seed=123, label="imdb", seq_len=SEQ_LEN) -> list[np.ndarray]:
    """All samples of the three split shards, back in the order the preparer made them."""
    shards = {split: read_shard(out / f"{split}_{label}_{seq_len}_{seed}.msgpack.gz") for split in SPLITS}
    codes = assign_splits(seed, np.arange(sum(len(shard) for shard in shards.values())))
    next_of_split = [0, 0, 0]
    samples = []
    for code in codes:
        samples.append(shards[SPLITS[code]].sample(next_of_split[code]))
        next_of_split[code] += 1
    assert next_of_split == [len(shards[split]) for split in SPLITS]
    return samples


def check_framing(samples, vocab):
    assert all(len(sample) <= SEQ_LEN for sample in samples)
    assert all(sample[0] == vocab.cls_id and sample[-1] == vocab.sep_id for sample in samples)


def test_fixed_len_keeps_every_token_in_order(fixed_out, corpus_ids, vocab):
    samples = samples_in_order(fixed_out)
    check_framing(samples, vocab)
    assert all(len(sample) == SEQ_LEN for sample in samples[:-1])
    assert np.array_equal(np.concatenate([sample[1:-1] for sample in samples]), corpus_ids)


def test_text_segments_keep_every_token_and_whole_words(text_out, corpus_ids, vocab):
    samples = samples_in_order(text_out)
    check_framing(samples, vocab)
    assert np.array_equal(np.concatenate([sample[1:-1] for sample in samples]), corpus_ids)
    continues_word = np.array([token.startswith("##") for token in vocab.tokens])
    assert not any(continues_word[sample[1]] for sample in samples)  # no word cut (none is that long here)
    short = sum(len(sample) - 2 < (SEQ_LEN - 2) / 2 for sample in samples)
    assert short <= 1


def test_documents_apart_are_each_closed_by_sep_and_keep_every_token(imdb_corpus, vocab_dir, vocab, corpus_ids,
                                                                      tmp_path):
    """With --documents apart, a [SEP] follows each document's last piece, and each sample ends with
    [SEP] (its document's, or one closing a document cut there); no other [SEP] and no token lost."""
    out = run_text(tmp_path, imdb_corpus, vocab_dir, "--documents", "apart")
    samples = samples_in_order(out)
    check_framing(samples, vocab)
    assert read_shard(out / f"train_imdb_{SEQ_LEN}_123.msgpack.gz").documents == "apart"
    pieces_before_sep, sample_ends, position = set(), set(), 0
    for sample in samples:
        body = sample[1:]
        is_sep = body == vocab.sep_id
        pieces_before_sep.update((position + np.cumsum(~is_sep)[is_sep]).tolist())
        position += int((~is_sep).sum())
        sample_ends.add(position)
    lines = imdb_corpus.read_text(encoding="utf-8").splitlines()
    document_ends = set(np.cumsum([len(ids) for ids in vocab.encode(lines) if ids]).tolist())
    assert pieces_before_sep == document_ends | sample_ends
    assert len(document_ends - sample_ends) > len(document_ends) / 2  # most documents end inside a sample
    joined = np.concatenate([sample[1:][sample[1:] != vocab.sep_id] for sample in samples])
    assert np.array_equal(joined, corpus_ids)


def test_documents_apart_and_sentence_pairs_are_one_line(imdb_corpus, vocab_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_text(tmp_path / "out", imdb_corpus, vocab_dir, "--documents", "apart", "--pairs", "nsp")
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == ("error: --documents apart packs documents into samples; --pairs nsp "
                                               "makes sentence pairs of them: leave one out")
    assert not (tmp_path / "out").exists()


def test_long_words_are_cut_and_counted(tmp_path, vocab, vocab_dir, capsys):
    # WordPiece makes words over 100 characters [UNK], so only short samples can cut a word.
    corpus = tmp_path / "long.txt"
    long_word = "zqxj" * 20  # 80 single-letter pieces
    lines = ["a short line", f"{long_word} ends here", "the end", "x" * 101]
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    prepare_mlm_dataset.main(["-i", str(corpus), "-l", "long", "-o", str(tmp_path), "-m", "16", "-v", str(vocab_dir)])
    assert "1 words longer than 14 pieces cut, 1 [UNK] pieces" in capsys.readouterr().out
    samples = samples_in_order(tmp_path, label="long", seq_len=16)
    assert np.concatenate([sample[1:-1] for sample in samples]).tolist() == sum(vocab.encode(lines), [])
    assert [len(sample) - 2 for sample in samples] == [3, 14, 14, 14, 14, 14, 10 + 3 + 1, 1 + 1]


def test_splits_are_about_80_10_10(text_out, fixed_out):
    for out in (text_out, fixed_out):
        counts = np.array([read_shard(out / f"{split}_imdb_{SEQ_LEN}_123.msgpack.gz").header["samples"]
                           for split in SPLITS])
        assert np.allclose(counts / counts.sum(), [0.8, 0.1, 0.1], atol=0.025)


def test_same_seed_and_any_chunk_size_give_identical_files(text_out, imdb_corpus, vocab_dir, tmp_path):
    again = run_text(tmp_path / "small_chunks", imdb_corpus, vocab_dir, "--chunk-mb", "0.01")
    assert shard_files(again) == shard_files(text_out)
    for name in shard_files(text_out):
        assert (again / name).read_bytes() == (text_out / name).read_bytes()


def test_other_seed_gives_other_split(fixed_out, id_stream, vocab_dir, tmp_path):
    other = run_fixed_len(tmp_path / "seed7", id_stream, vocab_dir, "-s", "7")
    assert shard_files(other) == [f"{split}_imdb_{SEQ_LEN}_7.msgpack.gz" for split in ("test", "train", "val")]
    first = read_shard(fixed_out / f"train_imdb_{SEQ_LEN}_123.msgpack.gz")
    second = read_shard(other / f"train_imdb_{SEQ_LEN}_7.msgpack.gz")
    assert len(first) != len(second) or not np.array_equal(first.tokens, second.tokens)


def test_static_masking_statistics(static_out, vocab):
    shard = read_shard(static_out / f"train_imdb_{SEQ_LEN}_123_0.msgpack.gz")
    original = shard.unmasked_tokens()
    maskable = (~np.isin(original, vocab.special_ids)).sum()
    assert abs(len(shard.mask_labels) / maskable - 0.15) < 0.01
    inputs = shard.tokens[shard.mask_flat_positions()]
    as_mask = (inputs == vocab.mask_id).mean()
    unchanged = (inputs == shard.mask_labels).mean()
    assert abs(as_mask - 0.8) < 0.03 and abs(unchanged - 0.1) < 0.03 and abs(1 - as_mask - unchanged - 0.1) < 0.03


def test_copies_mask_the_same_samples_differently(static_out, fixed_out):
    assert shard_files(static_out) == [f"{name}_imdb_{SEQ_LEN}_123{suffix}.msgpack.gz" for name, suffix in
                                       [("test", ""), ("train", "_0"), ("train", "_1"), ("val", "")]]
    copies = [read_shard(static_out / f"train_imdb_{SEQ_LEN}_123_{k}.msgpack.gz") for k in (0, 1)]
    plain = read_shard(fixed_out / f"train_imdb_{SEQ_LEN}_123.msgpack.gz")
    assert copies[0].header["copy"] == 0 and copies[1].header["copy"] == 1
    assert np.array_equal(copies[0].unmasked_tokens(), plain.tokens)
    assert np.array_equal(copies[1].unmasked_tokens(), plain.tokens)
    assert not np.array_equal(copies[0].tokens, copies[1].tokens)
    val = read_shard(static_out / f"val_imdb_{SEQ_LEN}_123.msgpack.gz")
    assert val.masking == "static" and val.header["copy"] is None


WHOLE_WORD_OPTIONS = ("--masking", "static", "--whole-word-masking", "--mask-rate", "0.3",
                      "--mask-replace-mask", "0.5", "--mask-replace-random", "0.5")


@pytest.mark.parametrize("run", [run_text, run_fixed_len], ids=["text", "fixed_len"])
def test_static_whole_word_masks_are_stored_and_recorded(run, imdb_corpus, id_stream, vocab_dir, vocab, tmp_path):
    source = imdb_corpus if run is run_text else id_stream
    shard = read_shard(run(tmp_path, source, vocab_dir, *WHOLE_WORD_OPTIONS) / f"train_imdb_{SEQ_LEN}_123.msgpack.gz")
    assert (shard.header["whole_word_masking"], shard.header["mask_rate"], shard.header["mask_replace_mask"],
            shard.header["mask_replace_random"]) == (True, 0.3, 0.5, 0.5)
    original = shard.unmasked_tokens().astype(np.int64)
    masked = np.zeros(len(original), dtype=bool)
    masked[shard.mask_flat_positions()] = True
    maskable = ~np.isin(original, vocab.special_ids)
    same_word_as_next = maskable[:-1] & maskable[1:] & vocab.is_continuation[original[1:]]
    assert same_word_as_next.sum() > 10_000
    assert np.array_equal(masked[:-1][same_word_as_next], masked[1:][same_word_as_next])  # no word split
    assert abs(masked.sum() / maskable.sum() - 0.3) < 0.01
    inputs = shard.tokens[shard.mask_flat_positions()]
    assert abs((inputs == vocab.mask_id).mean() - 0.5) < 0.03
    assert (inputs == shard.mask_labels).mean() < 0.01  # random draws rarely hit the original


def bad_text_runs(tmp_path, corpus, vocab_dir):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    base = {"-i": str(corpus), "-l": "imdb", "-m": "128", "-v": str(vocab_dir)}
    return [({"-i": str(tmp_path / "missing.txt")}, "missing.txt: input file not found"),
            ({"-i": str(empty)}, "empty.txt: input file is empty"),
            ({"-v": str(tmp_path / "novocab")}, "novocab: cannot read vocabulary"),
            ({"-m": "4"}, "-m 4: expected a sequence length in [8, 2048]"),
            ({"-m": "4096"}, "-m 4096"),
            ({"-l": "im_db"}, "--label 'im_db'"),
            ({"-l": "im-db"}, "--label 'im-db'"),
            ({"-o": str(blocker / "sub")}, "a_file/sub: cannot create or write the output directory"),
            ({"--copies": "2"}, "--copies 2 needs --masking static"),
            ({"--mask-rate": "0.3"}, "--mask-rate needs --masking static"),
            ({"--masking": "static", "--mask-rate": "1.5"}, "--mask-rate 1.5: expected a number in (0, 1)"),
            ({"--masking": "static", "--mask-replace-random": "-1"}, "--mask-replace-random -1.0: expected"),
            ({"--masking": "static", "--mask-replace-mask": "0.9", "--mask-replace-random": "0.2"},
             "mask-replace-mask = 0.9 plus mask-replace-random = 0.2 exceed 1"),
            ({"--chunk-mb": "0"}, "--chunk-mb 0"),
            ({"--part": "4/3"}, "--part 4/3: expected K/N, part K of N with 1 <= K <= N"),
            ({"--part": "0/3"}, "--part 0/3"),
            ({"--val-share": "0.6", "--test-share": "0.4"}, "--val-share 0.6 plus --test-share 0.4 leave nothing"),
            ({"--val-share": "-0.1"}, "--val-share -0.1: expected a share in [0, 1)"),
            ({"--shard-tokens": "10"}, "--shard-tokens 10: expected at least the sequence length 128"),
            ({"-n": "0"}, "-n 0: expected at least 1 process")], base


def run_and_expect_error(main, args: dict, capsys) -> str:
    argv = [item for pair in args.items() for item in pair]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_bad_text_inputs_exit_2_with_one_line(tmp_path, imdb_corpus, vocab_dir, capsys):
    cases, base = bad_text_runs(tmp_path, imdb_corpus, vocab_dir)
    for change, message in cases:
        out = tmp_path / "out"
        err = run_and_expect_error(prepare_mlm_dataset.main, {**base, "-o": str(out), **change}, capsys)
        assert err.count("\n") == 1 and err.startswith("error: ") and message in err, (change, err)
        assert not out.exists() or list(out.iterdir()) == []


def test_bad_id_inputs_exit_2_and_leave_no_shard(tmp_path, id_stream, vocab_dir, vocab, capsys):
    other_vocab = tmp_path / "other_vocab.txt"
    tokens = list(vocab.tokens)
    tokens[10], tokens[11] = tokens[11], tokens[10]
    other_vocab.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    truncated = tmp_path / "truncated.msgpack.gz"
    whole = id_stream.read_bytes()
    truncated.write_bytes(whole[:len(whole) * 3 // 4])
    base = {"-i": str(id_stream), "-l": "imdb", "-m": "128", "-v": str(vocab_dir)}
    cases = [({"-v": str(other_vocab)}, f"{id_stream}: made with vocabulary checksum {vocab.checksum}"),
             ({"-i": str(tmp_path / "none.msgpack.gz")}, "none.msgpack.gz: input file not found"),
             ({"--copies": "3"}, "--copies 3 needs --masking static"),
             ({"-i": str(truncated)}, f"{truncated}: truncated or corrupt")]
    for change, message in cases:
        out = tmp_path / "out"
        err = run_and_expect_error(prepare_fixed_len.main, {**base, "-o": str(out), **change}, capsys)
        last_line = err.strip().splitlines()[-1]  # a failure midway follows the progress bar
        assert last_line.startswith("error: ") and message in last_line, (change, err)
        assert not out.exists() or list(out.iterdir()) == []


@pytest.mark.parametrize("full_at", ["the first writes", "the last write"])
def test_a_full_disk_is_one_line_and_leaves_no_file(tmp_path, imdb_corpus, vocab_dir, capsys, monkeypatch, full_at):
    import gzip
    original, writes = gzip.GzipFile.write, []

    def counted_write(self, data):
        writes.append(len(data))
        if len(writes) > room:
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(self, data)

    monkeypatch.setattr(gzip.GzipFile, "write", counted_write)
    room = 10 ** 9
    run_text(tmp_path / "whole", imdb_corpus, vocab_dir)
    room, writes[:] = (3 if full_at == "the first writes" else len(writes) - 1), []  # the last: a header
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        run_text(out, imdb_corpus, vocab_dir)
    assert exit_info.value.code == 2
    last_line = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.fullmatch(rf"error: no space left on device writing {re.escape(str(out))}/[\w-]+\.msgpack(\.gz)?",
                        last_line), last_line
    assert not out.exists()  # no temporary file, no split finished before the failure, no directory made for them


def test_a_binary_input_leaves_no_output_directory(tmp_path, vocab_dir, capsys):
    binary = tmp_path / "model.bin"
    binary.write_bytes(bytes(range(256)) * 64)
    out = tmp_path / "new" / "out"
    err = run_and_expect_error(prepare_mlm_dataset.main, {"-i": str(binary), "-l": "imdb", "-m": "128",
                                                          "-v": str(vocab_dir), "-o": str(out)}, capsys)
    assert err.strip().splitlines()[-1].startswith(f"error: {binary}:2: not UTF-8 text"), err
    assert list(tmp_path.iterdir()) == [binary]


def test_temporary_files_of_a_killed_preparation_are_removed_by_the_next(tmp_path, imdb_corpus, vocab_dir):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    out = tmp_path / "out"
    out.mkdir()
    stale = out / f".train_imdb_64_123.msgpack.gz.0123456789ab.body.@{atomic.this_host()}.{dead.stdout.strip()}.tmp"
    stale.write_bytes(b"half a shard")
    run_text(out, imdb_corpus, vocab_dir)
    assert not stale.exists() and not list(out.glob(".*"))
    writer = HeaderFirstFile(out / "x.msgpack.gz")  # its temporary files are named so the next run can tell
    assert writer.body_path.name.endswith(f".{os.getpid()}.tmp")
    writer.abort()


def test_split_is_stateless_and_about_80_10_10():
    codes = assign_splits(123, np.arange(100_000))
    pieces = np.concatenate([assign_splits(123, np.arange(start, start + 999)) for start in range(0, 100_000, 999)])
    assert np.array_equal(codes, pieces[:100_000])
    assert np.allclose(np.bincount(codes) / len(codes), [0.8, 0.1, 0.1], atol=0.01)
    assert (assign_splits(124, np.arange(1000)) != codes[:1000]).mean() > 0.2
