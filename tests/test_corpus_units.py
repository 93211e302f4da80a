"""src/corpus/corpus_units.py: the corpus cut into units of about --shard-tokens, each its numbered shards;
the same files for any worker count, resumed after a failure, or made in parts on several machines."""
import os
import re
import shutil

import numpy as np
import pytest

from conftest import ids_of_lines
from corpus.corpus_units import Part, document_pieces, id_pieces, parse_part, with_lookahead
from errors import UserError
from corpus.preparation import SPLITS, assign_splits
from shards import read_shard
from test_preparation import SEQ_LEN, run_fixed_len, run_text, shard_files


def test_a_part_is_k_of_n_and_holds_every_nth_unit():
    assert parse_part(" 3/8 ") == Part(2, 8)
    assert [unit for unit in range(20) if Part(2, 8).holds(unit)] == [2, 10, 18]
    for text in ("0/8", "9/8", "3", "a/b", "3/8/1"):
        with pytest.raises(UserError, match="--part"):
            parse_part(text)


def test_lookahead_flags_only_the_last_item():
    assert list(with_lookahead("abc")) == [("a", False), ("b", False), ("c", True)]
    assert list(with_lookahead([])) == []


def test_a_unit_ends_with_the_document_that_brings_it_to_its_size_whatever_the_batches():
    documents = ["x" * size for size in (3, 4, 2, 9, 1, 1, 5, 2)]
    def units(batch_size):
        batches = [documents[start:start + batch_size] for start in range(0, len(documents), batch_size)]
        found = {}
        for piece in document_pieces(batches, unit_chars=7):
            found.setdefault(piece.unit, []).extend(piece.payload)
        return found, piece.last
    for batch_size in (1, 3, 8):
        found, last = units(batch_size)
        assert [list(map(len, unit)) for unit in found.values()] == [[3, 4], [2, 9], [1, 1, 5], [2]]
        assert last


def test_ids_are_cut_into_units_of_exactly_that_many():
    blocks = [np.arange(start, start + 7) for start in range(0, 35, 7)]
    pieces = list(id_pieces(blocks, unit_ids=10))
    units = {}
    for piece in pieces:
        units.setdefault(piece.unit, []).extend(piece.payload.tolist())
    assert [len(ids) for ids in units.values()] == [10, 10, 10, 5]
    assert sum(units.values(), []) == list(range(35))
    assert sum(piece.ends for piece in pieces) == 4 and pieces[-1].last


SHARD_TOKENS = "10000"  # ~20 units of the 500 reviews below


@pytest.fixture(scope="module")
def small_corpus(imdb_corpus, tmp_path_factory):
    path = tmp_path_factory.mktemp("small") / "reviews.txt"
    path.write_text("\n".join(imdb_corpus.read_text(encoding="utf-8").splitlines()[:500]) + "\n", encoding="utf-8")
    return path


def run_units(out, corpus, vocab_dir, *extra):
    return run_text(out, corpus, vocab_dir, "--shard-tokens", SHARD_TOKENS, *extra)


@pytest.fixture(scope="module")
def units_out(small_corpus, vocab_dir, tmp_path_factory):
    return run_units(tmp_path_factory.mktemp("units"), small_corpus, vocab_dir, "-n", "1")


def file_bytes(out) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(out.glob("*.msgpack.gz"))}


def test_a_corpus_of_many_units_gets_numbered_shards_of_about_shard_tokens(units_out, small_corpus, vocab):
    names = shard_files(units_out)
    count = len(names) // 3
    assert count >= 10 and names == sorted(f"{split}_imdb_{SEQ_LEN}_123-{unit:05d}.msgpack.gz"
                                            for split in SPLITS for unit in range(count))
    headers = [read_shard(units_out / f"train_imdb_{SEQ_LEN}_123-{unit:05d}.msgpack.gz").header
               for unit in range(count)]
    assert [header["shard"] for header in headers] == list(range(count))
    assert [header["last_shard"] for header in headers] == [False] * (count - 1) + [True]
    assert len({header["preparation"] for header in headers}) == 1
    units = [sum(read_shard(units_out / f"{split}_imdb_{SEQ_LEN}_123-{unit:05d}.msgpack.gz").header["tokens"]
                 for split in SPLITS) for unit in range(count)]
    assert all(5_000 < tokens < 20_000 for tokens in units[:-1]), units
    samples = [sample for unit in range(count) for sample in samples_in_unit(units_out, unit)]
    ids = ids_of_lines(small_corpus, vocab)
    assert np.array_equal(np.concatenate([sample[1:-1] for sample in samples]), ids)  # every token, in order


def samples_in_unit(out, unit: int) -> list[np.ndarray]:
    """One unit's samples back in the order the preparer made them."""
    shards = {split: read_shard(out / f"{split}_imdb_{SEQ_LEN}_123-{unit:05d}.msgpack.gz") for split in SPLITS}
    total = sum(len(shard) for shard in shards.values())
    codes = assign_splits(123, (unit << 40) + np.arange(total, dtype=np.uint64))
    taken = [0, 0, 0]
    samples = []
    for code in codes:
        samples.append(shards[SPLITS[code]].sample(taken[code]))
        taken[code] += 1
    return samples


def test_shards_are_the_same_bytes_for_any_workers_and_chunk_size(units_out, small_corpus, vocab_dir, tmp_path):
    for options in (["-n", "2"], ["-n", "2", "--chunk-mb", "0.01"], ["-n", "1", "--chunk-mb", "0.003"]):
        again = run_units(tmp_path / "_".join(options), small_corpus, vocab_dir, *options)
        assert file_bytes(again) == file_bytes(units_out), options


def test_a_rerun_after_a_failure_makes_only_the_missing_units(units_out, small_corpus, vocab_dir, tmp_path,
                                                              monkeypatch, capsys):
    from corpus import preparation
    original = preparation.SplitWriter.add

    def failing_add(self, samples):
        if self.unit == 4:  # the fifth unit fails while being written
            raise RuntimeError("killed")
        return original(self, samples)

    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        patch.setattr(preparation.SplitWriter, "add", failing_add)
        with pytest.raises(RuntimeError, match="killed"):
            run_units(out, small_corpus, vocab_dir, "-n", "2")
    assert len(shard_files(out)) == 4 * 3 and not list(out.glob(".*"))  # four whole units, no temporary file
    kept = {path: path.stat().st_mtime_ns for path in out.iterdir()}
    capsys.readouterr()
    run_units(out, small_corpus, vocab_dir, "-n", "2")
    assert "kept the shards of 4 unit(s) an earlier run of this preparation finished" in capsys.readouterr().out
    assert all(path.stat().st_mtime_ns == when for path, when in kept.items())  # not made again
    assert file_bytes(out) == file_bytes(units_out)


def test_a_cut_shard_is_made_again(units_out, small_corpus, vocab_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for name, data in file_bytes(units_out).items():
        (out / name).write_bytes(data[:len(data) // 2] if name.startswith("val") and "-00002" in name else data)
    run_units(out, small_corpus, vocab_dir, "-n", "1")
    assert file_bytes(out) == file_bytes(units_out)


def test_an_input_edited_in_place_at_the_same_size_is_prepared_again(small_corpus, vocab_dir, tmp_path, capsys):
    corpus = tmp_path / "reviews.txt"
    text = small_corpus.read_text(encoding="utf-8")
    corpus.write_text(text, encoding="utf-8")
    out = run_units(tmp_path / "out", corpus, vocab_dir, "-n", "1")
    # The same size and the same number of tokens (so units of the same size), other tokens.
    corpus.write_text(re.sub(r"\bthe\b", "and", text), encoding="utf-8")
    capsys.readouterr()
    run_units(out, corpus, vocab_dir, "-n", "1")
    assert "kept the shards" not in capsys.readouterr().out
    assert file_bytes(out) == file_bytes(run_units(tmp_path / "fresh", corpus, vocab_dir, "-n", "1"))


def test_a_touched_input_or_a_copy_elsewhere_is_the_same_preparation(units_out, small_corpus, vocab_dir, tmp_path,
                                                                     capsys):
    """Machines with their own copies (scp, gsutil cp: new paths and times) make the parts of one preparation."""
    first, second = tmp_path / "first" / "reviews.txt", tmp_path / "second" / "corpus.txt"
    for copy in (first, second):
        copy.parent.mkdir()
        shutil.copyfile(small_corpus, copy)
    os.utime(second, ns=(1, 1))
    out = run_units(tmp_path / "parts", first, vocab_dir, "-n", "1", "--part", "1/2")
    run_units(out, second, vocab_dir, "-n", "1", "--part", "2/2")
    assert shard_files(out) == shard_files(units_out)
    assert {preparation_of(path) for path in out.iterdir()} == {preparation_of(path) for path in units_out.iterdir()}
    os.utime(first)
    capsys.readouterr()
    run_units(out, first, vocab_dir, "-n", "1")
    assert f"kept the shards of {len(shard_files(out)) // 3} unit(s)" in capsys.readouterr().out


def preparation_of(path) -> str:
    return read_shard(path).header["preparation"]


def test_parts_together_write_the_files_of_one_run(units_out, small_corpus, vocab_dir, tmp_path, capsys):
    out = tmp_path / "parts"
    for part in ("2/3", "1/3", "3/3"):
        run_units(out, small_corpus, vocab_dir, "-n", "1", "--part", part)
        if part == "2/3":
            assert shard_files(out) == [name for name in shard_files(units_out) if int(name[-16:-11]) % 3 == 1]
    assert file_bytes(out) == file_bytes(units_out)
    run_units(tmp_path / "many", small_corpus, vocab_dir, "-n", "1", "--part", "99/99")
    assert "part 99/99 has no unit to make: the corpus has" in capsys.readouterr().out


def test_shares_set_the_split(small_corpus, vocab_dir, tmp_path):
    out = run_text(tmp_path, small_corpus, vocab_dir, "--val-share", "0.3", "--test-share", "0")
    counts = {split: read_shard(path).header["samples"] for split in SPLITS
              for path in out.glob(f"{split}_*.msgpack.gz")}
    assert set(counts) == {"train", "val"} and abs(counts["val"] / sum(counts.values()) - 0.3) < 0.05


def test_ids_cut_into_units_of_whole_pieces_keep_one_short_sample(id_stream, corpus_ids, vocab_dir, tmp_path):
    out = run_fixed_len(tmp_path, id_stream, vocab_dir, "--shard-tokens", "50000")
    count = len(shard_files(out)) // 3
    samples = [sample for unit in range(count) for sample in samples_in_unit(out, unit)]
    assert count > 5 and all(len(sample) == SEQ_LEN for sample in samples[:-1])
    assert np.array_equal(np.concatenate([sample[1:-1] for sample in samples]), corpus_ids)
