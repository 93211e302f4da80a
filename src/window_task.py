"""What the fine-tuning tasks that read their examples as windows of word pieces share (ner,
squad): each split read once, training batches in the seeded (or length-grouped) order, and
evaluation batches that hold every window once, each tagged with its split. embed shares the
training side and batches its evaluation texts itself."""
import itertools

import numpy as np
import torch

from batching import BatchOrder, LengthGroupedBatchOrder, kept_rows
from errors import UserError
from hardware import to_device


class WindowTask:
    """A subclass reads a split (read_split) into an object with len(), .lengths and
    batch(rows, pad_id)."""

    def __init__(self, config, vocab, device: torch.device, rank: int = 0, world_size: int = 1):
        self.config = config
        self.vocab = vocab
        self.device = device
        self.order = BatchOrder(config.batch_size, config.seed, rank, world_size)
        self.splits = {}

    def kept(self, examples, split: str, noun: str):
        """The split's share of its examples (dataset-percentage and val-dataset-percentage), which
        must fill one batch; `noun` names them in the error (sentences, questions)."""
        rows = kept_rows(len(examples), self.config.share_of(split), self.config.seed)
        if len(rows) < len(examples):
            examples = examples.select(rows)
        if len(examples) < self.order.batch_size * self.order.world_size:
            raise UserError(f"{examples.files[0]}: {len(examples)} {noun} are fewer than one batch "
                            f"(batch-size {self.order.batch_size} x {self.order.world_size} processes)")
        return examples

    def data(self, split: str):
        if split not in self.splits:
            self.splits[split] = self.read_split(split)
        return self.splits[split]

    def check_data(self, splits: tuple[str, ...]):
        for split in splits:
            self.data(split)

    def train_batches(self, position: dict | None):
        data = self.data("train")
        order = self.order
        if self.config.length_grouping:
            order = LengthGroupedBatchOrder(data.lengths, order.batch_size, order.seed, order.rank,
                                            order.world_size)
        return order.batches(position, lambda epoch: len(data),
                             lambda epoch, rows: data.batch(rows, self.vocab.pad_id, self.config.seq_len))

    def eval_batches(self, split: str, count: int | None):
        """Every window of the split once (each rank every world-size-th), in order; the test split's
        first `count` batches where count is given. Validation scores the whole split."""
        data = self.data(split)
        rows = np.arange(len(data))[self.order.rank::self.order.world_size]
        size = self.order.batch_size
        batches = (to_device(data.batch(rows[start:start + size], self.vocab.pad_id, self.config.seq_len),
                             self.device, False) | {"split": split} for start in range(0, len(rows), size))
        return batches if count is None or split == "val" else itertools.islice(batches, count)
