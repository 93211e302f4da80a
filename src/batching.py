"""Batch order shared by every task: a seeded permutation per epoch, dealt out across ranks,
resumable from a position {"epoch": e, "batch": b}; and padding of ragged samples."""
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


class BatchOrder:
    """Which samples form each batch, for this rank; the same for every run with one seed."""

    def __init__(self, batch_size: int, seed: int, rank: int = 0, world_size: int = 1):
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size

    def epoch_order(self, epoch: int, samples: int) -> np.ndarray:
        """This rank's samples for an epoch: a seeded permutation, dealt out across ranks."""
        order = np.random.default_rng([self.seed, epoch]).permutation(samples)
        usable = samples // self.world_size * self.world_size  # every rank gets as many batches
        return order[:usable][self.rank::self.world_size]

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
