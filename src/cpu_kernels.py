"""Faster CPU paths for attention and dropout, where PyTorch's own are slow: under bf16 autocast its
fused attention kernels take twice the float32 time and lack dropout (falling back to an unfused
float32 path), and F.dropout's mask comes from a slow bernoulli_. GPUs never come here; a reader of
the model can skip this file. The timings are in etc/results.md ("Where a training step's time goes").
"""
import torch
import torch.nn.functional as F
from torch import nn


def attention(q, k, v, attention_mask, dropout: float, causal: bool):
    """Attention on the CPU under bf16 autocast: without dropout, the fused kernel in float32; with
    dropout, spelled out (causality then comes as part of attention_mask)."""
    if dropout > 0:
        return attention_with_dropout(q, k, v, attention_mask, dropout)
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
    """Dropout with the mask drawn by torch.rand, which the CPU draws faster than bernoulli_."""
    return torch.where(torch.rand(x.shape, device=x.device) >= p, x * (1 / (1 - p)), 0.0)


class Dropout(nn.Dropout):
    """nn.Dropout, drawing its mask with `dropped` on the CPU."""

    def forward(self, x):
        if self.training and self.p > 0 and x.device.type == "cpu":
            return dropped(x, self.p)
        return super().forward(x)
