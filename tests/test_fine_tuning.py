"""src/tasks/fine_tuning.py: what the fine-tuning tasks share, on SST-2's files of real sentences:
inference batches of neighbouring lengths, evaluation batches that hold each kept example once across
the ranks (test-iters cuts the test split alone), and a share of a split that fills no batch one line."""
import re

import numpy as np
import pytest
import torch

import make_demo
from batching import kept_rows
from config import Config
from errors import UserError
from tasks import glue_data, pair_encoding
from tasks.fine_tuning import EncodedSplit, FineTuningTask, inference_rows


class Reviews(EncodedSplit):
    """A split of SST-2's sentences, encoded; a batch names its rows by their index in the file."""

    def __init__(self, examples, encoded):
        self.examples, self.encoded = examples, encoded

    def batch(self, rows, pad_id, seq_len, multiple):
        return {"index": self.examples.index[rows]}


class ReviewTask(FineTuningTask):
    """The smallest task on FineTuningTask: each part SST-2's split as glue_data reads it, its share kept."""

    def __init__(self, directory, config, vocab, rank: int = 0, world_size: int = 1):
        super().__init__(config, vocab, torch.device("cpu"), rank, world_size)
        self.directory = directory

    def read_part(self, split: str, name: str) -> Reviews:
        examples = self.kept(glue_data.read_split(self.directory, "sst2", name), split, "sentences")
        return Reviews(examples, pair_encoding.encode_examples(self.vocab, examples.first, None, self.config.seq_len))


@pytest.fixture(scope="module")
def sst2_dir(rotten_tomatoes, tmp_path_factory):
    """400 Rotten Tomatoes sentences of both polarities in SST-2's layout: 320 to train on, 40 and 40."""
    directory = tmp_path_factory.mktemp("sst2")
    make_demo.write_sst2(directory, rotten_tomatoes[::5], seed=123)
    return directory


def test_inference_batches_neighbouring_lengths_shortest_first_and_every_row_once(vocab, rotten_tomatoes):
    lengths = np.array([len(ids) for ids in vocab.encode([text for text, _ in rotten_tomatoes[::20]])])
    batches = list(inference_rows(lengths, 16))
    assert [len(rows) for rows in batches] == [16] * 6 + [4]
    rows = np.concatenate(batches)
    assert sorted(rows.tolist()) == list(range(100))
    assert (np.diff(lengths[rows]) >= 0).all() and lengths[rows[0]] < lengths[rows[-1]]


def test_evaluation_batches_hold_each_kept_example_once_across_the_ranks(sst2_dir, vocab):
    """val-dataset-percentage keeps a seeded share; validation scores all of it whatever the count
    (val-iters is pre-training's), the test split gives test-iters batches."""
    config = Config(task_type="sst2", batch_size=4, seq_len=64, val_dataset_percentage=0.5)
    ranks = [ReviewTask(sst2_dir, config, vocab, rank, world_size=2) for rank in (0, 1)]
    validation = glue_data.read_split(sst2_dir, "sst2", "validation")
    batches = [batch for task in ranks for batch in task.eval_batches("val", 1)]
    assert {(batch["split"], batch["part"]) for batch in batches} == {("val", 0)}
    indices = np.concatenate([batch["index"].numpy() for batch in batches])
    assert len(validation) == 40 and len(indices) == len(set(indices.tolist())) == 20
    assert sorted(indices.tolist()) == sorted(validation.index[kept_rows(40, 0.5, config.seed)].tolist())
    assert [len(list(task.eval_batches("test", 2))) for task in ranks] == [2, 2]
    tested = np.concatenate([batch["index"].numpy() for task in ranks for batch in task.eval_batches("test", None)])
    assert sorted(tested.tolist()) == sorted(glue_data.read_split(sst2_dir, "sst2", "test").index.tolist())


def test_a_share_that_fills_no_batch_of_every_rank_is_one_line_naming_the_file(sst2_dir, vocab):
    config = Config(task_type="sst2", batch_size=16, seq_len=64, val_dataset_percentage=0.5)
    assert len(ReviewTask(sst2_dir, config, vocab).split("val")) == 20  # one process: a batch of 16 fits
    task = ReviewTask(sst2_dir, config, vocab, rank=1, world_size=2)
    path = glue_data.find_split_files(sst2_dir, glue_data.glue_task("sst2"), "validation")[0]
    with pytest.raises(UserError, match=f"^{re.escape(str(path))}: 20 sentences are fewer than one batch "
                                        r"\(batch-size 16 x 2 processes\)$"):
        task.split("val")
