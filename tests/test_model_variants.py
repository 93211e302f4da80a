"""The model variants of the experiments: norms, rotary positions, GEGLU, causal attention, NSP head."""
import itertools

import numpy as np
import pytest
import torch

from masking import MaskingRule, mask_tokens
from model import (IGNORE_INDEX, BertForCausalLM, BertForMaskedLM, BertForPreTraining, ElectraForPreTraining,
                   ModelConfig, Rotary, count_parameters, rotate, token_positions)
from vocab import load_vocab

VARIANTS = [dict(norm=norm, position=position, feed_forward=feed_forward)
            for norm, position, feed_forward in itertools.product(("postln", "preln", "rmsnorm"),
                                                                 ("learned", "rope"), ("gelu", "geglu"))]


def tiny_config(vocab_size: int, **changes) -> ModelConfig:
    values = dict(vocab_size=vocab_size, max_len=64, d_model=64, heads=4, n_layer=2, d_ff=128, dropout=0.0)
    return ModelConfig(**{**values, **changes})


@pytest.fixture(scope="module")
def review_ids(imdb_reviews, vocab_dir) -> tuple[torch.Tensor, object]:
    """32 rows of 64 real word pieces, [CLS] ... [SEP]."""
    vocab = load_vocab(vocab_dir)
    pieces = np.concatenate([np.array(ids) for ids in vocab.encode(imdb_reviews[:300])])
    rows = torch.from_numpy(pieces[:32 * 62].astype(np.int64)).view(32, 62)
    ids = torch.cat([torch.full((32, 1), vocab.cls_id), rows, torch.full((32, 1), vocab.sep_id)], dim=1)
    return ids, vocab


def train_losses(model, step, steps: int = 30) -> list[float]:
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    losses = []
    for _ in range(steps):
        loss = step(model)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(v.values()))
def test_every_variant_learns_masked_language_modelling(variant, review_ids):
    ids, vocab = review_ids
    torch.manual_seed(0)
    model = BertForMaskedLM(tiny_config(vocab.size, **variant))
    inputs, positions, labels = mask_tokens(ids, torch.tensor(vocab.special_ids), vocab.mask_id, vocab.size,
                                            MaskingRule(), torch.Generator().manual_seed(0))
    losses = train_losses(model, lambda m: m(inputs, positions, labels)[1])
    assert np.mean(losses[-5:]) < losses[0] - 1.0, losses


def test_causal_model_learns_next_tokens(review_ids):
    ids, vocab = review_ids
    torch.manual_seed(0)
    model = BertForCausalLM(tiny_config(vocab.size, causal=True, norm="preln", position="rope"))
    labels = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], IGNORE_INDEX)], dim=1)
    losses = train_losses(model, lambda m: m(ids, labels)[1])
    assert np.mean(losses[-5:]) < losses[0] - 1.0, losses


@pytest.mark.parametrize("position", ["learned", "rope"])
def test_causal_attention_cannot_see_the_future(position):
    torch.manual_seed(0)
    model = BertForCausalLM(tiny_config(300, causal=True, position=position)).eval()
    ids = torch.randint(5, 300, (2, 20))
    changed = ids.clone()
    changed[:, 12:] = torch.randint(5, 300, (2, 8))
    before, _ = model(ids)
    after, _ = model(changed)
    torch.testing.assert_close(after[:, :12], before[:, :12])
    assert not torch.allclose(after[:, 12:], before[:, 12:])
    # The same with a padding mask, which takes the other code path (an explicit mask).
    real = torch.ones_like(ids, dtype=torch.bool)
    real[1, 16:] = False
    masked_before, _ = model(ids, attention_mask=real)
    masked_after, _ = model(changed, attention_mask=real)
    torch.testing.assert_close(masked_after[:, :12], masked_before[:, :12])
    torch.testing.assert_close(masked_before[0], before[0], rtol=1e-5, atol=1e-5)


def test_bidirectional_attention_does_see_later_tokens():
    torch.manual_seed(0)
    model = BertForMaskedLM(tiny_config(300)).eval()
    ids = torch.randint(5, 300, (1, 20))
    changed = ids.clone()
    changed[:, 15] = (ids[:, 15] + 1 - 5) % 295 + 5
    assert not torch.allclose(model.encoder(ids)[:, :10], model.encoder(changed)[:, :10])


def test_rotary_scores_depend_on_distance_only():
    rotary = Rotary(tiny_config(300, position="rope"))
    generator = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, 4, 1, 16, generator=generator)  # one query and one key vector per head

    def score(query_position: int, key_position: int) -> torch.Tensor:
        rotated_q = rotate(q.expand(1, 4, 1, 16), rotary(1, torch.tensor([[query_position]])))
        rotated_k = rotate(k.expand(1, 4, 1, 16), rotary(1, torch.tensor([[key_position]])))
        return (rotated_q * rotated_k).sum(-1)

    for shift in (1, 7, 40):
        torch.testing.assert_close(score(3 + shift, 10 + shift), score(3, 10), rtol=1e-4, atol=1e-5)
    assert not torch.allclose(score(3, 10), score(3, 20), atol=1e-3)  # a different distance is seen


def test_rope_theta_sets_the_wavelengths_of_the_rotary_angles():
    """Pair i of a head turns by p / theta^(2i / width) at position p: the first pair by p radians
    whatever theta, the last slower the larger theta is (a longer context's base)."""
    for theta in (10_000.0, 160_000.0):
        rotary = Rotary(tiny_config(300, position="rope", rope_theta=theta))
        width = rotary.cos.shape[-1]
        pair = torch.arange(width // 2)
        expected = 40 / theta ** (2 * pair / width)
        torch.testing.assert_close(rotary.cos[40], torch.cat([expected, expected]).cos())
        torch.testing.assert_close(rotary.sin[40], torch.cat([expected, expected]).sin())


def test_rope_encoder_is_invariant_to_where_a_text_starts():
    """Self-attention with rotary positions and no position table depends on relative positions
    only: moving the window over a longer sequence does not change what a token sees of the
    others, shown here by the same tokens at offsets 0 and 5 of the rotary angles."""
    torch.manual_seed(0)
    config = tiny_config(300, position="rope", n_layer=1)
    model = BertForMaskedLM(config).eval()
    assert model.encoder.embeddings.position is None
    ids = torch.randint(5, 300, (1, 16))
    reference = model.encoder(ids)
    rotary = model.encoder.rotary
    original = rotary.forward
    rotary.forward = lambda length, positions=None: original(length, torch.arange(length)[None] + 5)
    torch.testing.assert_close(model.encoder(ids), reference, rtol=1e-4, atol=1e-4)
    # Learned positions are absolute: the same shift changes the output.
    learned = BertForMaskedLM(tiny_config(300, n_layer=1)).eval()
    table = learned.encoder.embeddings.position.weight
    shifted = learned.encoder(ids)
    with torch.no_grad():
        table.copy_(table.roll(-5, dims=0))
    assert not torch.allclose(learned.encoder(ids), shifted, atol=1e-3)


def test_pre_norm_variants_normalise_the_output():
    for norm, kind in (("preln", torch.nn.LayerNorm), ("rmsnorm", torch.nn.RMSNorm)):
        model = BertForMaskedLM(tiny_config(300, norm=norm))
        assert isinstance(model.encoder.final_norm, kind)
        assert all(isinstance(layer.attention_norm, kind) for layer in model.encoder.layers)
    assert BertForMaskedLM(tiny_config(300)).encoder.final_norm is None


def test_geglu_at_two_thirds_width_has_the_parameters_of_gelu():
    gelu = BertForMaskedLM(tiny_config(300, d_ff=4 * 96, d_model=96))
    geglu = BertForMaskedLM(tiny_config(300, d_ff=8 * 96 // 3, d_model=96, feed_forward="geglu"))
    difference = count_parameters(geglu) - count_parameters(gelu)
    assert abs(difference) <= 2 * 8 * 96  # biases of the wider gate only


def test_pretraining_model_adds_a_sentence_loss():
    torch.manual_seed(0)
    config = tiny_config(300, sentence_classes=2)
    model = BertForPreTraining(config).eval()
    ids = torch.randint(5, 300, (4, 32))
    segments = (torch.arange(32) >= 16).long().expand(4, 32)
    inputs, positions, labels = mask_tokens(ids, torch.arange(5), 4, 300, MaskingRule(),
                                            torch.Generator().manual_seed(0))
    sentence_labels = torch.tensor([0, 1, 0, 1])
    logits, sentence_logits, loss = model(inputs, positions, labels, segment_ids=segments,
                                          sentence_labels=sentence_labels)
    mlm_only = BertForMaskedLM(config).eval()
    mlm_only.load_state_dict(model.state_dict(), strict=False)
    _, mlm_loss = mlm_only(inputs, positions, labels, segment_ids=segments)
    sentence_loss = torch.nn.functional.cross_entropy(sentence_logits, sentence_labels)
    assert sentence_logits.shape == (4, 2)
    torch.testing.assert_close(loss, mlm_loss + sentence_loss)


@pytest.mark.parametrize("settings", [dict(position="learned"), dict(position="sinusoidal", norm="preln"),
                                      dict(position="rope", norm="rmsnorm", feed_forward="geglu"),
                                      dict(position="rope", causal=True), dict(position="learned", causal=True)])
def test_a_row_of_documents_apart_encodes_each_as_it_is_alone(settings):
    """[CLS] a [SEP] b [SEP] [PAD]: with document ids, a's tokens come out as [CLS] a [SEP] alone
    and b's as b [SEP] alone (positions from 0 again), whatever the position kind; padding too."""
    torch.manual_seed(0)
    model = (BertForCausalLM if settings.get("causal") else BertForMaskedLM)(tiny_config(300, **settings)).eval()
    first, second = torch.randint(5, 300, (1, 9)), torch.randint(5, 300, (1, 6))
    first[0, 0], first[0, -1], second[0, -1] = 2, 3, 3  # [CLS] ... [SEP], ... [SEP]
    row = torch.cat([first, second, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    real = row != 0
    documents = torch.tensor([[0] * 9 + [1] * 6 + [1] * 3])
    with torch.no_grad():
        packed = model.encoder(row, real, document_ids=documents)
        torch.testing.assert_close(packed[:, :9], model.encoder(first), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(packed[:, 9:15], model.encoder(second), rtol=1e-5, atol=1e-5)
        assert torch.isfinite(packed).all()  # padding rows have keys to see
        joined = model.encoder(row, real)
    assert not torch.allclose(joined[:, 9:15], packed[:, 9:15], atol=1e-3)  # without the ids they mix


@pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile")
@pytest.mark.parametrize("causal, compiled", [(False, False), (True, False), (False, True)])
def test_documents_apart_through_a_flex_attention_block_mask_encode_as_through_the_dense_mask(causal, compiled,
                                                                                              monkeypatch):
    """On a GPU, documents apart go through FlexAttention's block mask; forced here on the CPU
    (forward only: it has no backward on the CPU), the encoder's outputs equal those of the dense
    mask, padding and causality included, in eager mode and in a compiled model (where inductor's CPU
    kernel once misread strided inputs). gpu_check.py compares the gradients on a GPU. One layer: each
    reads the same mask, and compiling a second costs seconds."""
    import model as model_module
    from torch.nn.attention.flex_attention import flex_attention
    torch.manual_seed(0)
    model = (BertForCausalLM if causal else BertForMaskedLM)(tiny_config(300, position="rope", norm="preln",
                                                                         causal=causal, n_layer=1)).eval()
    rows = torch.randint(5, 300, (2, 64))
    real = torch.ones(2, 64, dtype=torch.bool)
    real[1, 57:] = False
    documents = torch.tensor([[0] * 12 + [1] * 20 + [2] * 32, [0] * 25 + [1] * 39])
    with torch.no_grad():
        dense = model.encoder(rows, real, document_ids=documents)
        monkeypatch.setattr(model_module, "uses_block_mask", lambda device, dropout: True)
        if not compiled:  # the kernel in eager mode: slow, but the reference for the mask's logic
            monkeypatch.setattr(model_module, "flex_attention", lambda: flex_attention)
        assert not torch.is_tensor(model.encoder.attention_mask(real, documents))  # a BlockMask
        encoder = torch.compile(model.encoder) if compiled else model.encoder
        flex = encoder(rows, real, document_ids=documents)
    torch.testing.assert_close(flex, dense, rtol=1e-4, atol=1e-5)


def test_the_block_mask_is_for_gpus_and_attention_without_dropout():
    from model import uses_block_mask
    assert uses_block_mask(torch.device("cuda"), 0.0)
    assert not uses_block_mask(torch.device("cuda"), 0.1)  # FlexAttention has no attention dropout
    assert not uses_block_mask(torch.device("cpu"), 0.0)  # FlexAttention has no backward on the CPU


def test_electra_keeps_documents_apart_in_its_generator_and_discriminator():
    torch.manual_seed(0)
    model = ElectraForPreTraining(tiny_config(300, position="rope", norm="preln", generator_heads=2)).eval()
    first, second = torch.randint(5, 300, (1, 8)), torch.randint(5, 300, (1, 8))
    row = torch.cat([first, second], dim=1)
    positions, labels = torch.tensor([[10]]), torch.tensor([[int(row[0, 10])]])
    masked = row.clone()
    masked[0, 10] = 4
    documents = torch.tensor([[0] * 8 + [1] * 8])
    with torch.no_grad():
        logits, detector, _ = model(masked, positions, labels, row, sampling=torch.Generator().manual_seed(0),
                                    document_ids=documents)
        changed = masked.clone()
        changed[0, :8] = torch.randint(5, 300, (8,))  # another first document: the second's outputs stay
        again, detector_again, _ = model(changed, positions, labels, changed, document_ids=documents,
                                         sampling=torch.Generator().manual_seed(0))
    torch.testing.assert_close(again, logits)
    torch.testing.assert_close(detector_again[:, 8:], detector[:, 8:])


def test_token_positions_start_again_at_each_document():
    documents = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2], [0, 0, 0, 0, 0, 0, 0, 0]])
    assert token_positions(documents).tolist() == [[0, 1, 2, 0, 1, 0, 1, 2], list(range(8))]
    assert token_positions(None) is None
