"""src/model_size.py: a model's weights counted from its shape, as the models built from it hold
them, and a model too large for the memory refused in one line saying its size."""
import pytest
import torch

from errors import UserError
from model import BertForMaskedLM, BertForPreTraining, ElectraForPreTraining, ModelConfig, count_parameters
from model_size import GIB, check_fits_memory, machine_memory, parameter_count

SHAPE = dict(vocab_size=8192, max_len=128, d_model=256, heads=8, n_layer=4, d_ff=1024)


@pytest.mark.parametrize("kind, settings", [
    (BertForMaskedLM, {}), (BertForMaskedLM, dict(norm="preln", position="rope", feed_forward="geglu")),
    (BertForPreTraining, dict(sentence_classes=2)), (ElectraForPreTraining, dict(generator_heads=2))])
def test_the_count_is_within_two_percent_of_the_model_built(kind, settings):
    config = ModelConfig(**SHAPE, **settings)
    with torch.device("meta"):  # shapes only
        built = count_parameters(kind(config))
    assert parameter_count(config) == pytest.approx(built, rel=0.02)


def test_a_model_over_the_limit_is_refused_saying_its_size():
    config = ModelConfig(**SHAPE | dict(d_ff=10**9))
    with pytest.raises(UserError) as refused:
        check_fits_memory(config, copies=4, limit_gib=None, source="config.ini (d-ff = 1000000000)", flag="--max-gib")
    needed = 4 * 4 * parameter_count(config)
    assert str(refused.value) == (f"config.ini (d-ff = 1000000000): the model would allocate {needed / GIB:,.1f} GiB "
                                  f"(4 x {parameter_count(config):,} float32 weights), more than this machine's memory "
                                  f"({machine_memory() / GIB:,.1f} GiB; --max-gib GIB sets another limit)")


def test_the_limit_can_be_set():
    config = ModelConfig(**SHAPE)
    check_fits_memory(config, copies=2, limit_gib=1, source="x", flag="--max-gib")
    with pytest.raises(UserError, match=r"more than --max-gib 0.01 GiB$"):
        check_fits_memory(config, copies=2, limit_gib=0.01, source="x", flag="--max-gib")
