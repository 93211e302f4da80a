"""BERT masking, vectorised over a batch: pick positions (tokens or whole words), replace 80/10/10,
return targets.

Used twice with the same code: by the trainer on each batch (dynamic masking, a fresh mask
every epoch) and by the shard preparers (static masking, stored in the shard).
"""
import math
from dataclasses import dataclass, fields

import torch

from architecture import IGNORE_INDEX
from config import DEFAULTS


@dataclass(frozen=True)
class MaskingRule:
    """How tokens are picked and replaced, named as the config keys (and a static shard's header
    fields) that set them; config.py has what each means and its default."""
    mask_rate: float = DEFAULTS["mask_rate"].start
    whole_word_masking: bool = DEFAULTS["whole_word_masking"]
    mask_replace_mask: float = DEFAULTS["mask_replace_mask"]
    mask_replace_random: float = DEFAULTS["mask_replace_random"]

    @classmethod
    def from_config(cls, settings) -> "MaskingRule":
        """From a Config (at mask-rate's start, its highest rate), or anything else with the same
        attributes (the preparers' options)."""
        values = {field.name: getattr(settings, field.name) for field in fields(cls)}
        if not isinstance(values["mask_rate"], float):  # a Config's MaskRate
            values["mask_rate"] = values["mask_rate"].start
        return cls(**values)



def predictions_per_sequence(seq_len: int, mask_rate: float) -> int:
    """Slots for masked positions per row: a fixed count keeps shapes static for compile."""
    return max(1, math.ceil(mask_rate * seq_len))


def mask_tokens(ids: torch.Tensor, special_ids: torch.Tensor, mask_id: int, vocab_size: int,
                rule: MaskingRule, generator: torch.Generator | None = None,
                is_continuation: torch.Tensor | None = None, slots: int | None = None):
    """Mask a [batch, seq_len] batch of token ids as BERT does.

    Each row gets round(mask_rate * maskable tokens) picked positions (at least one when it
    has any), as Google's BERT picks a fixed share per sequence rather than a coin per token;
    with rule.whole_word_masking, whole words up to that count (see pick_whole_words), which needs
    is_continuation, a [vocab_size] bool tensor that is True for `##` pieces. Special tokens
    ([PAD], [CLS], [SEP], ...) are never picked. Each picked piece is then replaced on its own
    draw: [MASK], a random token or itself (80/10/10 by default), as Google's BERT does for
    whole words too.

    Returns (inputs, positions, labels): the ids with replacements, the picked positions
    [batch, P] and their original ids [batch, P], where P = `slots` (by default
    predictions_per_sequence: a falling mask-rate keeps those of its highest rate, one shape) and
    unused slots hold position 0 and label IGNORE_INDEX.
    """
    slots = slots or predictions_per_sequence(ids.shape[1], rule.mask_rate)
    maskable = ~torch.isin(ids, special_ids.to(ids.device))
    picks_per_row = torch.round(maskable.sum(1) * rule.mask_rate).long()
    picks_per_row = torch.where(maskable.any(1), picks_per_row.clamp(1, slots), 0)
    if rule.whole_word_masking:
        if is_continuation is None:
            raise ValueError("whole-word masking needs the vocabulary's is_continuation table")
        picked = pick_whole_words(ids, maskable, is_continuation, picks_per_row, generator)
        positions, used = picked_positions(picked, slots)
    else:
        positions, used = pick_tokens(maskable, picks_per_row, slots, generator)
    return replace_picked(ids, positions, used, mask_id, vocab_size, rule, generator)


def pick_tokens(maskable: torch.Tensor, picks_per_row: torch.Tensor, slots: int,
                generator: torch.Generator | None):
    """Positions [batch, slots] of picks_per_row random maskable tokens; used marks the real slots."""
    batch, seq_len = maskable.shape
    # The `slots` lowest random scores among maskable positions are the candidates;
    # the first picks_per_row of them are used.
    scores = torch.rand(batch, seq_len, generator=generator, device=maskable.device)
    scores = scores.masked_fill(~maskable, 2.0)
    positions = scores.topk(slots, dim=1, largest=False).indices
    used = torch.arange(slots, device=maskable.device) < picks_per_row[:, None]
    return positions, used


def pick_whole_words(ids: torch.Tensor, maskable: torch.Tensor, is_continuation: torch.Tensor,
                     picks_per_row: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """A [batch, seq_len] bool mask of the pieces of randomly picked whole words.

    A word is a maskable piece that does not continue one (no `##`, or after a special token)
    and the `##` pieces after it. Words are taken in random order while their pieces add up to
    at most picks_per_row, so a word is picked whole or not at all and a row never holds more
    picks than its slots. Google's BERT skips a word that would overshoot and tries the next;
    this takes the longest fitting prefix of the random order instead, which stays vectorised
    and picks slightly fewer pieces. Words longer than the row's count go last, so they never
    block the others.
    """
    batch, seq_len = ids.shape
    # index_select, not is_continuation[ids]: the latter is a thousand times slower on CPU.
    continues = is_continuation.to(ids.device).index_select(0, ids.flatten()).view_as(ids) & maskable
    after_maskable = torch.nn.functional.pad(maskable[:, :-1], (1, 0), value=False)
    starts = maskable & ~(continues & after_maskable)
    # Word index of each maskable piece; other positions go to a scratch word at seq_len.
    word = torch.where(maskable, starts.cumsum(1) - 1, seq_len)
    lengths = torch.zeros(batch, seq_len + 1, dtype=torch.long, device=ids.device)
    lengths = lengths.scatter_add_(1, word, torch.ones_like(word))[:, :seq_len]

    scores = torch.rand(batch, seq_len, generator=generator, device=ids.device)
    scores = scores + (lengths > picks_per_row[:, None]) + 2 * (lengths == 0)
    order = scores.argsort(dim=1)
    taken_in_order = lengths.gather(1, order).cumsum(1) <= picks_per_row[:, None]
    taken = torch.zeros(batch, seq_len + 1, dtype=torch.bool, device=ids.device)
    taken[:, :seq_len].scatter_(1, order, taken_in_order & (lengths.gather(1, order) > 0))
    return taken.gather(1, word) & maskable


def picked_positions(picked: torch.Tensor, slots: int):
    """Positions [batch, slots] of the True entries (ascending, at most slots per row) and used."""
    seq_len = picked.shape[1]
    index = torch.arange(seq_len, device=picked.device)
    positions = torch.where(picked, index, index + seq_len).topk(slots, dim=1, largest=False).indices
    used = torch.arange(slots, device=picked.device) < picked.sum(1, keepdim=True)
    return positions, used


def replace_picked(ids: torch.Tensor, positions: torch.Tensor, used: torch.Tensor, mask_id: int,
                   vocab_size: int, rule: MaskingRule, generator: torch.Generator | None):
    """Replace each used position on its own draw: [MASK], a random token or itself."""
    batch, seq_len = ids.shape
    slots, device = positions.shape[1], ids.device
    original = ids.gather(1, positions)
    labels = torch.where(used, original, IGNORE_INDEX)
    kind = torch.rand(batch, slots, generator=generator, device=device)
    random_ids = torch.randint(0, vocab_size, (batch, slots), generator=generator, device=device)
    replacement = torch.where(kind < rule.mask_replace_mask, mask_id, original)
    replacement = torch.where((kind >= rule.mask_replace_mask)
                              & (kind < rule.mask_replace_mask + rule.mask_replace_random),
                              random_ids, replacement)
    # Unused slots write into a scratch column, so no two slots ever write one position.
    scratch = torch.cat([ids, ids[:, :1]], dim=1)
    scratch.scatter_(1, torch.where(used, positions, seq_len), replacement)
    positions = torch.where(used, positions, 0)
    return scratch[:, :seq_len], positions, labels
