"""Batch order shared by every task: a seeded permutation per epoch, dealt out across ranks,
resumable from a position {"epoch": e, "batch": b}; optionally grouped by length; and padding
of ragged samples."""
from typing import Callable, Iterator

import numpy as np


def gather_padded(values: np.ndarray, offsets: np.ndarray, rows: np.ndarray, width: int,
                  fill: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of a ragged array (values split at offsets) as a [len(rows), width] int64 array.

    Returns the array and a bool array, True where a row had a value.
    """
    starts = offsets[rows]
    lengths = offsets[rows + 1] - starts
    columns = np.arange(width)
    present = columns < lengths[:, None]
    index = np.where(present, starts[:, None] + columns, 0)
    gathered = values[index].astype(np.int64) if len(values) else np.zeros(index.shape, np.int64)
    return np.where(present, gathered, fill), present


def padded_width(lengths: np.ndarray, limit: int, multiple: int) -> int:
    """The width a batch of these lengths is padded to: the longest rounded up to `multiple`
    (pad_multiple's), never past `limit` (the position table)."""
    return min(-(-int(lengths.max()) // multiple) * multiple, limit)


def pad_multiple(device_type: str) -> int:
    """What a batch's width is rounded up to: 8 on a GPU (aligned tensor-core tiles), else 1: on the
    CPU every padded position is paid for and alignment buys nothing, compiled or not (a compiled
    model's width is dynamic from its second batch on, so exact widths add no graphs; etc/results/speed.md,
    "Against transformers at BERT's sizes", and etc/results/step-time.md, "A second bf16 CPU")."""
    return 8 if device_type != "cpu" else 1


def kept_rows(count: int, share: float, seed: int) -> np.ndarray:
    """A seeded, fixed share of `count` rows (dataset-percentage), in their order; all for 1."""
    if share >= 1:
        return np.arange(count)
    keep = max(1, round(share * count))
    return np.sort(np.random.default_rng(seed).choice(count, size=keep, replace=False))


class BatchOrder:
    """Which samples form each batch, for this rank; the same for every run with one seed."""

    def __init__(self, batch_size: int, seed: int, rank: int = 0, world_size: int = 1):
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.world_size

    def global_order(self, epoch: int, samples: int) -> np.ndarray:
        """Every rank's samples for an epoch, global batch after global batch; full ones only,
        so every rank gets as many batches."""
        order = np.random.default_rng([self.seed, epoch]).permutation(samples)
        return order[:samples // self.global_batch_size * self.global_batch_size]

    def epoch_order(self, epoch: int, samples: int) -> np.ndarray:
        """This rank's samples for an epoch: every world-size-th of each global batch."""
        return self.global_order(epoch, samples)[self.rank::self.world_size]

    def batch_rows(self, order: np.ndarray) -> list[np.ndarray]:
        """Full batches only: a short last batch would change shapes and loss scale."""
        count = len(order) // self.batch_size
        return [order[i * self.batch_size:(i + 1) * self.batch_size] for i in range(count)]

    def batches(self, position: dict | None, samples_in_epoch: Callable[[int], int],
                make_batch: Callable[[int, np.ndarray], dict]) -> Iterator[tuple[dict, dict]]:
        """Endless batches from `position` on, each with the position after it (what checkpoints keep)."""
        epoch, start = (position["epoch"], position["batch"]) if position else (0, 0)
        while True:
            rows_per_batch = self.batch_rows(self.epoch_order(epoch, samples_in_epoch(epoch)))
            for index in range(start, len(rows_per_batch)):
                batch = make_batch(epoch, rows_per_batch[index])
                last = index + 1 == len(rows_per_batch)
                yield ({"epoch": epoch + 1, "batch": 0} if last else {"epoch": epoch, "batch": index + 1}), batch
            epoch, start = epoch + 1, 0

    def fixed_batches(self, count: int | None, samples: int, make_batch: Callable[[np.ndarray], dict]):
        """The same first `count` batches every time (all for None), in epoch 0's order: for evaluation."""
        rows_per_batch = self.batch_rows(self.epoch_order(0, samples))
        for rows in rows_per_batch[:count]:
            yield make_batch(rows)


def group_by_length(order: np.ndarray, lengths: np.ndarray, batch_size: int, batches_per_group: int,
                    rng: np.random.Generator) -> np.ndarray:
    """`order` rearranged so that each run of batch_size samples has similar lengths, the runs in
    random order; len(order) must be a multiple of batch_size.

    Each group of batches_per_group batches is sorted by length and cut into batches, so a batch
    draws from a random group but holds a narrow band of lengths.
    """
    group = batch_size * batches_per_group
    chunks = np.split(order, range(group, len(order), group))
    # stable: samples of equal length keep the random order they came in
    sorted_chunks = [chunk[np.argsort(lengths[chunk], kind="stable")] for chunk in chunks]
    batches = np.concatenate(sorted_chunks).reshape(-1, batch_size)
    return batches[rng.permutation(len(batches))].reshape(-1)


class LengthGroupedBatchOrder(BatchOrder):
    """BatchOrder whose global batches hold sentences of similar length (Hugging Face's
    group_by_length): less padding per batch, still random across the epoch."""

    def __init__(self, lengths: np.ndarray, batch_size: int, seed: int, rank: int = 0, world_size: int = 1,
                 batches_per_group: int = 50):
        super().__init__(batch_size, seed, rank, world_size)
        self.lengths = lengths
        self.batches_per_group = batches_per_group

    def global_order(self, epoch: int, samples: int) -> np.ndarray:
        """Grouped on the global batches, so every rank's share of one is as homogeneous, and
        global batch i holds the same samples for any number of ranks at one global batch size."""
        rng = np.random.default_rng([self.seed, epoch, 1])  # a stream apart from the permutation's
        return group_by_length(super().global_order(epoch, samples), self.lengths, self.global_batch_size,
                               self.batches_per_group, rng)
