"""Batch order: seeded, resumable, dealt across ranks; length grouping on real sentences."""
from itertools import islice

import numpy as np
import pytest

from batching import BatchOrder, LengthGroupedBatchOrder, group_by_length, pad_multiple, padded_width
from tasks.pair_encoding import encode_examples
from vocab import load_vocab


@pytest.fixture(scope="module")
def lengths(rotten_tomatoes, vocab_dir) -> np.ndarray:
    """Token counts ([CLS] ... [SEP]) of 2,000 real Rotten Tomatoes sentences."""
    texts = [text for text, _ in rotten_tomatoes]
    return encode_examples(load_vocab(vocab_dir), texts, None, seq_len=128).lengths


def epoch_batches(order: BatchOrder, epoch: int, samples: int) -> list[np.ndarray]:
    return order.batch_rows(order.epoch_order(epoch, samples))


def test_group_by_length_sorts_within_groups_and_keeps_every_sample():
    lengths = np.arange(40)[::-1]
    order = np.random.default_rng(0).permutation(40)
    grouped = group_by_length(order, lengths, batch_size=4, batches_per_group=5, rng=np.random.default_rng(1))
    assert sorted(grouped) == list(range(40))
    batches = grouped.reshape(-1, 4)
    for first_group in (set(order[:20]), set(order[20:])):  # groups of 5 x 4 samples
        in_group = [batch for batch in batches if set(batch) <= first_group]
        assert len(in_group) == 5
        spans = sorted((lengths[batch].min(), lengths[batch].max()) for batch in in_group)
        assert all(high < next_low for (_, high), (next_low, _) in zip(spans, spans[1:]))  # disjoint bands


def test_every_sentence_once_per_epoch(lengths):
    order = LengthGroupedBatchOrder(lengths, batch_size=16, seed=7)
    assert len(lengths) % 16 == 0
    for epoch in range(2):
        rows = np.concatenate(epoch_batches(order, epoch, len(lengths)))
        assert np.array_equal(np.sort(rows), np.arange(len(lengths)))
    # An uneven count: only the remainder, fewer than one batch, is left out, and never twice.
    rows = np.concatenate(epoch_batches(LengthGroupedBatchOrder(lengths, 32, seed=7), 0, len(lengths)))
    assert len(rows) == len(lengths) // 32 * 32 and len(np.unique(rows)) == len(rows)


def test_grouped_batches_need_much_less_padding_than_random_ones(lengths):
    random_batches = epoch_batches(BatchOrder(32, seed=7), 0, len(lengths))
    grouped_batches = epoch_batches(LengthGroupedBatchOrder(lengths, 32, seed=7), 0, len(lengths))
    random_width = np.mean([padded_width(lengths[rows], 128, 8) for rows in random_batches])
    grouped_width = np.mean([padded_width(lengths[rows], 128, 8) for rows in grouped_batches])
    assert grouped_width < 0.7 * random_width, (grouped_width, random_width)
    # ... and the padded positions themselves fall far more (each batch spans a narrow band)
    real = len(random_batches) * 32 * lengths.mean()
    assert grouped_width * len(grouped_batches) * 32 - real < 0.3 * (random_width * len(random_batches) * 32 - real)


def test_grouped_batches_are_shuffled_not_sorted(lengths):
    batches = epoch_batches(LengthGroupedBatchOrder(lengths, 32, seed=7), 0, len(lengths))
    widths = [padded_width(lengths[rows], 128, 8) for rows in batches]
    assert widths != sorted(widths) and widths != sorted(widths, reverse=True)


def test_same_seed_same_batches_another_epoch_or_seed_another_order(lengths):
    def batches(seed, epoch):
        return [rows.tolist() for rows in epoch_batches(LengthGroupedBatchOrder(lengths, 32, seed), epoch,
                                                        len(lengths))]
    assert batches(7, 0) == batches(7, 0)
    assert batches(7, 1) != batches(7, 0)
    assert batches(8, 0) != batches(7, 0)


@pytest.mark.parametrize("position", [{"epoch": 0, "batch": 37}, {"epoch": 1, "batch": 0}, {"epoch": 1, "batch": 61}])
def test_resume_from_a_position_gives_the_remaining_batches(lengths, position):
    order = LengthGroupedBatchOrder(lengths, 32, seed=7)
    stream = order.batches(None, lambda epoch: len(lengths), lambda epoch, rows: rows)
    straight = list(islice(stream, 200))  # 62 batches an epoch: past the end of epoch 2
    consumed = next(index for index, (after, _) in enumerate(straight) if after == position) + 1
    resumed = order.batches(position, lambda epoch: len(lengths), lambda epoch, rows: rows)
    for (expected_position, expected), (got_position, got) in zip(straight[consumed:], islice(resumed, 50)):
        assert got_position == expected_position and np.array_equal(got, expected)


def test_ranks_get_disjoint_equal_shares_of_the_same_global_batches(lengths):
    samples = len(lengths) - 5  # uneven, so dealing must leave out the same remainder for all ranks
    single = epoch_batches(LengthGroupedBatchOrder(lengths, 48, seed=7), 0, samples)
    ranks = [epoch_batches(LengthGroupedBatchOrder(lengths, 16, seed=7, rank=rank, world_size=3), 0, samples)
             for rank in range(3)]
    assert len({len(batches) for batches in ranks}) == 1 and len(ranks[0]) == len(single)
    for index, global_batch in enumerate(single):
        shares = [set(batches[index].tolist()) for batches in ranks]
        assert set().union(*shares) == set(global_batch.tolist())
        assert sum(map(len, shares)) == 48  # disjoint
    # Each rank's share of a global batch is as homogeneous, so no rank waits on a wide one.
    spreads = [np.ptp([padded_width(lengths[batches[index]], 128, 8) for batches in ranks])
               for index in range(len(single))]
    assert np.mean(spreads) < 2, np.mean(spreads)


def test_a_batch_is_padded_to_its_multiple_never_past_the_position_table():
    assert padded_width(np.array([3, 9, 5]), 128, 8) == 16
    assert padded_width(np.array([16]), 128, 8) == 16
    assert padded_width(np.array([97, 12]), 100, 8) == 100  # 104 would index past a 100-row position table
    assert padded_width(np.array([3, 9, 5]), 128, 1) == 9


def test_widths_round_to_8_on_a_gpu_and_not_on_the_cpu():
    assert pad_multiple("cuda") == 8
    assert pad_multiple("cpu") == 1
