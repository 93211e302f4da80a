"""Tests of src/shards.py: shard round trips, header checks, clear errors on damaged
files, atomic writing, static masks independent of how samples are added."""

from pathlib import Path

import numpy as np
import pytest

from errors import UserError
from masking import MaskingRule
from packed_files import ShardError
from corpus.preparation import StaticMasker
from shards import ShardWriter, find_shards, read_shard
from vocab import SPECIAL_TOKENS, Vocab

SEQ_LEN = 64


@pytest.fixture(scope="module")
def big_vocab(tmp_path_factory):
    """70,000 tokens: ids no longer fit in uint16, so shards store int32."""
    tokens = SPECIAL_TOKENS + tuple(f"t{i}" for i in range(70_000 - len(SPECIAL_TOKENS)))
    return Vocab(path=tmp_path_factory.mktemp("big") / "vocab.txt", tokens=tokens)


def make_samples(ids_per_review, vocab, seq_len=SEQ_LEN) -> list[np.ndarray]:
    """[CLS] piece [SEP] samples of up to seq_len tokens, cut from the reviews one by one."""
    samples = []
    for ids in ids_per_review:
        for start in range(0, len(ids), seq_len - 2):
            samples.append(np.array([vocab.cls_id, *ids[start:start + seq_len - 2], vocab.sep_id]))
    return samples


@pytest.fixture(scope="module")
def imdb_ids(imdb_reviews, vocab) -> list[list[int]]:
    return vocab.encode(imdb_reviews)


@pytest.fixture(scope="module")
def imdb_samples(imdb_ids, vocab):
    return make_samples(imdb_ids, vocab)


@pytest.fixture(scope="module")
def big_vocab_samples(big_vocab):
    rng = np.random.default_rng(0)
    ids = [rng.integers(len(SPECIAL_TOKENS), big_vocab.size, rng.integers(1, 200)) for _ in range(600)]
    return make_samples(ids, big_vocab)


def write_shard(path, vocab, samples, masking="none", seq_len=SEQ_LEN, seed=5):
    masker = StaticMasker(vocab, MaskingRule(), seed, "train") if masking == "static" else None
    with ShardWriter(path, vocab, seq_len=seq_len, split="train", seed=seed, masker=masker,
                     source_files=["imdb.txt"], created_by="test") as writer:
        writer.add(samples)
    return path


def samples_of(shard) -> list[np.ndarray]:
    tokens = shard.unmasked_tokens()
    return [tokens[shard.offsets[i]:shard.offsets[i + 1]] for i in range(len(shard))]


@pytest.mark.parametrize("masking", ["none", "static"])
@pytest.mark.parametrize("which", ["uint16", "int32"])
def test_round_trip_keeps_every_sample(tmp_path, masking, which, vocab, big_vocab, imdb_samples,
                                       big_vocab_samples):
    vocab, samples = (vocab, imdb_samples) if which == "uint16" else (big_vocab, big_vocab_samples)
    shard = read_shard(write_shard(tmp_path / "s.msgpack.gz", vocab, samples, masking))
    assert shard.tokens.dtype == np.dtype(which) and shard.header["dtype"] == which
    assert len(shard) == len(samples) and shard.masking == masking
    assert all(np.array_equal(got, want) for got, want in zip(samples_of(shard), samples))
    if masking == "none":
        assert shard.mask_offsets is None and shard.mask_labels is None
    else:
        assert shard.mask_labels.dtype == np.dtype(which)
        masked = shard.mask_flat_positions()
        original = shard.unmasked_tokens()
        assert np.array_equal(original[masked], shard.mask_labels)
        assert not np.isin(shard.mask_labels, vocab.special_ids).any()  # [CLS]/[SEP] never masked


def test_header_fields(tmp_path, vocab, imdb_samples):
    shard = read_shard(write_shard(tmp_path / "s.msgpack.gz", vocab, imdb_samples, "static"))
    header = shard.header
    assert header["format"] == "bert-mlm-shard" and header["version"] == 1
    assert (header["seq_len"], header["vocab_size"], header["vocab_checksum"]) == (SEQ_LEN, vocab.size,
                                                                                   vocab.checksum)
    assert header["samples"] == len(imdb_samples) > 4096  # several blocks
    assert header["tokens"] == sum(map(len, imdb_samples))
    assert (header["masking"], header["mask_rate"], header["split"], header["seed"]) == ("static", 0.15, "train", 5)
    assert header["copy"] is None and header["source_files"] == ["imdb.txt"] and header["created_by"] == "test"


def test_loaded_plain_shard_costs_little_more_than_two_bytes_per_token(tmp_path, vocab, imdb_ids):
    samples = make_samples(imdb_ids, vocab, seq_len=128)
    shard = read_shard(write_shard(tmp_path / "s.msgpack.gz", vocab, samples, seq_len=128))
    assert shard.resident_bytes() / len(shard.tokens) <= 2.2


def test_static_masking_does_not_depend_on_how_samples_are_added(tmp_path, vocab, imdb_samples):
    imdb_samples = imdb_samples[:5000]  # two blocks
    one_call = read_shard(write_shard(tmp_path / "a.msgpack.gz", vocab, imdb_samples, "static"))
    with ShardWriter(tmp_path / "b.msgpack.gz", vocab, seq_len=SEQ_LEN, split="train", seed=5,
                     masker=StaticMasker(vocab, MaskingRule(), 5, "train"), source_files=["imdb.txt"],
                     created_by="test") as writer:
        for start in range(0, len(imdb_samples), 777):
            writer.add(imdb_samples[start:start + 777])
    assert (tmp_path / "a.msgpack.gz").read_bytes() == (tmp_path / "b.msgpack.gz").read_bytes()
    other_seed = read_shard(write_shard(tmp_path / "c.msgpack.gz", vocab, imdb_samples, "static", seed=6))
    assert not np.array_equal(one_call.mask_positions, other_seed.mask_positions)


@pytest.mark.parametrize("field, wrong", [("seq_len", 128), ("vocab_size", 30522), ("vocab_checksum", "abc")])
def test_header_mismatch_names_file_field_and_both_values(tmp_path, vocab, imdb_samples, field, wrong):
    path = write_shard(tmp_path / "train_x_64_1.msgpack.gz", vocab, imdb_samples[:50])
    expect = {"seq_len": SEQ_LEN, "vocab_size": vocab.size, "vocab_checksum": vocab.checksum, field: wrong}
    with pytest.raises(ShardError) as error:
        read_shard(path, expect)
    actual = {"seq_len": SEQ_LEN, "vocab_size": vocab.size, "vocab_checksum": vocab.checksum}[field]
    name = {"seq_len": "seq-len", "vocab_size": "vocabulary size", "vocab_checksum": "vocabulary checksum"}[field]
    assert str(error.value) == f"{path}: {name} {actual} in the shard but {wrong} in the config"
    read_shard(path, {key: value for key, value in expect.items() if key != field})  # the rest agrees


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_damaged_files_raise_shard_error_naming_the_file(tmp_path, vocab, imdb_samples, damage):
    path = tmp_path / "damaged.msgpack.gz"
    if damage == "truncated":
        whole = write_shard(tmp_path / "whole.msgpack.gz", vocab, imdb_samples).read_bytes()
        path.write_bytes(whole[:len(whole) // 2])
    else:
        path.write_bytes(np.random.default_rng(0).bytes(5000))
    with pytest.raises(ShardError, match=f"^{path}: .*(truncated or corrupt)"):
        read_shard(path)


def test_interrupted_writer_leaves_no_file(tmp_path, vocab, imdb_samples):
    with pytest.raises(RuntimeError):
        with ShardWriter(tmp_path / "s.msgpack.gz", vocab, seq_len=SEQ_LEN, split="train", seed=1) as writer:
            writer.add(imdb_samples)
            raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []


def test_find_shards_matches_gzipped_files_for_a_plain_pattern(tmp_path, vocab, imdb_samples):
    for name in ["train_wiki_128_1.msgpack.gz", "train_wiki_128_2.msgpack", "val_wiki_128_1.msgpack.gz"]:
        (tmp_path / name).write_bytes(b"")
    (tmp_path / ".train_wiki_128_3.msgpack.gz.0123.tmp").write_bytes(b"")  # a writer's temp file
    found = find_shards(tmp_path, "train_wiki_128_*.msgpack")
    assert [path.name for path in found] == ["train_wiki_128_1.msgpack.gz", "train_wiki_128_2.msgpack"]
    with pytest.raises(UserError, match=f"{tmp_path}: no shard file matches test_wiki_\\*"):
        find_shards(tmp_path, "test_wiki_*")


def test_no_matching_shard_names_the_files_there_and_how_to_make_shards(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    here = Path.cwd()
    with pytest.raises(UserError) as raised:
        find_shards(Path("datasets"), "train_*.msgpack")
    assert str(raised.value).startswith(f"{here / 'datasets'}: no shard file matches train_*.msgpack "
                                        f"(no such directory); make shards: python ")
    assert str(raised.value).endswith(f"prepare_mlm_dataset.py -i INPUT -l LABEL -o {here / 'datasets'} -m SEQ_LEN "
                                      f"-v VOCAB_DIR; the pattern must match the names it writes, "
                                      f"train_LABEL_SEQ_LEN_*.msgpack.gz")
    (here / "datasets").mkdir()
    (here / "datasets" / "notes.txt").write_text("not a shard")
    with pytest.raises(UserError, match=r"\(shard files there: none\)"):
        find_shards(Path("datasets"), "train_*.msgpack")
    for name in ["val_wiki_128_1.msgpack.gz", "train_wiki_64_1.msgpack.gz", "test_wiki_128_1.msgpack.gz",
                 "train_wiki_128_1.msgpack", ".train_wiki_128_2.msgpack.gz.0123.tmp"]:
        (here / "datasets" / name).write_bytes(b"")
    with pytest.raises(UserError) as raised:  # the closest names first, three of them
        find_shards(Path("datasets"), "train_weke_128_*.msgpack", "train", 128, "vocab")
    assert ("(shard files there: train_wiki_128_1.msgpack, train_wiki_64_1.msgpack.gz, test_wiki_128_1.msgpack.gz "
            "and 1 more); make shards: ") in str(raised.value)
    assert str(raised.value).endswith(f"-o {here / 'datasets'} -m 128 -v {here / 'vocab'}; the pattern must match "
                                      f"the names it writes, train_LABEL_128_*.msgpack.gz")
