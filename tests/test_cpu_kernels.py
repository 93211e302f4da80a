"""The CPU paths of attention, dropout and the token loss (cpu_kernels.py): the same results as
PyTorch's own."""
import pytest
import torch
import torch.nn.functional as F

import cpu_kernels
from cpu_kernels import BF16_ATTENTION_FROM, SPELLED_OUT_BELOW, Dropout, keep_mask, token_cross_entropy
from model import IGNORE_INDEX, attend, token_loss


def test_cpu_dropout_zeroes_its_share_and_scales_the_rest_in_training_only():
    dropout = Dropout(0.2)
    x = torch.ones(200, 500, dtype=torch.bfloat16)
    y = dropout(x)
    assert y.dtype == torch.bfloat16
    assert set(y.unique().tolist()) == {0.0, 1.25}
    assert (y == 0).float().mean().item() == pytest.approx(0.2, abs=0.01)
    assert y.float().mean().item() == pytest.approx(1.0, abs=0.02)
    assert torch.equal(dropout.eval()(x), x)


def test_cpu_dropout_passes_the_gradient_of_the_kept_elements_scaled():
    x = torch.randn(64, 300, requires_grad=True)
    y = Dropout(0.25)(x)
    y.backward(torch.ones_like(y))
    kept = y != 0
    torch.testing.assert_close(y[kept], x[kept] / 0.75)
    torch.testing.assert_close(x.grad, kept.float() / 0.75)


def test_dropout_draws_its_own_mask_on_the_cpu_and_under_compile_only(monkeypatch):
    """A GPU's eager F.dropout is one fused kernel; under torch.compile inductor's per-element draws
    cost 14% of BERT-base's step on an H200, so `dropped` takes over there."""
    drawn = []
    monkeypatch.setattr(cpu_kernels, "dropped", lambda x, p: drawn.append(x.device.type) or x)
    on_another_device = torch.ones(4, 8, device="meta")
    Dropout(0.1)(on_another_device)
    Dropout(0.1)(torch.ones(4, 8))
    assert drawn == ["cpu"]
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    Dropout(0.1)(on_another_device)
    Dropout(0.1).eval()(on_another_device)
    Dropout(0.0)(on_another_device)
    assert drawn == ["cpu", "meta"]


def test_dropout_under_compile_zeroes_its_share_and_passes_the_kept_gradient():
    """The path a compiled model takes on every device: inductor's own randint over the whole int64
    range, viewed as 16-bit draws, keeps each element with its chance."""
    torch.manual_seed(0)
    x = torch.ones(256, 512, requires_grad=True)
    y = torch.compile(Dropout(0.2))(x)
    y.backward(torch.ones_like(y))
    kept, chance = y != 0, 1 - round(0.2 * 2 ** 16) / 2 ** 16  # the 16-bit draws' chance: 0.2 to 1/65,536
    assert y.unique().tolist() == [0.0, pytest.approx(1 / chance)]
    assert (~kept).float().mean().item() == pytest.approx(0.2, abs=0.01)
    assert (~kept).float().view(-1, 4).mean(0).sub(0.2).abs().max().item() < 0.02  # each lane of a word
    torch.testing.assert_close(x.grad, kept.float() / chance)


@pytest.mark.parametrize("p", [0.1, 0.5, 2 ** -18])
def test_compiled_dropout_by_where_equals_the_eager_masks_multiplications_on_the_same_draws(monkeypatch, p):
    """What inductor runs (a comparison and torch.where) against eager's 0-or-1 mask, on the same
    draws: the same values, bit for bit (a dropped negative element is +0, not -0), and the same
    gradient."""
    x = torch.randn(64, 300, dtype=torch.bfloat16)
    results = []
    for compiling in (False, True):
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda compiling=compiling: compiling)
        torch.manual_seed(3)
        leaf = x.clone().requires_grad_()
        y = cpu_kernels.dropped(leaf, p)
        y.backward(torch.ones_like(y))
        results.append((y.detach(), leaf.grad))
    (eager, eager_grad), (compiled, compiled_grad) = results
    assert torch.equal(compiled, eager) and torch.equal(compiled_grad, eager_grad)
    assert p < 2 ** -17 or eager.eq(0).any()


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_mask_keeps_each_element_with_its_chance_independently(p):
    torch.manual_seed(0)
    mask, chance = keep_mask((1000, 1000), p, torch.float32, "cpu")
    assert chance == pytest.approx(1 - p, abs=2 ** -16)
    assert mask.dtype == torch.float32 and set(mask.unique().tolist()) == {0.0, 1.0}
    assert mask.float().mean().item() == pytest.approx(chance, abs=0.002)  # 4 sd of a million draws
    by_lane = mask.view(-1, 4).float().mean(0)  # the four 16-bit draws of one 64-bit word each keep alike
    torch.testing.assert_close(by_lane, torch.full((4,), chance), rtol=0, atol=0.005)
    pairs = mask.view(-1, 2).float()  # neighbours, drawn from one word, are independent
    assert (pairs[:, 0] * pairs[:, 1]).mean().item() == pytest.approx(chance ** 2, abs=0.003)
    torch.manual_seed(0)
    assert torch.equal(keep_mask((1000, 1000), p, torch.float32, "cpu")[0], mask)  # the global generator decides
    assert not torch.equal(keep_mask((1000, 1000), p, torch.float32, "cpu")[0], mask)


def test_keep_mask_keeps_everything_below_its_resolution_and_drops_all_but_one_in_65536_at_most():
    kept, chance = keep_mask((8, 8), 2 ** -18, torch.bfloat16, "cpu")
    assert chance == 1.0 and kept.dtype == torch.bfloat16 and kept.eq(1).all()
    torch.manual_seed(0)
    kept, chance = keep_mask((1000, 1000), 1 - 2 ** -20, torch.float32, "cpu")
    assert chance == 2 ** -16 and kept.sum().item() < 60  # 15 expected


def reference_attention_with_dropout(q, k, v, mask, dropout: float, seed: int):
    """Float32 attention with the dropout mask attention_with_dropout draws after manual_seed(seed)."""
    scores = (q.float() @ k.float().transpose(-2, -1)) / q.shape[-1] ** 0.5
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    torch.manual_seed(seed)
    kept, chance = keep_mask(weights.shape, dropout, weights.dtype, weights.device)
    return (weights * kept / chance) @ v.float()


def queries_keys_values_and_mask(length: int, padded_from: int):
    """bf16 q, k and v [2 rows, 2 heads, length, 8], and a padding mask hiding the second row's keys
    from padded_from on."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, length, 8, generator=generator).bfloat16() for _ in range(3))
    mask = torch.ones(2, 1, 1, length, dtype=torch.bool)
    mask[1, ..., padded_from:] = False
    return q, k, v, mask


def attend_with_dropout_after_seed(q, k, v, mask, causal: bool, seed: int = 5):
    """attend with dropout 0.25 under bf16 autocast, the global generator seeded first."""
    torch.manual_seed(seed)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return attend(q, k, v, mask, 0.25, causal)


def test_cpu_attention_with_dropout_under_bf16_autocast_drops_weights_and_matches_float32():
    q, k, v, mask = queries_keys_values_and_mask(16, padded_from=12)
    y = attend_with_dropout_after_seed(q, k, v, mask, False)
    expected = reference_attention_with_dropout(q, k, v, mask, 0.25, seed=5)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), expected, rtol=0.05, atol=0.05)
    without_dropout = reference_attention_with_dropout(q, k, v, mask, 0.0, seed=5)
    assert (y.float() - without_dropout).abs().max() > 0.1  # the dropout was applied
    y_masked_values_changed = attend_with_dropout_after_seed(q, k, v.index_fill(2, torch.arange(12, 16), 9.0),
                                                             mask, False)
    torch.testing.assert_close(y_masked_values_changed[1], y[1], rtol=0, atol=0)  # padded keys get no weight
    outputs = [attend_with_dropout_after_seed(q, k, values, None, True)
               for values in (v, v.index_fill(2, torch.arange(8, 16), 9.0))]
    torch.testing.assert_close(outputs[1][:, :, :8], outputs[0][:, :, :8], rtol=0, atol=0)  # causal: no later keys
    assert not torch.equal(outputs[1][:, :, 8:], outputs[0][:, :, 8:])


def test_cpu_attention_on_short_rows_under_bf16_autocast_is_spelled_out_and_matches_float32():
    """Outputs and gradients within bf16's precision of float32 attention on the same inputs; padded
    keys and, causally, later keys have no effect at all."""
    q, k, v, mask = queries_keys_values_and_mask(16, padded_from=12)
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).bfloat16()
    inputs = [x.clone().requires_grad_() for x in (q, k, v)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = attend(*inputs, mask, 0.0, False)
    y.backward(grad)
    in_float32 = [x.float().requires_grad_() for x in (q, k, v)]
    expected = torch.nn.functional.scaled_dot_product_attention(*in_float32, attn_mask=mask)
    expected.backward(grad.float())
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), expected, rtol=0.02, atol=0.02)  # bf16's precision
    for ours, theirs in zip(inputs, in_float32):
        assert ours.grad.dtype == torch.bfloat16
        torch.testing.assert_close(ours.grad.float(), theirs.grad, rtol=0.02, atol=0.02)
    padded_changed = v.clone()
    padded_changed[1, :, 12:] = 9.0
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.testing.assert_close(attend(q, k, padded_changed, mask, 0.0, False), y.detach(), rtol=0, atol=0)
    outputs = []
    for values in (v, v.index_fill(2, torch.arange(8, 16), 9.0)):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outputs.append(attend(q, k, values, None, 0.0, True))
    torch.testing.assert_close(outputs[1][:, :, :8], outputs[0][:, :, :8], rtol=0, atol=0)  # causal: no later keys
    assert not torch.equal(outputs[1][:, :, 8:], outputs[0][:, :, 8:])


def test_cpu_attention_on_middle_rows_under_bf16_autocast_runs_the_fused_kernel_in_float32():
    q, k, v, mask = queries_keys_values_and_mask(SPELLED_OUT_BELOW, padded_from=100)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = attend(q, k, v, mask, 0.0, False)
    expected = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y, expected.bfloat16(), rtol=0, atol=0)


def test_cpu_attention_on_long_rows_under_bf16_autocast_runs_the_bf16_kernel():
    q, k, v, mask = queries_keys_values_and_mask(BF16_ATTENTION_FROM, padded_from=200)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = attend(q, k, v, mask, 0.0, False)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y, torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                               rtol=0, atol=0)
    in_float32 = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
    torch.testing.assert_close(y.float(), in_float32, rtol=0.02, atol=0.02)  # bf16's precision


def logits_and_labels(dtype: torch.dtype, rows: int = 12, vocab: int = 50):
    """Logits [rows, vocab] spread wide (a label far below the largest), labels with every third ignored."""
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(rows, vocab, generator=generator) * 8).to(dtype)
    labels = torch.randint(0, vocab, (rows,), generator=generator)
    labels[::3] = IGNORE_INDEX
    return logits, labels


def loss_and_gradient(loss_of, logits, labels):
    logits = logits.clone().requires_grad_()
    loss = loss_of(logits, labels)
    (loss * 3).backward()  # an upstream gradient other than one reaches the logits scaled
    return loss, logits.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_token_cross_entropy_equals_pytorchs_loss_and_gradient_in_the_logits_dtype(dtype):
    logits, labels = logits_and_labels(dtype)
    loss, gradient = loss_and_gradient(lambda x, y: token_cross_entropy(x, y, IGNORE_INDEX), logits, labels)
    expected_loss, expected_gradient = loss_and_gradient(
        lambda x, y: F.cross_entropy(x.float(), y, ignore_index=IGNORE_INDEX), logits, labels)
    assert loss.dtype == torch.float32 and gradient.dtype == dtype
    # bf16: each token's probability rounded (at most 2^-8 off its loss, half a bf16 step), the
    # gradient rounded twice (a bf16 step apart, 2^-7 relative, at most: two allowed); float16:
    # probabilities in float32, the gradient rounded once, as PyTorch's
    loss_tolerance, gradient_tolerance = {torch.float32: (1e-5, 1e-6), torch.bfloat16: (2 ** -8, 2 ** -6),
                                          torch.float16: (1e-5, 2 ** -10)}[dtype]
    torch.testing.assert_close(loss, expected_loss, rtol=0, atol=loss_tolerance)
    torch.testing.assert_close(gradient.float(), expected_gradient.float(), rtol=gradient_tolerance, atol=1e-6)
    assert gradient[::3].abs().max() == 0  # ignored rows get none


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_cross_entropy_is_exact_for_a_label_far_below_the_largest_logit_underflowed_or_not(dtype):
    logits = torch.tensor([[0.0, 60.0, -300.0]], dtype=dtype)  # each exact in bf16 too
    near = 6e-5 if dtype == torch.float32 else 2 ** -8  # float32's digits at 60; a bf16 probability's rounding
    # e^-60 is a probability in either dtype; e^-360 is 0, and the loss comes from the logits
    for label, expected, tolerance in ((0, 60.0, near), (2, 360.0, 4e-4)):
        loss = token_cross_entropy(logits, torch.tensor([label]), IGNORE_INDEX)
        torch.testing.assert_close(loss, torch.tensor(expected), rtol=0, atol=tolerance)


def test_token_cross_entropy_over_no_labelled_token_is_nan_as_pytorchs():
    logits, labels = logits_and_labels(torch.float32)
    assert token_cross_entropy(logits, torch.full_like(labels, IGNORE_INDEX), IGNORE_INDEX).isnan()


def test_token_loss_uses_the_cpu_kernel_in_eager_mode_and_pytorchs_when_compiled(monkeypatch):
    logits, labels = logits_and_labels(torch.float32)
    called = []
    monkeypatch.setattr("model.token_cross_entropy", lambda *args: called.append(args) or torch.tensor(0.0))
    token_loss(logits[None], labels[None])
    assert len(called) == 1
    monkeypatch.setattr("torch.compiler.is_compiling", lambda: True)
    torch.testing.assert_close(token_loss(logits[None], labels[None]),
                               F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX))
