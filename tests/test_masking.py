"""BERT masking: how many positions are picked, how they are replaced, what is never touched;
whole-word masking on real WordPiece text; the adjustable 80/10/10 split and its config keys."""
import pytest
import torch

from config import Config
from errors import UserError
from masking import MaskingRule, mask_tokens, predictions_per_sequence
from model import IGNORE_INDEX

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


def test_adjustable_split_gives_the_configured_shares():
    ids, _ = batch_with_padding()
    for replace_with_mask, replace_with_random in ((0.5, 0.5), (1.0, 0.0), (0.0, 0.0)):
        rule = MaskingRule(mask_replace_mask=replace_with_mask, mask_replace_random=replace_with_random)
        inputs, positions, labels = mask_tokens(ids, SPECIAL, MASK_ID, 5000, rule, torch.Generator().manual_seed(5))
        used = labels != IGNORE_INDEX
        new = inputs.gather(1, positions)[used]
        share_mask = (new == MASK_ID).float().mean().item()
        share_same = (new == labels[used]).float().mean().item()
        assert share_mask == pytest.approx(replace_with_mask, abs=0.02)
        assert share_same == pytest.approx(1 - replace_with_mask - replace_with_random, abs=0.02)


@pytest.mark.parametrize("settings, message", [
    ({"mask_replace_mask": 0.9, "mask_replace_random": 0.2},
     "config: mask-replace-mask = 0.9 plus mask-replace-random = 0.2 exceed 1"),
    ({"mask_replace_mask": 1.5}, "config: mask-replace-mask = 1.5: expected a number in [0, 1]"),
    ({"mask_replace_random": -0.1}, "config: mask-replace-random = -0.1: expected a number in [0, 1]"),
    ({"masking": "fresh"}, "config: masking = 'fresh': expected one of dynamic, static"),
])
def test_invalid_masking_keys_are_config_errors(settings, message):
    with pytest.raises(UserError) as error:
        Config(**settings)
    assert str(error.value) == message


def test_splits_that_add_up_to_one_are_valid():
    assert Config(mask_replace_mask=0.7, mask_replace_random=0.3).mask_replace_random == 0.3


# ----------------------------------------------------------------------------- whole-word masking

@pytest.fixture(scope="module")
def review_batch(imdb_reviews, vocab) -> torch.Tensor:
    """[CLS] review pieces [SEP] rows, padded to 128; every third row starts inside a word."""
    rows = torch.full((600, 128), vocab.pad_id)
    for row, ids in enumerate(vocab.encode(imdb_reviews[:600])):
        pieces = ids[row % 3:][:126]
        rows[row, :len(pieces) + 2] = torch.tensor([vocab.cls_id, *pieces, vocab.sep_id])
    return rows


def same_word_as_next(ids: torch.Tensor, vocab) -> torch.Tensor:
    """[batch, seq_len - 1]: True where the next piece continues this piece's word."""
    maskable = ~torch.isin(ids, torch.tensor(vocab.special_ids))
    continues = torch.from_numpy(vocab.is_continuation)[ids]
    return maskable[:, :-1] & maskable[:, 1:] & continues[:, 1:]


def picked_mask(ids: torch.Tensor, positions: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    picked = torch.zeros_like(ids, dtype=torch.bool)
    rows = torch.arange(ids.shape[0])[:, None].expand_as(positions)
    used = labels != IGNORE_INDEX
    picked[rows[used], positions[used]] = True
    return picked


@pytest.mark.parametrize("mask_rate", [0.15, 0.3])
def test_whole_word_masking_picks_whole_words_at_the_mask_rate(review_batch, vocab, mask_rate):
    ids = review_batch
    special = torch.tensor(vocab.special_ids)
    is_continuation = torch.from_numpy(vocab.is_continuation)
    rule = MaskingRule(mask_rate=mask_rate, whole_word_masking=True)
    inputs, positions, labels = mask_tokens(ids, special, vocab.mask_id, vocab.size, rule,
                                            torch.Generator().manual_seed(6), is_continuation)
    picked = picked_mask(ids, positions, labels)
    same_word = same_word_as_next(ids, vocab)
    assert same_word.any(1).float().mean() > 0.9  # most rows hold words of several pieces
    assert torch.equal(picked[:, :-1][same_word], picked[:, 1:][same_word])  # no word split

    maskable = ~torch.isin(ids, special)
    assert not picked[~maskable].any()
    assert positions.shape == (len(ids), predictions_per_sequence(128, mask_rate))
    assert (picked.sum(1) <= torch.round(maskable.sum(1) * mask_rate)).all()
    assert (picked.sum() / maskable.sum()).item() == pytest.approx(mask_rate, abs=0.01)
    # Words of several pieces are picked as often as short ones: `##` pieces keep their share.
    continuation_share = is_continuation[ids][maskable].float().mean().item()
    assert is_continuation[ids][picked].float().mean().item() == pytest.approx(continuation_share, abs=0.03)

    used = labels != IGNORE_INDEX
    assert torch.equal(ids.gather(1, positions)[used], labels[used])
    assert torch.equal(inputs[~picked], ids[~picked])
    share_mask = (inputs.gather(1, positions)[used] == vocab.mask_id).float().mean().item()
    assert share_mask == pytest.approx(0.8, abs=0.02)  # decided per piece, as Google's BERT does


def test_whole_word_masking_is_reproducible(review_batch, vocab):
    rule = MaskingRule(whole_word_masking=True)
    special, is_continuation = torch.tensor(vocab.special_ids), torch.from_numpy(vocab.is_continuation)
    first, second = (mask_tokens(review_batch[:32], special, vocab.mask_id, vocab.size, rule,
                                 torch.Generator().manual_seed(8), is_continuation) for _ in range(2))
    assert all(torch.equal(a, b) for a, b in zip(first, second))
