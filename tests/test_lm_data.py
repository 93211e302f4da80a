"""src/tasks/lm_data.py: the language-model tasks' data: each split's file pattern, batches padded to
seq-len, the shards' stored masks against the masking keys, and shards too small for a batch."""
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import main
import prepare_mlm_dataset
from checkpoints import load
from config import Config
from conftest import MLM_SEQ_LEN, TEST_DEVICE
from errors import UserError
from tasks.lm_data import LanguageModelData, document_ids, make_batch, split_pattern
from tasks.mlm_task import MaskedLMTask
from shards import read_shard
from test_mlm_task import QUICK
from vocab import load_vocab


def test_dynamic_masking_of_static_shards_starts_from_the_original_ids(mlm_static_base_dir, mlm_config, tmp_path):
    config = main.load_config(mlm_config(tmp_path, base_dir=mlm_static_base_dir), [])
    task = MaskedLMTask(config, load_vocab(mlm_static_base_dir / "vocab"), torch.device(TEST_DEVICE))
    path = mlm_static_base_dir / "datasets" / "train_imdb_64_123.msgpack.gz"
    shard, rows = task.data.split("train").load((0, 0, 0, None))  # epoch 0's first shard, all this process reads
    assert shard.masking == "none" and np.array_equal(shard.tokens, read_shard(path, rows=rows).unmasked_tokens())
    assert "positions" not in next(task.train_batches(None))[1]  # masked by the trainer, afresh


def test_masking_key_must_match_the_shards(mlm_workdir, mlm_static_whole_word_base_dir, monkeypatch, capsys,
                                           skip_flops_measurement, tmp_path):
    static_dir = tmp_path / "static"
    for name in ("vocab", "datasets"):
        shutil.copytree(mlm_static_whole_word_base_dir / name, static_dir / name)
    # The validation split is checked first, before the run directory is made.
    cases = [(mlm_workdir, ["--masking", "static"],
              f"{Path('datasets') / 'val_imdb_64_123.msgpack.gz'}: the shard holds no masks but the config has "
              "masking = static"),
             (static_dir, ["--masking", "static", "--mask-rate", "0.3"],
              "val_imdb_64_123.msgpack.gz: masked with whole-word-masking = true but the config has "
              "whole-word-masking = false and masking = static"),
             (static_dir, ["--masking", "static", "--whole-word-masking"],
              "val_imdb_64_123.msgpack.gz: masked with mask-rate = 0.3 but the config has mask-rate = 0.15")]
    for directory, options, message in cases:
        monkeypatch.chdir(directory)
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_info:
            main.main([*QUICK, "--config", str(mlm_workdir / "config.ini"), *options])
        assert exit_info.value.code == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
        assert not (directory / "runs").exists()


def test_a_dataset_pattern_with_split_serves_the_splits_whose_own_pattern_is_left_out():
    shared = Config(dataset_pattern="{split}_wiki_*.msgpack")
    assert [split_pattern(shared, split) for split in ("train", "val", "test")] == [
        "train_wiki_*.msgpack", "val_wiki_*.msgpack", "test_wiki_*.msgpack"]
    own = Config(dataset_pattern="{split}_wiki_*.msgpack", val_dataset_pattern="dev_*.msgpack",
                 origins={"val_dataset_pattern": "--val-dataset-pattern"})
    assert split_pattern(own, "val") == "dev_*.msgpack" and split_pattern(own, "test") == "test_wiki_*.msgpack"
    assert split_pattern(Config(dataset_pattern="train_a_*.msgpack"), "val") == "val_*.msgpack"


def test_batches_are_the_samples_padded_to_seq_len(mlm_base_dir):
    vocab = load_vocab(mlm_base_dir / "vocab")
    shard = read_shard(next((mlm_base_dir / "datasets").glob("val_*")))
    rows = np.arange(0, 64, 3)
    batch = make_batch(shard, rows, MLM_SEQ_LEN, vocab.pad_id, vocab.sep_id, 0.15)
    assert batch["input_ids"].shape == (len(rows), MLM_SEQ_LEN) and "positions" not in batch
    lengths = [len(shard.sample(row)) for row in rows]
    assert min(lengths) < MLM_SEQ_LEN  # some padding, so a mask of the real tokens
    for line, row, length in zip(range(len(rows)), rows, lengths):
        assert batch["input_ids"][line, :length].tolist() == shard.sample(row).tolist()
        assert (batch["input_ids"][line, length:] == vocab.pad_id).all()
        assert batch["attention_mask"][line].tolist() == [True] * length + [False] * (MLM_SEQ_LEN - length)


def test_a_shard_smaller_than_one_batch_is_one_line(mlm_workdir):
    config = main.load_config(None, ["--batch-size", "100000"])
    with pytest.raises(UserError, match=r"train_imdb_64_123\.msgpack\.gz: \d+ samples are fewer than one batch "
                                        r"\(batch-size 100000 x 1 processes\)$"):
        next(LanguageModelData(config, load_vocab(mlm_workdir / "vocab"), rank=0, world_size=1).train_batches(None))


def test_a_resume_on_another_corpus_under_the_same_names_is_one_line(mlm_workdir, imdb_reviews, capsys,
                                                                      skip_flops_measurement):
    """The checkpoint's data position records the shards it is a position in (each file's name and
    header digest); a resume on others is refused, --switch-training starts a new run on them."""
    schedule = ["--val-interval", "2", "--warmup-iters", "1", "--lr-decay-iters", "4"]
    main.main([*schedule, "--max-iters", "2"])
    other = mlm_workdir / "other.txt"
    other.write_text("\n".join(imdb_reviews[1000:1400]) + "\n", encoding="utf-8")
    prepare_mlm_dataset.main(["-i", str(other), "-l", "imdb", "-o", "datasets", "-m", str(MLM_SEQ_LEN),
                              "-v", "vocab", "-s", "123", "-n", "1"])  # the same names, another corpus
    capsys.readouterr()
    resume = [*schedule, "--max-iters", "4", "--cp", "runs/run0/checkpoints/checkpoint.pt"]
    with pytest.raises(SystemExit) as exit_info:
        main.main(resume)
    errors = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(errors) == 1, errors
    assert errors[0].startswith(f"error: {Path('datasets') / 'train_imdb_64_123.msgpack.gz'}: not the shard of this "
                                "name that the run trained on; a resumed run reads the data it trained on"), errors
    main.main([*resume, "--switch-training"])
    assert load(Path("runs/run1/checkpoints/checkpoint.pt"))["step"] == 4


def test_document_ids_count_the_sep_that_closes_each_document_and_padding_joins_the_last():
    sep = 3
    ids = np.array([[2, 7, 8, 3, 9, 3, 0, 0], [2, 7, 7, 7, 7, 7, 7, 3]])
    real = ids != 0
    assert document_ids(ids, real, sep).tolist() == [[0, 0, 0, 0, 1, 1, 1, 1], [0] * 8]
