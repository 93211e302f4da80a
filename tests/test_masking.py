"""BERT masking: how many positions are picked, how they are replaced, what is never touched."""
import torch

from masking import IGNORE_INDEX, MaskingRule, mask_tokens, predictions_per_sequence

SPECIAL = torch.arange(5)  # [PAD] [UNK] [CLS] [SEP] [MASK]
MASK_ID = 4


def batch_with_padding(rows=512, length=128, vocab=5000, seed=0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (rows, length), generator=generator)
    lengths = torch.randint(20, length + 1, (rows,), generator=generator)
    ids[:, 0] = 2
    ids[torch.arange(rows), lengths - 1] = 3
    ids[torch.arange(length) >= lengths[:, None]] = 0
    return ids, lengths


def test_fifteen_percent_picked_and_replaced_80_10_10():
    ids, _ = batch_with_padding()
    inputs, positions, labels = mask_tokens(ids, SPECIAL, MASK_ID, 5000, MaskingRule(),
                                            torch.Generator().manual_seed(1))
    used = labels != IGNORE_INDEX
    maskable = ~torch.isin(ids, SPECIAL)
    assert abs(used.sum() / maskable.sum() - 0.15) < 0.005
    rows = torch.arange(ids.shape[0])[:, None].expand_as(positions)
    new = inputs[rows[used], positions[used]]
    old = labels[used]
    share_mask = (new == MASK_ID).float().mean()
    share_same = (new == old).float().mean()
    assert abs(share_mask - 0.8) < 0.02
    assert abs(share_same - 0.1) < 0.02  # random draws rarely hit the original token
    assert abs(1 - share_mask - share_same - 0.1) < 0.02


def test_special_tokens_and_unpicked_positions_unchanged():
    ids, _ = batch_with_padding()
    inputs, positions, labels = mask_tokens(ids, SPECIAL, MASK_ID, 5000, MaskingRule(),
                                            torch.Generator().manual_seed(2))
    picked = torch.zeros_like(ids, dtype=torch.bool)
    used = labels != IGNORE_INDEX
    rows = torch.arange(ids.shape[0])[:, None].expand_as(positions)
    picked[rows[used], positions[used]] = True
    assert torch.equal(inputs[~picked], ids[~picked])
    assert not torch.isin(ids[picked], SPECIAL).any()
    assert torch.equal(ids[rows[used], positions[used]], labels[used])


def test_fixed_slot_count_and_no_duplicate_positions():
    ids, lengths = batch_with_padding(rows=64)
    _, positions, labels = mask_tokens(ids, SPECIAL, MASK_ID, 5000, MaskingRule(),
                                       torch.Generator().manual_seed(3))
    assert positions.shape == (64, predictions_per_sequence(128, 0.15))
    for row in range(64):
        used = positions[row][labels[row] != IGNORE_INDEX]
        assert len(used) == len(set(used.tolist()))
        assert len(used) == max(1, round(0.15 * (lengths[row].item() - 2)))


def test_seeded_generator_is_reproducible():
    ids, _ = batch_with_padding(rows=8)
    first = mask_tokens(ids, SPECIAL, MASK_ID, 5000, MaskingRule(), torch.Generator().manual_seed(7))
    second = mask_tokens(ids, SPECIAL, MASK_ID, 5000, MaskingRule(), torch.Generator().manual_seed(7))
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_higher_mask_rate():
    ids, _ = batch_with_padding()
    _, _, labels = mask_tokens(ids, SPECIAL, MASK_ID, 5000, MaskingRule(mask_rate=0.3),
                               torch.Generator().manual_seed(4))
    maskable = ~torch.isin(ids, SPECIAL)
    assert abs((labels != IGNORE_INDEX).sum() / maskable.sum() - 0.3) < 0.01
