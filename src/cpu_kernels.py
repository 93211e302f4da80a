"""Faster CPU paths for attention, dropout and the token loss, where PyTorch's own are slow under bf16
autocast: its fused attention kernels lack dropout (falling back to an unfused float32 path) and on
short rows take twice the time of attention spelled out in bf16 matmuls, its bf16 kernel is slower
than its float32 one below 256, F.dropout's mask comes from a slow bernoulli_, and cross_entropy
passes over the vocabulary's logits six times. GPUs come here only for dropout under torch.compile
(`Dropout`); a reader of the model can skip this file. The timings are in etc/results/step-time.md
("Where a training step's time goes"), etc/results/speed.md ("Against transformers at BERT's sizes",
"The token loss in one softmax") and etc/results/gpu.md ("The third GPU run: dropout's draws").
"""
import math

import torch
import torch.nn.functional as F
from torch import nn


# Key lengths where each path is fastest, forward and backward (etc/results/speed.md, "Attention's dtype by
# length" and "Fine-tuning past 3x"): spelled out below SPELLED_OUT_BELOW (twice the fused kernels'
# speed at 128), the float32 fused kernel from there, the bf16 one from BF16_ATTENTION_FROM.
SPELLED_OUT_BELOW = 160
BF16_ATTENTION_FROM = 256


def attention(q, k, v, attention_mask, dropout: float, causal: bool):
    """Attention on the CPU under bf16 autocast: spelled out with dropout (which the fused kernels
    lack) and on short rows; else the fused kernel, in float32 below BF16_ATTENTION_FROM."""
    length = k.shape[-2]
    if dropout > 0 or length < SPELLED_OUT_BELOW:
        if causal:  # set only without a mask (model.SelfAttention)
            attention_mask = torch.ones(q.shape[-2], length, dtype=torch.bool, device=q.device).tril()
        return spelled_out_attention(q, k, v, attention_mask, dropout)
    if length >= BF16_ATTENTION_FROM:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, is_causal=causal)
    with torch.autocast("cpu", enabled=False):
        y = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=attention_mask,
                                           is_causal=causal)
    return y.to(q.dtype)


def spelled_out_attention(q, k, v, attention_mask, dropout: float):
    """Two bf16 matmuls and a softmax between, dropout by `dropped`. The scale and the mask (as a bias
    of 0 or -inf) go inside the first matmul (baddbmm), and the softmax stays in bf16: PyTorch's bf16
    softmax computes in float32 inside, so its output equals a float32 softmax's rounded, without
    the casts to float32 and back."""
    batch, heads, queries, width = q.shape
    q, k, v = (x.reshape(batch * heads, -1, width) for x in (q, k, v))
    scores = torch.baddbmm(mask_bias(attention_mask, batch, heads, q), q, k.transpose(1, 2),
                           beta=0 if attention_mask is None else 1, alpha=width ** -0.5)
    weights = torch.softmax(scores, dim=-1)
    if dropout > 0:
        weights = dropped(weights, dropout)
    return torch.bmm(weights, v).view(batch, heads, queries, width)


def mask_bias(attention_mask, batch: int, heads: int, like: torch.Tensor) -> torch.Tensor:
    """A mask (True where a query may see a key: [queries, keys], or [batch, 1, 1 or queries, keys])
    as a bias added to the scores: 0 there, -inf elsewhere, in a shape baddbmm broadcasts over
    [batch x heads, queries, keys]. No mask: a zero that baddbmm's beta = 0 ignores."""
    if attention_mask is None:
        return like.new_zeros(())
    bias = torch.zeros(attention_mask.shape, dtype=like.dtype, device=like.device).masked_fill_(
        ~attention_mask, float("-inf"))
    if bias.dim() == 2:
        return bias
    return bias.expand(batch, heads, *bias.shape[2:]).reshape(batch * heads, *bias.shape[2:])


def dropped(x, p: float):
    """Dropout with `dropout_draws`' mask, scaled by the chance it keeps, so the mean stays. Eager,
    two multiplications by `keep_mask`'s 0 or 1, vectorised where torch.where on a bool mask is not
    (a fifth of its time); compiled, a comparison and torch.where, which inductor vectorises where it
    does not the int16 draws' conversion (1.05x the compiled 4 x 256 fine-tuning step on a CPU). The
    same draws keep the same elements either way."""
    if not torch.compiler.is_compiling():
        kept, chance = keep_mask(x.shape, p, x.dtype, x.device)
        return (x * kept).mul_(1 / chance)
    draws, threshold, chance = dropout_draws(x.shape, p, x.device)
    return x if draws is None else torch.where(draws >= threshold, x * (1 / chance), 0)


def keep_mask(shape, p: float, dtype, device) -> tuple[torch.Tensor, float]:
    """1 where an element is kept, else 0, in `dtype`; and the chance it is kept. Clamping a draw to
    the threshold and the value below it makes the 0 or 1 without a bool tensor, whose conversions and
    torch.where run unvectorised on the CPU."""
    draws, threshold, chance = dropout_draws(shape, p, device)
    if draws is None:
        return torch.ones(shape, dtype=dtype, device=device), 1.0
    return draws.clamp(threshold - 1, threshold).sub_(threshold - 1).to(dtype), chance


def dropout_draws(shape, p: float, device) -> tuple[torch.Tensor | None, int, float]:
    """A 16-bit draw for each element (int16, `shape`), the threshold a draw below which drops it, and
    the chance it is kept: 1 - p to 1/65,536. Four draws come from each random 64-bit integer, a
    quarter of the generator's work of torch.rand. No draws (None) where p is below that resolution."""
    dropped_values = min(round(p * 2 ** 16), 2 ** 16 - 1)
    if dropped_values == 0:
        return None, 0, 1.0
    count, threshold = math.prod(shape), dropped_values - 2 ** 15
    words = torch.randint(-2 ** 63, 2 ** 63 - 1, ((count + 3) // 4,), dtype=torch.int64, device=device)
    return words.view(torch.int16)[:count].view(shape), threshold, 1 - dropped_values / 2 ** 16


UNDERFLOW_LOSS = 69.0  # -log(1e-30)


class TokenCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of logits [N, vocab] against labels [N] (`ignore` where none is scored): one
    softmax forward in the logits' dtype (computed in float32 inside), kept as the gradient (the
    probabilities less one at the label, scaled in place), in place of the float32 copy, log_softmax,
    nll's dense zero gradient, log_softmax's backward (which exponentiates again) and the cast back,
    each a pass over the vocabulary. bf16 probabilities move a token's loss by at most 2^-8, less
    than the bf16 logits' own rounding does. Needs a single backward (the probabilities
    become the gradient), as a training loss has. Labels all `ignore` give nan, as F.cross_entropy
    does."""

    @staticmethod
    def forward(ctx, logits, labels, ignore: int):
        scored = labels != ignore
        picked = labels.clamp_min(0).unsqueeze(-1)
        # float16's range would underflow small probabilities; bf16 has float32's
        probabilities = torch.softmax(logits.float() if logits.dtype == torch.float16 else logits, dim=-1)
        losses = -probabilities.gather(-1, picked).squeeze(-1).float().log()
        # a probability keeps its digits down to about 1e-30; below, the loss comes from the logits
        far = losses > UNDERFLOW_LOSS
        if far.any():
            wide = logits[far].float()
            losses[far] = torch.logsumexp(wide, dim=-1) - wide.gather(-1, picked[far]).squeeze(-1)
        count = scored.sum()
        ctx.save_for_backward(probabilities, picked, scored, count)
        ctx.dtype = logits.dtype
        return (losses * scored).sum() / count

    @staticmethod
    def backward(ctx, grad):
        probabilities, picked, scored, count = ctx.saved_tensors
        scale = (grad / count * scored).to(probabilities.dtype)  # one dtype: mixed ones run unvectorised
        gradient = probabilities.mul_(scale.unsqueeze(-1))
        # indexing, not scatter_add_, which copies a bf16 tensor whole to float32 and back
        gradient[torch.arange(len(gradient), device=gradient.device), picked.squeeze(-1)] -= scale
        return gradient.to(ctx.dtype), None, None


def token_cross_entropy(logits, labels, ignore: int):
    return TokenCrossEntropy.apply(logits, labels, ignore)


class Dropout(nn.Dropout):
    """nn.Dropout, drawing its mask with `dropped` on the CPU and under torch.compile anywhere:
    inductor draws a Philox number for every element, in the forward and (by the timings) again in
    the backward, 14% of BERT-base's compiled step on an H200; `dropped` draws a quarter of the
    numbers, once. Eager on a GPU, F.dropout's one fused kernel is the fastest."""

    def forward(self, x):
        if self.training and self.p > 0 and (x.device.type == "cpu" or torch.compiler.is_compiling()):
            return dropped(x, self.p)
        return super().forward(x)
