"""src/interop/hf_weights.py: the one table between our weight names and transformers' BERT names, both
ways: every weight of a pre-training model survives the round trip, attention's q, k and v split
in order, and names with no use here are reported, not lost silently."""
import pytest
import torch

from errors import UserError
from interop.hf_weights import THEIR_TIED, from_hf, to_hf
from model import BertForPreTraining, ModelConfig

CONFIG = ModelConfig(vocab_size=40, max_len=16, d_model=16, heads=2, n_layer=2, d_ff=32, sentence_classes=2)


@pytest.fixture(scope="module")
def ours() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return BertForPreTraining(CONFIG).state_dict()


def test_every_weight_survives_the_round_trip(ours):
    back, unused = from_hf(to_hf(ours))
    assert unused == [] and set(back) == set(ours)
    assert all(torch.equal(back[name], ours[name]) for name in ours)


def test_their_names_hold_our_tensors(ours):
    theirs = to_hf(ours)
    assert torch.equal(theirs["bert.embeddings.word_embeddings.weight"], ours["encoder.embeddings.token.weight"])
    assert torch.equal(theirs["bert.encoder.layer.1.output.dense.weight"],
                       ours["encoder.layers.1.feed_forward.down.weight"])
    assert torch.equal(theirs["cls.seq_relationship.bias"], ours["sentence_head.bias"])
    assert "head.token_embedding.weight" not in theirs and not set(THEIR_TIED) & set(theirs)  # tied: not stored


def test_attention_keeps_query_key_and_value_in_one_matrix_in_that_order(ours):
    theirs = to_hf(ours)
    qkv = ours["encoder.layers.0.attention.qkv.weight"]
    width = CONFIG.d_model
    for block, part in enumerate(("query", "key", "value")):
        assert torch.equal(theirs[f"bert.encoder.layer.0.attention.self.{part}.weight"],
                           qkv[block * width:(block + 1) * width])


def test_a_bare_encoders_names_are_taken_and_what_we_cannot_use_is_named(ours):
    theirs = {name.removeprefix("bert."): tensor for name, tensor in to_hf(ours).items() if name.startswith("bert.")}
    theirs |= {"embeddings.position_ids": torch.arange(16), "cls.predictions.decoder.weight": torch.zeros(1),
               "encoder.layer.0.crossattention.self.query.weight": torch.zeros(1),  # BERT as a decoder
               "encoder.layer.1.attention.self.distance_embedding.weight": torch.zeros(1)}  # relative positions
    back, unused = from_hf(theirs)
    assert unused == ["bert.encoder.layer.0.crossattention.self.query.weight",
                      "bert.encoder.layer.1.attention.self.distance_embedding.weight"]
    assert torch.equal(back["encoder.layers.0.attention.qkv.bias"], ours["encoder.layers.0.attention.qkv.bias"])
    assert "head.token_embedding.weight" not in back  # no MLM head, so nothing to tie


def test_attention_without_all_three_parts_is_one_line(ours):
    theirs = to_hf(ours)
    del theirs["bert.encoder.layer.1.attention.self.key.weight"]
    with pytest.raises(UserError, match=r"^layer 1: attention weight needs query, key and value; "
                                        r"found \['query', 'value'\]$"):
        from_hf(theirs)
