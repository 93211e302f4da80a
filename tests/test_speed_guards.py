"""Correctness guards for the speed levers: each fast path must compute what the plain one does."""
import copy

import pytest
import torch

from masking import MaskingRule, mask_tokens
from model import BertForMaskedLM, ModelConfig, token_hits

SPECIAL = torch.arange(5)


def tiny_model(seed: int = 0) -> BertForMaskedLM:
    torch.manual_seed(seed)
    return BertForMaskedLM(ModelConfig(vocab_size=500, max_len=32, d_model=64, heads=2, n_layer=2, d_ff=128,
                                       dropout=0.0))


def batches(count: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    for _ in range(count):
        ids = torch.randint(5, 60, (8, 32), generator=generator)  # a small working vocabulary: learnable
        ids[:, 0], ids[:, -1] = 2, 3
        yield mask_tokens(ids, SPECIAL, 4, 500, MaskingRule(), generator)


def train(model, optimizer, data, autocast_dtype=None) -> list[float]:
    losses = []
    for inputs, positions, labels in data:
        with torch.autocast("cpu", dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            _, loss = model(inputs, positions, labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def test_compiled_and_eager_losses_agree():
    eager = tiny_model()
    compiled = torch.compile(copy.deepcopy(eager))
    for inputs, positions, labels in batches(2):
        _, expected = eager(inputs, positions, labels)
        _, actual = compiled(inputs, positions, labels)
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)


def test_bf16_autocast_tracks_fp32_over_50_steps():
    full = tiny_model()
    half = copy.deepcopy(full)
    fp32 = train(full, torch.optim.AdamW(full.parameters(), lr=1e-3), batches(50))
    bf16 = train(half, torch.optim.AdamW(half.parameters(), lr=1e-3), batches(50), torch.bfloat16)
    assert fp32[-1] < fp32[0] - 1.0  # it learned something, so tracking means something
    for step in (0, 24, 49):
        assert abs(bf16[step] - fp32[step]) < 0.05 * fp32[step], step


@pytest.mark.parametrize("steps", [10])
def test_fused_and_unfused_adamw_agree(steps):
    plain = tiny_model()
    fused = copy.deepcopy(plain)
    train(plain, torch.optim.AdamW(plain.parameters(), lr=1e-3, weight_decay=0.01), batches(steps))
    train(fused, torch.optim.AdamW(fused.parameters(), lr=1e-3, weight_decay=0.01, fused=True), batches(steps))
    for (name, a), b in zip(plain.named_parameters(), fused.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: set_sync_debug_mode watches GPU syncs")
def test_the_training_step_never_waits_for_the_gpu(mlm_workdir, monkeypatch):
    """Between log lines the step (masking, forward, loss, backward, clip, AdamW) must not make the
    host wait for the GPU: any synchronising call (.item(), nonzero, a host copy) raises here."""
    import main
    from trainer import Trainer
    original, steps = Trainer.train_step, []

    def watched_step(self, run, batches, meter):
        if steps:  # the first step may allocate and initialise; every later one is watched
            torch.cuda.set_sync_debug_mode("error")
        try:
            original(self, run, batches, meter)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        steps.append(run.step)

    monkeypatch.setattr(Trainer, "train_step", watched_step)
    main.main(["--device", "cuda", "--dtype", "bfloat16", "--max-iters", "6", "--log-interval", "100",
               "--val-interval", "100", "--async-to-device", "true"])
    assert len(steps) == 6


def test_token_hits_count_the_labels_whose_logit_is_largest():
    logits = torch.tensor([[[0.1, 0.9, 0.0], [0.5, 0.2, 0.3], [0.2, 0.2, 0.1], [0.0, 0.0, 1.0]]])
    labels = torch.tensor([[1, 2, 0, -100]])  # right, wrong, a tie for the top (counts), not scored
    assert token_hits(logits, labels).item() == 2
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 20, 300, generator=generator)
    labels = torch.randint(0, 300, (4, 20), generator=generator)
    labels[:, ::3] = -100
    expected = ((logits.argmax(-1) == labels) & (labels != -100)).sum()
    assert token_hits(logits, labels).item() == expected.item()
    labels = logits.argmax(-1)
    assert token_hits(logits.bfloat16(), labels).item() >= 80  # bf16 ties only add hits
