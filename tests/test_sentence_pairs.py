"""Sentence pairs for NSP and SOP on the IMDB fixture corpus: how pairs are built (50/50 labels,
random B from other documents of the same split, B continuing A), the shards that hold them,
segment ids, and MLM + NSP training end to end."""
import gzip
import math

import msgpack
import numpy as np
import pytest

import fill_mask
import main
import make_demo
import prepare_mlm_dataset
import hardware
from conftest import MLM_SEQ_LEN, make_mlm_workdir, prepare_mlm_base_dir
from tasks.lm_data import make_batch
from packed_files import ShardError
from corpus.preparation import SPLITS, assign_splits
from corpus.sentence_pairs import PairMaker, pair_sample, truncate_pair
from shards import read_shard
from corpus.tokenizing import encode_documents
from test_trainer import load, scalars

SEQ_LEN = 128
SEED = 123


@pytest.fixture(scope="module")
def documents(imdb_corpus, vocab) -> list[list[np.ndarray]]:
    lines = [line for line in imdb_corpus.read_text(encoding="utf-8").split("\n") if line.strip()]
    return encode_documents(vocab, lines)


class Placed:
    """The corpus's documents with each piece replaced by its position in the corpus, so that a
    pair tells which document and sentence each of its pieces came from."""

    def __init__(self, documents):
        lengths = [len(sentence) for sentences in documents for sentence in sentences]
        starts = np.cumsum([0] + lengths)
        self.sentence_start = np.zeros(starts[-1] + 1, dtype=bool)  # one past the end: a start too
        self.sentence_start[starts] = True
        document_lengths = [sum(len(sentence) for sentence in sentences) for sentences in documents]
        self.document_of = np.repeat(np.arange(len(documents)), document_lengths)
        sentence_ranges = iter(zip(starts[:-1], starts[1:]))
        self.documents = [[np.arange(*next(sentence_ranges)) for _ in sentences] for sentences in documents]


@pytest.fixture(scope="module")
def placed(documents):
    return Placed(documents)


def make_pairs(documents, objective, max_pieces=SEQ_LEN - 3, window=1000, chunk=300):
    """All (split code, pair) of the documents, fed to a PairMaker in chunks."""
    maker = PairMaker(objective, max_pieces, SEED, window)
    made = []
    for start in range(0, len(documents), chunk):
        made += maker.add(documents[start:start + chunk])
    return made + maker.finish()


def assert_about_half(labels):
    n = len(labels)
    assert n > 2000 and abs(np.mean(labels) - 0.5) < 4 * 0.5 / math.sqrt(n), (n, np.mean(labels))


def is_run(pieces):
    return len(pieces) > 0 and (np.diff(pieces) == 1).all()


def test_truncation_takes_from_the_longer_side_first():
    rng = np.random.default_rng(0)
    first, second = truncate_pair(np.arange(100), np.arange(100, 120), 50, rng)
    assert (len(first), len(second)) == (30, 20) and is_run(first) and is_run(second)
    first, second = truncate_pair(np.arange(40), np.arange(40, 80), 51, rng)
    assert (len(first), len(second)) == (26, 25)
    assert [len(side) for side in truncate_pair(np.arange(3), np.arange(4), 50, rng)] == [3, 4]


def test_nsp_pairs_are_half_random_and_random_ones_come_from_other_documents(placed):
    made = make_pairs(placed.documents, "nsp")
    assert_about_half([pair.label for _, pair in made])
    for _, pair in made:
        assert is_run(pair.first) and is_run(pair.second) and len(pair.first) + len(pair.second) <= SEQ_LEN - 3
        assert (placed.document_of[pair.first] == pair.document).all()
        assert (placed.document_of[pair.second] == pair.second_document).all()
        assert (pair.second_document != pair.document) == (pair.label == 1)
        if pair.label == 0:  # B follows A in the document, from a sentence boundary between them on
            gap = np.arange(pair.first[-1] + 1, pair.second[0] + 1)
            assert placed.sentence_start[gap].any()


def test_without_truncation_b_is_exactly_the_next_sentences(placed):
    made = make_pairs(placed.documents, "nsp", max_pieces=10**6)
    starts = placed.sentence_start
    for _, pair in made:
        assert starts[pair.first[0]] and starts[pair.second[0]] and starts[pair.first[-1] + 1]
        if pair.label == 0:
            assert pair.second[0] == pair.first[-1] + 1 and starts[pair.second[-1] + 1]


def test_sop_pairs_are_half_swapped_and_both_halves_from_one_document(placed):
    made = make_pairs(placed.documents, "sop")
    assert_about_half([pair.label for _, pair in made])
    for _, pair in made:
        assert pair.second_document == pair.document
        assert (placed.document_of[np.concatenate([pair.first, pair.second])] == pair.document).all()
        assert (pair.second[0] < pair.first[0]) == (pair.label == 1)  # swapped: B came first
    unswapped = make_pairs(placed.documents, "sop", max_pieces=10**6)
    for _, pair in unswapped:
        before, after = (pair.second, pair.first) if pair.label else (pair.first, pair.second)
        assert after[0] == before[-1] + 1


def test_documents_never_cross_splits_and_chunking_changes_nothing(placed):
    made = make_pairs(placed.documents, "nsp", window=50)
    codes = np.array([code for code, _ in made])
    for column in ("document", "second_document"):
        documents = np.array([getattr(pair, column) for _, pair in made])
        assert np.array_equal(assign_splits(SEED, documents), codes)
    assert len(set(codes.tolist())) == 3
    again = make_pairs(placed.documents, "nsp", window=50, chunk=7)
    assert [(code, pair.document, pair.first.tolist(), pair.second.tolist()) for code, pair in again] == \
        [(code, pair.document, pair.first.tolist(), pair.second.tolist()) for code, pair in made]


def test_a_document_alone_in_its_split_gives_no_nsp_pairs():
    maker = PairMaker("nsp", 20, SEED)
    sentences = [np.arange(5), np.arange(5, 12)]
    assert maker.add([sentences]) == [] and maker.finish() == [] and maker.lonely_documents == 1


# ----------------------------------------------------------------------------- shards


def prepare(out, corpus, vocab_dir, *extra):
    prepare_mlm_dataset.main(["-i", str(corpus), "-l", "imdb", "-o", str(out), "-m", str(SEQ_LEN),
                              "-v", str(vocab_dir), "-s", str(SEED), *extra])
    return out


def shard_path(out, split):
    return out / f"{split}_imdb_{SEQ_LEN}_{SEED}.msgpack.gz"


@pytest.fixture(scope="module")
def nsp_out(imdb_corpus, vocab_dir, tmp_path_factory):
    return prepare(tmp_path_factory.mktemp("nsp"), imdb_corpus, vocab_dir, "--pairs", "nsp")


def test_shards_hold_the_pairs_as_cls_a_sep_b_sep(nsp_out, documents, vocab):
    made = make_pairs(documents, "nsp")
    for code, split in enumerate(SPLITS):
        shard = read_shard(shard_path(nsp_out, split))
        pairs = [pair for pair_code, pair in made if pair_code == code]
        assert shard.pairs == "nsp" and shard.header["pairs"] == "nsp" and len(shard) == len(pairs)
        assert shard.pair_labels.tolist() == [pair.label for pair in pairs]
        for index in range(len(shard)):
            sample = shard.sample(index)
            assert np.array_equal(sample, pair_sample(pairs[index], vocab.cls_id, vocab.sep_id))
            assert len(sample) <= SEQ_LEN and sample[0] == vocab.cls_id and sample[-1] == vocab.sep_id
            assert (sample == vocab.sep_id).sum() == 2 and (sample == vocab.cls_id).sum() == 1


def test_same_seed_gives_identical_files_whatever_the_chunk_size(nsp_out, imdb_corpus, vocab_dir, tmp_path):
    again = prepare(tmp_path / "again", imdb_corpus, vocab_dir, "--pairs", "nsp", "--chunk-mb", "0.05")
    for split in SPLITS:
        assert shard_path(again, split).read_bytes() == shard_path(nsp_out, split).read_bytes()


def expected_segments(sample_ids, width):
    first_sep = int(np.flatnonzero(sample_ids == 3)[0])
    return [0] * (first_sep + 1) + [1] * (len(sample_ids) - first_sep - 1) + [0] * (width - len(sample_ids))


def test_batches_carry_segment_ids_from_the_first_sep_and_pair_labels(nsp_out, vocab):
    assert vocab.sep_id == 3
    shard = read_shard(shard_path(nsp_out, "val"))
    rows = np.arange(40)
    batch = make_batch(shard, rows, SEQ_LEN, vocab.pad_id, vocab.sep_id, 0.15)
    assert batch["sentence_labels"].tolist() == shard.pair_labels[rows].tolist()
    for row in rows:
        assert batch["segment_ids"][row].tolist() == expected_segments(shard.sample(row), SEQ_LEN)


def test_static_masks_work_with_pairs(imdb_corpus, vocab_dir, vocab, tmp_path):
    out = prepare(tmp_path, imdb_corpus, vocab_dir, "--pairs", "sop", "--masking", "static")
    shard = read_shard(shard_path(out, "train"))
    assert shard.masking == "static" and shard.pairs == "sop"
    assert abs(shard.pair_labels.mean() - 0.5) < 0.03
    original = shard.unmasked_tokens()
    assert not np.isin(shard.mask_labels, vocab.special_ids).any()  # [CLS] and both [SEP] stay
    rows = np.arange(len(shard))
    batch = make_batch(shard, rows, SEQ_LEN, vocab.pad_id, vocab.sep_id, 0.15)
    for row in rows[:300]:
        sample = original[shard.offsets[row]:shard.offsets[row + 1]]
        assert batch["segment_ids"][row].tolist() == expected_segments(sample, SEQ_LEN)


def rewrite_shard(source, target, change):
    """The shard's objects, changed by change(header, blocks), written back as a gzip stream."""
    with gzip.open(source, "rb") as stream:
        header, *blocks = list(msgpack.Unpacker(stream, raw=False))
    change(header, blocks)
    with gzip.open(target, "wb") as out:
        for item in [header, *blocks]:
            out.write(msgpack.packb(item, use_bin_type=True))
    return target


def test_shards_without_a_pairs_field_read_as_plain_and_damaged_labels_are_named(nsp_out, tmp_path):
    source = shard_path(nsp_out, "val")

    def older(header, blocks):
        del header["pairs"]
        for block in blocks:
            del block["pair_labels"]
    old = read_shard(rewrite_shard(source, tmp_path / "old.msgpack.gz", older))
    assert old.pairs == "none" and old.pair_labels is None and len(old) == len(read_shard(source))

    def short_labels(header, blocks):
        blocks[0]["pair_labels"] = blocks[0]["pair_labels"][:-1]
    for change, detail in ((short_labels, "not one pair label per sample"),
                           (lambda header, blocks: header.update(pairs="nxt"), "pairs 'nxt'")):
        damaged = rewrite_shard(source, tmp_path / "damaged.msgpack.gz", change)
        with pytest.raises(ShardError, match=f"{damaged}: truncated or corrupt file .*{detail}"):
            read_shard(damaged)


# ----------------------------------------------------------------------------- training


@pytest.fixture(scope="module")
def nsp_base_dir(imdb_corpus, vocab_dir, rotten_tomatoes, tmp_path_factory):
    """vocab/, NSP pair shards of 64 tokens and SST-2 for fine-tuning."""
    base = prepare_mlm_base_dir(tmp_path_factory.mktemp("nsp_base"), imdb_corpus, vocab_dir, "--pairs", "nsp")
    make_demo.write_sst2(base / "datasets", rotten_tomatoes, seed=123)
    return base


@pytest.fixture
def nsp_workdir(nsp_base_dir, tmp_path, monkeypatch, keep_signal_handlers):
    monkeypatch.setattr(hardware, "measure_matmul_flops", lambda device, dtype: 1e12)
    directory = make_mlm_workdir(nsp_base_dir, tmp_path / "work", sentence_objective="nsp", max_iters=40,
                                 lr_decay_iters=40)
    monkeypatch.chdir(directory)
    return directory


def test_mlm_with_nsp_learns_and_its_checkpoint_fine_tunes_and_fills_masks(nsp_workdir, capsys):
    run_dir = main.run(main.load_config(None, []), None, False)
    values = scalars(run_dir)
    losses = [value for _, value in values["val/loss"]]
    assert len(losses) == 4 and losses[-1] < losses[0] - 0.5, losses
    assert len(values["val/sentence_accuracy"]) == 4 and len(values["val/accuracy"]) == 4
    log = (run_dir / "logs" / "log.txt").read_text()
    assert "val sentence_accuracy" in log and "sentence pair: predicted " in log
    checkpoint_path = run_dir / "checkpoints" / "checkpoint.pt"
    checkpoint = load(checkpoint_path)
    assert checkpoint["model_config"]["sentence_classes"] == 2 and "pooler.weight" in checkpoint["model"]

    sst2 = main.run(main.load_config(None, ["--task-type", "sst2", "--sentence-objective", "none",
                                            "--max-iters", "2"]), checkpoint_path, False)
    log = (sst2 / "logs" / "log.txt").read_text()
    assert "newly initialised: classifier.weight, classifier.bias\n" in log
    assert "not used: head.*, sentence_head.*" in log

    capsys.readouterr()
    fill_mask.main(["--cp", str(checkpoint_path), "the movie was [MASK] ."])
    assert capsys.readouterr().out.splitlines()[1].startswith("  [MASK] 1: ")


def test_pair_shards_train_plain_mlm_and_its_checkpoint_starts_an_nsp_run(nsp_workdir):
    plain = main.run(main.load_config(None, ["--sentence-objective", "none", "--max-iters", "2"]), None, False)
    assert "sentence_accuracy" not in (plain / "logs" / "log.txt").read_text()
    nsp = main.run(main.load_config(None, ["--max-iters", "2"]), plain / "checkpoints" / "checkpoint.pt", False)
    assert nsp != plain
    assert "newly initialised: pooler.weight, pooler.bias, sentence_head.weight, sentence_head.bias" in \
        (nsp / "logs" / "log.txt").read_text()


def test_shards_without_the_objectives_pairs_exit_2_with_one_line(nsp_workdir, mlm_base_dir, capsys):
    cases = [(["--sentence-objective", "sop"], "pairs is nsp in the shard but sentence-objective = sop"),
             (["--sentence-objective", "nsp", "--base-dir", str(mlm_base_dir)],
              "pairs is none in the shard but sentence-objective = nsp (prepare_mlm_dataset.py --pairs nsp)")]
    for overrides, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            main.main(overrides)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.count("\n") == 1 and message in err, err
        assert f"train_imdb_{MLM_SEQ_LEN}_123.msgpack.gz" in err
    assert not (nsp_workdir / "runs").exists()
