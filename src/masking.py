"""BERT masking, vectorised over a batch: pick positions, replace 80/10/10, return targets.

Used twice with the same code: by the trainer on each batch (dynamic masking, a fresh mask
every epoch) and by the shard preparers (static masking, stored in the shard).
"""
import math
from dataclasses import dataclass

import torch

IGNORE_INDEX = -100


@dataclass(frozen=True)
class MaskingRule:
    mask_rate: float = 0.15
    replace_with_mask: float = 0.8  # of the picked tokens; the rest split between
    replace_with_random: float = 0.1  # a random token and the token itself


def predictions_per_sequence(seq_len: int, mask_rate: float) -> int:
    """Slots for masked positions per row: a fixed count keeps shapes static for compile."""
    return max(1, math.ceil(mask_rate * seq_len))


def mask_tokens(ids: torch.Tensor, special_ids: torch.Tensor, mask_id: int, vocab_size: int,
                rule: MaskingRule, generator: torch.Generator | None = None):
    """Mask a [batch, seq_len] batch of token ids as BERT does.

    Each row gets exactly round(mask_rate * maskable tokens) picked positions (at least one
    when it has any), as Google's BERT picks a fixed share per sequence rather than a coin per
    token. Special tokens ([PAD], [CLS], [SEP], ...) are never picked.

    Returns (inputs, positions, labels): the ids with replacements, the picked positions
    [batch, P] and their original ids [batch, P], where P = predictions_per_sequence and
    unused slots hold position 0 and label IGNORE_INDEX.
    """
    batch, seq_len = ids.shape
    slots = predictions_per_sequence(seq_len, rule.mask_rate)
    device = ids.device
    maskable = ~torch.isin(ids, special_ids.to(device))
    picks_per_row = torch.round(maskable.sum(1) * rule.mask_rate).long()
    picks_per_row = torch.where(maskable.any(1), picks_per_row.clamp(1, slots), 0)

    # The `slots` lowest random scores among maskable positions are the candidates;
    # the first picks_per_row of them are used.
    scores = torch.rand(batch, seq_len, generator=generator, device=device)
    scores = scores.masked_fill(~maskable, 2.0)
    positions = scores.topk(slots, dim=1, largest=False).indices
    used = torch.arange(slots, device=device) < picks_per_row[:, None]
    labels = torch.where(used, ids.gather(1, positions), IGNORE_INDEX)

    kind = torch.rand(batch, slots, generator=generator, device=device)
    random_ids = torch.randint(0, vocab_size, (batch, slots), generator=generator, device=device)
    replacement = torch.where(kind < rule.replace_with_mask, mask_id, ids.gather(1, positions))
    replacement = torch.where((kind >= rule.replace_with_mask)
                              & (kind < rule.replace_with_mask + rule.replace_with_random),
                              random_ids, replacement)
    # Unused slots write into a scratch column, so no two slots ever write one position.
    scratch = torch.cat([ids, ids[:, :1]], dim=1)
    scratch.scatter_(1, torch.where(used, positions, seq_len), replacement)
    positions = torch.where(used, positions, 0)
    return scratch[:, :seq_len], positions, labels
