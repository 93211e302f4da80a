"""Training over many small numbered shards (src/shard_stream.py, lm_data.ShardSplit): an epoch is
every sample once, for one process or two; resume is exact mid-shard and with another number of
processes; a process holds at most two shards, and of each only its own samples; validation reads
only what it scores; bad sets are one line; the earlier single-shard layout still trains."""
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import hardware
import main
import prepare_mlm_dataset
import shard_stream
from conftest import MLM_SEQ_LEN, write_mlm_config
from errors import UserError
from tasks.lm_data import LanguageModelData
from shards import ShardWriter, read_shard
from vocab import load_vocab

BATCH = 8


@pytest.fixture(scope="module")
def many_shards(imdb_corpus, vocab_dir, tmp_path_factory) -> Path:
    """A base directory whose datasets are ~30 units of 600 reviews: train shards of ~80 samples."""
    base = tmp_path_factory.mktemp("many")
    corpus = base / "reviews.txt"
    corpus.write_text("\n".join(imdb_corpus.read_text(encoding="utf-8").splitlines()[:600]) + "\n", encoding="utf-8")
    shutil.copytree(vocab_dir, base / "vocab")
    prepare_mlm_dataset.main(["-i", str(corpus), "-l", "imdb", "-o", str(base / "datasets"), "-m", str(MLM_SEQ_LEN),
                              "-v", str(base / "vocab"), "--shard-tokens", "6000", "-n", "1"])
    return base


def data(base: Path, rank: int = 0, world_size: int = 1, batch_size: int = BATCH, **settings) -> LanguageModelData:
    config = main.load_config(write_mlm_config(base, batch_size=batch_size, **settings), [])
    return LanguageModelData(config, load_vocab(base / "vocab"), rank, world_size)


def key(row: np.ndarray) -> bytes:
    return row[row != 0].astype(np.int64).tobytes()


def all_train_samples(base: Path) -> Counter:
    samples = Counter()
    for path in (base / "datasets").glob("train_*.msgpack.gz"):
        shard = read_shard(path)
        samples.update(shard.sample(index).astype(np.int64).tobytes() for index in range(len(shard)))
    return samples


def epoch_of(streams, epoch: int = 0) -> list[list[bytes]]:
    """Each stream's samples of one epoch, batch by batch."""
    seen = [[] for _ in streams]
    for index, stream in enumerate(streams):
        for position, batch in stream:
            seen[index] += [key(row) for row in batch["input_ids"]]
            if position["epoch"] > epoch:
                break
    return seen


@pytest.fixture
def in_base(many_shards, monkeypatch):
    monkeypatch.chdir(many_shards)
    return many_shards


def test_an_epoch_is_every_sample_once_for_one_process_or_two(in_base):
    everything = all_train_samples(in_base)
    assert len(list((in_base / "datasets").glob("train_*"))) >= 20
    for world_size in (1, 2):
        streams = [data(in_base, rank, world_size).train_batches(None) for rank in range(world_size)]
        seen = Counter(sample for samples in epoch_of(streams) for sample in samples)
        total = sum(everything.values())
        assert sum(seen.values()) == total - total % (BATCH * world_size)  # full global batches only
        assert not seen - everything  # nothing twice, nothing else
    both = epoch_of([data(in_base).train_batches(None)], epoch=1)[0]
    first, second = both[:len(both) // 2], both[len(both) // 2:]
    assert not Counter(second) - everything and first != second  # the next epoch: the samples reshuffled
    assert len(set(first[:BATCH * 10]) & set(second[:BATCH * 10])) < BATCH * 3  # its shards in another order


def test_resume_is_exact_mid_shard_and_across_epochs(in_base):
    straight = data(in_base).train_batches(None)
    batches = [next(straight) for _ in range(400)]  # past the end of the first epoch (360 batches)
    assert batches[-1][0]["epoch"] == 1
    for stop in (3, 37, batches.index(next(b for b in batches if b[0]["epoch"] == 1)), 370):
        resumed = data(in_base).train_batches(batches[stop][0])
        for position, batch in batches[stop + 1:stop + 20]:
            again_position, again = next(resumed)
            assert again_position == position and np.array_equal(again["input_ids"], batch["input_ids"])


def test_resuming_with_another_number_of_processes_repeats_and_skips_nothing(in_base):
    one = data(in_base, batch_size=2 * BATCH).train_batches(None)
    first = [next(one) for _ in range(5)]
    rest = Counter(key(row) for _, batch in epoch_of_rest(one) for row in batch["input_ids"])
    for batch_size in (BATCH, 2 * BATCH):  # the same global batch, or twice as large
        ranks = [data(in_base, rank, 2, batch_size=batch_size).train_batches(first[-1][0]) for rank in range(2)]
        seen = Counter(sample for samples in epoch_of(ranks) for sample in samples)
        if batch_size == BATCH:
            assert seen == rest
        else:  # a global batch of 32 ends the epoch earlier, with at most one batch of 16 left out
            assert not seen - rest and 0 <= sum(rest.values()) - sum(seen.values()) < 32


def epoch_of_rest(stream):
    for position, batch in stream:
        yield position, batch
        if position["epoch"] > 0:
            return


def test_a_process_holds_at_most_two_shards_loads_each_once_and_of_each_its_own_samples(in_base, monkeypatch):
    held, loaded, loads = [], [], []
    original_get = shard_stream.ShardLoader.get

    def counting_get(self, keys, following=None):
        result = original_get(self, keys, following)
        held.append(len(self.held))
        return result

    monkeypatch.setattr(shard_stream.ShardLoader, "get", counting_get)
    split = data(in_base, 1, 2).split("train")
    original_load = split.load
    monkeypatch.setattr(split, "load", lambda key: loads.append(key) or loaded.append(original_load(key)) or loaded[-1])
    stream = split.batches(None)
    for _ in range(60):
        next(stream)
    assert max(held) == 2 and len(loaded) > 5
    assert len(set(loads)) == len(loads)  # the next shard, loading in the background, is not started again
    for shard, rows in loaded[:-1]:  # the last may be the next one, loading
        assert len(shard) == len(rows) and abs(len(rows) - shard.header["samples"] / 2) <= 1  # every other sample


def test_validation_loads_only_the_samples_it_scores(in_base, monkeypatch):
    val = data(in_base).split("val")
    loaded = []
    original = val.load
    monkeypatch.setattr(val, "load", lambda key: loaded.append(original(key)) or loaded[-1])
    first = [batch["input_ids"] for batch in val.fixed_batches(2)]
    assert len(first) == 2 and sum(len(rows) for _, rows in loaded) == 2 * BATCH
    assert len(loaded) < len(val.plan(0).files)  # not every val shard
    calls = len(loaded)
    again = [batch["input_ids"] for batch in val.fixed_batches(2)]
    assert len(loaded) == calls  # kept, not read again
    assert all(np.array_equal(before, after) for before, after in zip(first, again))


def test_many_shards_train_and_resume_exactly(many_shards, tmp_path, monkeypatch, keep_signal_handlers):
    monkeypatch.setattr(hardware, "measure_matmul_flops", lambda device, dtype: 1e12)
    losses = {}
    for name, stops in (("straight", [30]), ("resumed", [13, 30])):
        work = tmp_path / name
        shutil.copytree(many_shards / "vocab", work / "vocab")
        shutil.copytree(many_shards / "datasets", work / "datasets")
        write_mlm_config(work, batch_size=BATCH, max_iters=30, lr_decay_iters=30, val_interval=13, dropout=0.0)
        monkeypatch.chdir(work)
        for stop in stops:
            main.main(["--max-iters", str(stop)] + (["--cp", "runs/run0/checkpoints/checkpoint.pt"] if stop > 13 and
                                                    name == "resumed" else []))
        checkpoint = torch.load(work / "runs/run0/checkpoints/checkpoint.pt", weights_only=True)
        losses[name] = checkpoint["model"]
        assert checkpoint["data_position"]["epoch"] == 30 * BATCH // sum(all_train_samples(work).values())
    for name, weight in losses["straight"].items():
        assert torch.allclose(weight, losses["resumed"][name], atol=1e-5), name


def mistakes(datasets: Path, corpus: Path, vocab: Path) -> dict:
    """Each a way to spoil a copy of the numbered set, and the line it must give."""
    def other_preparation(directory, seq_len):
        prepare_mlm_dataset.main(["-i", str(corpus), "-l", "imdb", "-o", str(directory), "-m", str(seq_len),
                                  "-v", str(vocab), "-s", "7", "-n", "1"])
        for path in directory.glob(f"*_imdb_{seq_len}_7.msgpack.gz"):  # where the config's pattern finds it
            path.rename(directory / path.name.replace(f"_{seq_len}_7", "_64_7"))

    def cut(path):
        path.write_bytes(path.read_bytes()[:-100])
    name = "train_imdb_64_123-{:05d}.msgpack.gz"
    last = max(int(path.name[-16:-11]) for path in datasets.glob("train_*"))
    return {"two preparations": (lambda d: other_preparation(d, 64), "shards of two preparations matched by one"),
            "another seq-len": (lambda d: other_preparation(d, 32), "seq-len 32 in the shard but 64 in the config"),
            "a shard missing": (lambda d: (d / name.format(5)).unlink(), "shard 5 of this set is missing"),
            "the last missing": (lambda d: (d / name.format(last)).unlink(),
                                 "the set's shards after this one are missing"),
            "a partial shard": (lambda d: cut(d / name.format(3)), "not the size its header says: a partial copy")}


def test_a_bad_set_of_shards_is_one_line(many_shards, tmp_path, monkeypatch, capsys, keep_signal_handlers):
    corpus = tmp_path / "few.txt"
    corpus.write_text("\n".join((many_shards / "reviews.txt").read_text(encoding="utf-8").splitlines()[:40]) + "\n")
    for case, (spoil, message) in mistakes(many_shards / "datasets", corpus, many_shards / "vocab").items():
        work = tmp_path / case.replace(" ", "_")
        shutil.copytree(many_shards / "vocab", work / "vocab")
        shutil.copytree(many_shards / "datasets", work / "datasets")
        spoil(work / "datasets")
        write_mlm_config(work, batch_size=BATCH)
        monkeypatch.chdir(work)
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_info:
            main.main(["--max-iters", "1"])
        errors = capsys.readouterr().err.strip().splitlines()
        assert exit_info.value.code == 2 and len(errors) == 1 and message in errors[0], (case, errors)
        assert not (work / "runs").exists() or not list((work / "runs").iterdir()), case


def test_one_unit_preparations_of_two_seeds_in_one_directory_are_refused(many_shards, vocab_dir, tmp_path,
                                                                         monkeypatch):
    """Each seed splits the corpus its own way: one's val samples are among the other's train samples."""
    corpus = tmp_path / "few.txt"
    corpus.write_text("\n".join((many_shards / "reviews.txt").read_text(encoding="utf-8").splitlines()[:40]) + "\n")
    shutil.copytree(vocab_dir, tmp_path / "vocab")
    for seed in ("1", "2"):
        prepare_mlm_dataset.main(["-i", str(corpus), "-l", "imdb", "-o", str(tmp_path / "datasets"),
                                  "-m", str(MLM_SEQ_LEN), "-v", str(tmp_path / "vocab"), "-s", seed, "-n", "1"])
    monkeypatch.chdir(tmp_path)
    for split in ("train", "val"):
        with pytest.raises(UserError, match=f"{split}_imdb_64_1.msgpack.gz and .*{split}_imdb_64_2.msgpack.gz: "
                                            "shards of two preparations matched by one pattern"):
            data(tmp_path).check((split,))


def test_shards_of_the_earlier_layout_still_train(mlm_base_dir, tmp_path, monkeypatch, keep_signal_handlers):
    """Shards written before numbered sets (no shard number in their headers) train as before."""
    monkeypatch.setattr(hardware, "measure_matmul_flops", lambda device, dtype: 1e12)
    vocab = load_vocab(mlm_base_dir / "vocab")
    shutil.copytree(mlm_base_dir / "vocab", tmp_path / "vocab")
    (tmp_path / "datasets").mkdir()
    for path in (mlm_base_dir / "datasets").glob("*.msgpack.gz"):
        shard = read_shard(path)
        with ShardWriter(tmp_path / "datasets" / path.name, vocab, seq_len=MLM_SEQ_LEN, split=shard.header["split"],
                         seed=123) as writer:
            writer.add([shard.sample(index) for index in range(len(shard))])
        assert read_shard(tmp_path / "datasets" / path.name).header["shard"] is None
    write_mlm_config(tmp_path, max_iters=4, val_interval=2)
    monkeypatch.chdir(tmp_path)
    main.main([])
    assert torch.load(tmp_path / "runs/run0/checkpoints/checkpoint.pt", weights_only=True)["step"] == 4


@pytest.mark.parametrize("total, start, global_batch, world_size",
                         [(1000, 0, 32, 1), (1000, 64, 32, 2), (997, 30, 24, 3)])
def test_a_rank_finds_its_positions_in_a_shard_by_arithmetic(total, start, global_batch, world_size):
    """An epoch's positions are a range (constant memory at any corpus size); those in [low, high) are
    the ones an array of them would give."""
    for rank in range(world_size):
        positions = shard_stream.rank_positions(total, start, global_batch, rank, world_size)
        assert isinstance(positions, range)
        every = shard_stream.as_array(positions)
        for low, high in [(0, 100), (-5, 3), (31, 33), (500, 1200), (990, 1000), (40, 40), (2000, 3000)]:
            expected = every[(every >= low) & (every < high)]
            assert np.array_equal(shard_stream.positions_between(positions, low, high), expected)
