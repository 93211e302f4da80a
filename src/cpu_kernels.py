"""Faster CPU paths for attention and dropout, where PyTorch's own are slow: under bf16 autocast its
fused attention kernels take twice the float32 time on short rows and lack dropout (falling back to an
unfused float32 path), and F.dropout's mask comes from a slow bernoulli_. GPUs never come here; a
reader of the model can skip this file. The timings are in etc/results.md ("Where a training step's
time goes", "Against transformers at BERT's sizes").
"""
import math

import torch
import torch.nn.functional as F
from torch import nn


# From this row length on, the CPU's bf16 fused attention beats its float32 one (etc/results.md,
# "Attention's dtype by length").
BF16_ATTENTION_FROM = 256


def attention(q, k, v, attention_mask, dropout: float, causal: bool):
    """Attention on the CPU under bf16 autocast: without dropout, the fused kernel, in float32 on rows
    shorter than BF16_ATTENTION_FROM; with dropout, spelled out (causality then comes as part of
    attention_mask)."""
    if dropout > 0:
        return attention_with_dropout(q, k, v, attention_mask, dropout)
    if q.shape[-2] >= BF16_ATTENTION_FROM:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, is_causal=causal)
    with torch.autocast("cpu", enabled=False):
        y = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=attention_mask,
                                           is_causal=causal)
    return y.to(q.dtype)


def attention_with_dropout(q, k, v, attention_mask, dropout: float):
    """Matmuls in bf16, the softmax in float32 (as Megatron-LM's unfused attention), dropout by `dropped`."""
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    if attention_mask is not None:
        scores = scores.masked_fill(~attention_mask, float("-inf"))
    weights = dropped(torch.softmax(scores.float(), dim=-1), dropout)
    return weights.to(q.dtype) @ v


def dropped(x, p: float):
    """Dropout with the mask of `keep_mask`, scaled by the chance it keeps, so the mean stays: two
    multiplications, vectorised where torch.where and a bool mask are not (a fifth of the time)."""
    kept, chance = keep_mask(x.shape, p, x.dtype, x.device)
    return (x * kept).mul_(1 / chance)


def keep_mask(shape, p: float, dtype, device) -> tuple[torch.Tensor, float]:
    """1 where an element is kept, with chance 1 - p (to 1/65,536), else 0, in `dtype`; and that
    chance. Four 16-bit draws come from each random 64-bit integer, a quarter of the generator's work
    of torch.rand; clamping a draw to the threshold and the value below it makes the 0 or 1 without a
    bool tensor, whose conversions and torch.where run unvectorised on the CPU."""
    dropped_values = min(round(p * 2 ** 16), 2 ** 16 - 1)
    if dropped_values == 0:
        return torch.ones(shape, dtype=dtype, device=device), 1.0
    count, threshold = math.prod(shape), dropped_values - 2 ** 15  # a draw below threshold drops
    words = torch.randint(-2 ** 63, 2 ** 63 - 1, ((count + 3) // 4,), dtype=torch.int64, device=device)
    draws = words.view(torch.int16)[:count].view(shape)
    kept = draws.clamp(threshold - 1, threshold).sub_(threshold - 1).to(dtype)
    return kept, 1 - dropped_values / 2 ** 16


class Dropout(nn.Dropout):
    """nn.Dropout, drawing its mask with `dropped` on the CPU."""

    def forward(self, x):
        if self.training and self.p > 0 and x.device.type == "cpu":
            return dropped(x, self.p)
        return super().forward(x)
