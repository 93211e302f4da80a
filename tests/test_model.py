"""The model: masked-only MLM loss, padding mask, initialisation, classifier head, its size from its shape."""
import pytest
import torch
import torch.nn.functional as F

from masking import MaskingRule, mask_tokens
from model import (IGNORE_INDEX, BertForMaskedLM, BertForPreTraining, BertForSequenceClassification,
                   BertForTokenClassification, ElectraForPreTraining, ModelConfig, at_positions, count_parameters,
                   estimated_parameters, flops_per_token)


def small_config(**changes) -> ModelConfig:
    values = dict(vocab_size=300, max_len=32, d_model=64, heads=4, n_layer=2, d_ff=128, dropout=0.0)
    return ModelConfig(**{**values, **changes})


def masked_batch(config: ModelConfig, batch: int = 4, length: int = 32, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, config.vocab_size, (batch, length), generator=generator)
    ids[:, 0], ids[:, -1] = 2, 3
    return mask_tokens(ids, torch.arange(5), 4, config.vocab_size, MaskingRule(), generator)


def test_masked_only_loss_equals_full_vocabulary_loss():
    torch.manual_seed(0)
    config = small_config()
    model = BertForMaskedLM(config).eval()
    inputs, positions, labels = masked_batch(config)
    _, loss = model(inputs, positions, labels)

    # The reference: score every position, with labels only where masked.
    logits_everywhere = model.head(model.encoder(inputs))
    full_labels = torch.full_like(inputs, IGNORE_INDEX)
    used = labels != IGNORE_INDEX
    rows = torch.arange(inputs.shape[0])[:, None].expand_as(positions)
    full_labels[rows[used], positions[used]] = labels[used]
    reference = F.cross_entropy(logits_everywhere.flatten(0, 1), full_labels.flatten(), ignore_index=IGNORE_INDEX)
    torch.testing.assert_close(loss, reference, rtol=1e-5, atol=1e-6)


LAYOUTS = [{}, dict(norm="preln", position="rope"), dict(norm="rmsnorm", feed_forward="geglu"),
           dict(position="sinusoidal")]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_last_layer_on_the_rows_alone_gives_their_states_of_the_whole_encoder(layout):
    torch.manual_seed(0)
    config = small_config(**layout)
    model = BertForMaskedLM(config).eval()
    inputs, positions, labels = masked_batch(config)
    real = torch.ones_like(inputs, dtype=torch.bool)
    real[1, 20:] = False
    documents = (torch.arange(32) >= 12).long().expand(4, -1)  # two documents packed apart in each row
    for extra in (dict(), dict(attention_mask=real), dict(attention_mask=real, document_ids=documents)):
        everywhere = model.encoder(inputs, **extra)
        rows = model.encoder(inputs, **extra, rows=positions)
        assert rows.shape == (*positions.shape, config.d_model)
        torch.testing.assert_close(rows, at_positions(everywhere, positions), rtol=1e-5, atol=1e-5)
    logits, loss = model(inputs, positions, labels, attention_mask=real)
    torch.testing.assert_close(logits, model.head(at_positions(model.encoder(inputs, real), positions)))


def test_the_rows_of_a_causal_encoder_are_its_states_there():
    torch.manual_seed(0)
    model = BertForMaskedLM(small_config(causal=True)).eval()
    inputs, positions, _ = masked_batch(model.config)
    torch.testing.assert_close(model.encoder(inputs, rows=positions), at_positions(model.encoder(inputs), positions))


def test_models_reading_some_rows_give_what_the_whole_encoder_gives():
    torch.manual_seed(0)
    inputs, positions, labels = masked_batch(small_config())
    real = torch.ones_like(inputs, dtype=torch.bool)
    real[2, 9:] = False
    classifier = BertForSequenceClassification(small_config(num_labels=3)).eval()
    expected = classifier.classifier(torch.tanh(classifier.pooler(classifier.encoder(inputs, real)[:, 0])))
    torch.testing.assert_close(classifier(inputs, attention_mask=real)[0], expected)
    pretraining = BertForPreTraining(small_config(sentence_classes=2)).eval()
    hidden = pretraining.encoder(inputs, real)
    masked_logits, sentence_logits, _ = pretraining(inputs, positions, attention_mask=real)
    torch.testing.assert_close(masked_logits, pretraining.head(at_positions(hidden, positions)))
    torch.testing.assert_close(sentence_logits, pretraining.classify_pair(hidden))
    electra = ElectraForPreTraining(small_config(generator_heads=2)).eval()
    generated = electra.generator(None, real, embedded=electra.generator_input(electra.encoder.embeddings(inputs)))
    generator_logits, _, _ = electra(inputs, positions, labels, inputs, attention_mask=real)
    torch.testing.assert_close(generator_logits, electra.generator_head(at_positions(generated, positions)))


def test_training_on_rows_reaches_every_weight_of_the_last_layer():
    torch.manual_seed(0)
    config = small_config(dropout=0.1)
    model = BertForMaskedLM(config)
    inputs, positions, labels = masked_batch(config)
    model(inputs, positions, labels)[1].backward()
    qkv = model.encoder.layers[-1].attention.qkv.weight.grad
    assert all(part.abs().sum() > 0 for part in qkv.chunk(3))  # q from the rows, k and v from every token


def test_padding_does_not_change_real_tokens():
    torch.manual_seed(0)
    config = small_config()
    model = BertForMaskedLM(config).eval()
    ids = torch.randint(5, config.vocab_size, (1, 20))
    padded = torch.cat([ids, torch.zeros(1, 12, dtype=torch.long)], dim=1)
    mask = padded != 0
    alone = model.encoder(ids)
    with_padding = model.encoder(padded, attention_mask=mask)
    torch.testing.assert_close(with_padding[:, :20], alone, rtol=1e-5, atol=1e-5)
    # Without the mask the padding leaks into the real tokens: the mask is what protects them.
    assert not torch.allclose(model.encoder(padded)[:, :20], alone, atol=1e-4)


def test_initialisation_follows_bert():
    torch.manual_seed(0)
    model = BertForMaskedLM(small_config(d_model=256, d_ff=1024, vocab_size=3000))
    up = model.encoder.layers[0].feed_forward.up
    assert abs(up.weight.std().item() - 0.02) < 0.002
    assert up.bias.abs().max() == 0
    assert model.encoder.embeddings.token.weight[0].abs().max() == 0  # [PAD] row
    norm = model.encoder.layers[0].attention_norm
    assert torch.all(norm.weight == 1) and torch.all(norm.bias == 0)


def test_decoder_is_tied_to_token_embedding():
    model = BertForMaskedLM(small_config())
    assert model.head.token_embedding.weight is model.encoder.embeddings.token.weight
    names = [name for name, _ in model.named_parameters()]
    assert sum("token" in name and "weight" in name for name in names) == 1


def test_classifier_pools_cls_and_learns():
    torch.manual_seed(0)
    config = small_config(num_labels=2)
    model = BertForSequenceClassification(config)
    ids = torch.randint(5, config.vocab_size, (8, 16))
    labels = torch.tensor([0, 1] * 4)
    ids[:, 1] = torch.where(labels == 1, 7, 8)  # the label is readable from one token
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(40):
        logits, loss = model(ids, labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert logits.shape == (8, 2)
    assert losses[-1] < 0.1 < losses[0]


def test_mean_pooling_reads_the_real_tokens_only():
    torch.manual_seed(0)
    mean, cls = (BertForSequenceClassification(small_config(pooling=pooling)).eval() for pooling in ("mean", "cls"))
    cls.load_state_dict(mean.state_dict())  # the same weights: only what the pooler reads differs
    ids = torch.randint(5, 300, (2, 12))
    padded = torch.cat([ids, torch.zeros(2, 6, dtype=torch.long)], dim=1)
    real = padded != 0
    with torch.no_grad():
        short, _ = mean(ids)
        long, _ = mean(padded, attention_mask=real)
        hidden = mean.encoder(ids)
        expected = mean.classifier(torch.tanh(mean.pooler(hidden.mean(1))))
        from_cls, _ = cls(ids)
    torch.testing.assert_close(long, short, rtol=1e-5, atol=1e-5)  # padding changes nothing
    torch.testing.assert_close(short, expected)
    assert not torch.allclose(from_cls, short)
    with pytest.raises(ValueError, match="pooling"):
        small_config(pooling="max")


def test_heads_must_divide_width():
    with pytest.raises(ValueError, match="divisible"):
        small_config(d_model=100, heads=3)


def test_flops_grow_with_model_size():
    small = flops_per_token(small_config(), 32, 0.15)
    wider = flops_per_token(small_config(d_model=128, d_ff=256), 32, 0.15)
    assert 3 < wider / small < 5  # matmul work grows with the square of the width


def test_flops_count_the_last_layer_at_its_rows_but_for_keys_and_values():
    config = small_config()
    every_row, masked_rows = flops_per_token(config, 32, 0.15), flops_per_token(config, 32, 0.15, 0.15)
    d, d_ff = config.d_model, config.d_ff
    queries_out_feed_forward_attention = 2 * (2 * d * d + 2 * d * d_ff) + 4 * 32 * d
    assert every_row - masked_rows == pytest.approx(3 * 0.85 * queries_out_feed_forward_attention)


# ----------------------------------------------------------------------------- size from the shape

SHAPE = dict(vocab_size=8192, max_len=128, d_model=256, heads=8, n_layer=4, d_ff=1024)


@pytest.mark.parametrize("kind, settings", [
    (BertForMaskedLM, {}), (BertForMaskedLM, dict(norm="preln", position="rope", feed_forward="geglu")),
    (BertForPreTraining, dict(sentence_classes=2)), (ElectraForPreTraining, dict(generator_heads=2))])
def test_the_count_is_within_two_percent_of_the_model_built(kind, settings):
    config = ModelConfig(**SHAPE, **settings)
    with torch.device("meta"):  # shapes only
        built = count_parameters(kind(config))
    assert estimated_parameters(config) == pytest.approx(built, rel=0.02)


def test_the_token_classifier_scores_its_labelled_tokens_by_the_token_loss(monkeypatch):
    """NER's loss is model.token_loss (the CPU kernel in eager mode), equal to PyTorch's in float32."""
    torch.manual_seed(0)
    model = BertForTokenClassification(small_config(num_labels=7))
    ids = torch.randint(5, 300, (3, 16))
    labels = torch.randint(0, 7, (3, 16))
    labels[:, 0] = labels[:, -1] = IGNORE_INDEX
    logits, loss = model(ids, labels)
    expected = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    called = []
    monkeypatch.setattr("model.token_cross_entropy", lambda *args: called.append(args) or torch.tensor(0.0))
    model(ids, labels)
    assert len(called) == 1
