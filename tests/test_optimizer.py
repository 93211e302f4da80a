"""src/optimizer.py: AdamW's parameter groups (weight decay on matrices, layer-lr-decay); and the
course in src/run_plan.py: each learning-rate schedule as a pure function, the mask rate, batch ramp
and length curriculum, and epochs and warmup-ratio turned into steps."""
import dataclasses
import re

import numpy as np
import pytest
import torch

from config import Config
from errors import UserError
from model import BertForSequenceClassification, ModelConfig
from optimizer import StableAdamW, make_optimizer
from run_plan import in_stable_phase, learning_rate, mask_rate, micro_batches, sequence_length, with_run_length


def test_cosine_warms_up_linearly_then_decays_to_the_minimum():
    config = Config(learning_rate=1e-3, min_learning_rate=1e-4, warmup_iters=10, lr_decay_iters=100)
    rates = [learning_rate(step, 0.0, config) for step in range(120)]

    warmup = np.array(rates[:11])
    assert 0 < warmup[0] < warmup[-1]
    assert np.allclose(np.diff(warmup), warmup[0])  # equal increments, starting from zero
    assert rates[10] == pytest.approx(1e-3)  # the peak, at the end of warmup
    assert max(rates) == pytest.approx(1e-3)
    assert rates[55] == pytest.approx((1e-3 + 1e-4) / 2)  # halfway through the cosine
    assert all(later < earlier for earlier, later in zip(rates[10:100], rates[11:101]))
    assert rates[100:] == [pytest.approx(1e-4)] * 20


def test_cosine_without_warmup_starts_at_the_peak():
    config = Config(learning_rate=1e-3, min_learning_rate=0.0, warmup_iters=0, lr_decay_iters=50)
    assert learning_rate(0, 0.0, config) == pytest.approx(1e-3)
    assert learning_rate(50, 0.0, config) == 0.0


def optimizer_settings(model, config: Config) -> dict[str, dict]:
    """Parameter name -> {lr_scale, weight_decay} of the group make_optimizer puts it in."""
    groups = {id(param): group for group in make_optimizer(model, config, print).param_groups
              for param in group["params"]}
    return {name: {key: groups[id(param)][key] for key in ("lr_scale", "weight_decay")}
            for name, param in model.named_parameters()}


def three_layer_classifier() -> BertForSequenceClassification:
    return BertForSequenceClassification(ModelConfig(vocab_size=40, max_len=16, d_model=16, heads=2, n_layer=3,
                                                     d_ff=32))


def test_layer_lr_decay_gives_each_layer_a_share_of_the_rate_of_the_one_above():
    settings = optimizer_settings(three_layer_classifier(), Config(layer_lr_decay=0.5, weight_decay=0.01))
    assert settings["encoder.embeddings.token.weight"] == {"lr_scale": 0.125, "weight_decay": 0.01}
    assert settings["encoder.embeddings.norm.bias"] == {"lr_scale": 0.125, "weight_decay": 0.0}
    assert settings["encoder.layers.0.attention.qkv.weight"]["lr_scale"] == 0.25
    assert settings["encoder.layers.1.feed_forward.up.bias"] == {"lr_scale": 0.5, "weight_decay": 0.0}
    assert settings["encoder.layers.2.feed_forward.down.weight"]["lr_scale"] == 1.0
    assert settings["pooler.weight"]["lr_scale"] == settings["classifier.bias"]["lr_scale"] == 1.0


def test_without_layer_lr_decay_every_parameter_has_the_rate():
    model = three_layer_classifier()
    settings = optimizer_settings(model, Config())
    assert {setting["lr_scale"] for setting in settings.values()} == {1.0}
    assert {name for name, setting in settings.items() if setting["weight_decay"] == 0} == {
        name for name, param in model.named_parameters() if param.dim() < 2}


def test_the_learning_rate_schedulers():
    base = Config(learning_rate=1e-3, min_learning_rate=1e-5, warmup_iters=10, lr_decay_iters=100, max_iters=100)
    constant = dataclasses.replace(base, lr_scheduler="none")
    assert learning_rate(4, 0, constant) == pytest.approx(1e-3 * 5 / 11)  # warmup as before
    assert learning_rate(10, 0, constant) == learning_rate(99, 0, constant) == 1e-3
    stepped = dataclasses.replace(base, lr_scheduler="steplr:20:0.5")
    assert [learning_rate(step, 0, stepped) for step in (10, 29, 30, 50)] == pytest.approx([1e-3, 1e-3, 5e-4, 2.5e-4])
    ramped = dataclasses.replace(base, resume_warmup_iters=4)
    assert learning_rate(60, 0, ramped, resumed_at=60) == pytest.approx(learning_rate(60, 0, base) / 5)
    assert learning_rate(64, 0, ramped, resumed_at=60) == learning_rate(64, 0, base)


def test_budget_schedule_follows_the_share_spent_and_reaches_the_floor_at_the_end():
    config = Config(time_budget="10m", learning_rate=1e-3, min_learning_rate=1e-4, warmup_iters=9)
    assert learning_rate(0, 0.0, config) == pytest.approx(1e-4)  # the first tenth of the ramp
    assert learning_rate(9, 0.0, config) == pytest.approx(1e-3)  # warmed up, nothing spent: the peak
    assert learning_rate(500, 0.5, config) == pytest.approx((1e-3 + 1e-4) / 2)  # halfway: the cosine's middle
    assert learning_rate(10**6, 1.0, config) == pytest.approx(1e-4)
    assert learning_rate(10**6, 1.7, config) == pytest.approx(1e-4)  # past the end: stays at the floor
    after_warmup = [learning_rate(100, spent / 20, config) for spent in range(21)]
    assert after_warmup == sorted(after_warmup, reverse=True)
    # The step does not matter past warmup; without a budget the step does.
    assert learning_rate(50, 0.3, config) == learning_rate(5000, 0.3, config)
    assert learning_rate(50, 0.3, Config()) != learning_rate(5000, 0.3, Config())


def test_linear_decay_is_a_straight_line_from_the_peak_to_the_floor():
    config = Config(lr_scheduler="linear", learning_rate=1e-3, min_learning_rate=1e-4, warmup_iters=10,
                    lr_decay_iters=100)
    rates = [learning_rate(step, 0.0, config) for step in range(120)]
    assert rates[4] == pytest.approx(1e-3 * 5 / 11)  # the same warmup as the cosine's
    assert rates[10] == pytest.approx(1e-3)
    assert rates[55] == pytest.approx((1e-3 + 1e-4) / 2)
    assert np.allclose(np.diff(rates[10:101]), -(1e-3 - 1e-4) / 90)
    assert rates[100:] == [pytest.approx(1e-4)] * 20
    budget = dataclasses.replace(config, time_budget="10m")
    assert learning_rate(500, 0.25, budget) == pytest.approx(1e-3 - 0.25 * 9e-4)


def test_one_cycle_rises_to_the_peak_at_its_share_of_the_run_then_falls_to_the_floor():
    config = Config(lr_scheduler="one-cycle:0.25", learning_rate=1e-3, min_learning_rate=1e-4, warmup_iters=300,
                    lr_decay_iters=100)
    rates = [learning_rate(step, 0.0, config) for step in range(121)]
    assert rates[0] == pytest.approx(1e-4)  # starts at the floor: warmup-iters plays no part
    assert rates[25] == pytest.approx(1e-3) == max(rates)
    assert np.allclose(np.diff(rates[:26]), 9e-4 / 25)
    assert np.allclose(np.diff(rates[25:101]), -9e-4 / 75)
    assert rates[100:] == [pytest.approx(1e-4)] * 21
    budget = dataclasses.replace(config, lr_scheduler="one-cycle", time_budget="10m")  # the peak at half by default
    assert [learning_rate(7, spent, budget) for spent in (0.0, 0.25, 0.5, 0.75, 1.0, 1.5)] == pytest.approx(
        [1e-4, 5.5e-4, 1e-3, 5.5e-4, 1e-4, 1e-4])


def test_wsd_holds_the_rate_then_decays_over_its_share_along_one_minus_sqrt():
    config = Config(lr_scheduler="wsd:0.25", learning_rate=1e-3, min_learning_rate=1e-4, warmup_iters=10,
                    lr_decay_iters=100)
    rates = [learning_rate(step, 0.0, config) for step in range(111)]
    assert rates[0] == pytest.approx(1e-3 / 11) and rates[10:76] == [pytest.approx(1e-3)] * 66
    assert rates[91] == pytest.approx(1e-4 + (1 - (16 / 25) ** 0.5) * 9e-4)  # 1 - sqrt, 16 of its 25 steps in
    assert rates[100:] == [pytest.approx(1e-4)] * 11
    linear = dataclasses.replace(config, lr_scheduler="wsd:0.25:linear")
    assert learning_rate(91, 0.0, linear) == pytest.approx(1e-4 + (9 / 25) * 9e-4)
    budget = dataclasses.replace(config, time_budget="10m")  # the share of the time spent
    assert [learning_rate(50, spent, budget) for spent in (0.5, 0.75, 1.0)] == pytest.approx([1e-3, 1e-3, 1e-4])
    assert [in_stable_phase(step, 0.0, config) for step in (0, 74, 75, 100)] == [True, True, False, False]
    assert not in_stable_phase(0, 0.0, dataclasses.replace(config, lr_scheduler="cosine"))


@pytest.mark.parametrize("value", ["one-cycle:0", "one-cycle:1", "one-cycle:x", "one-cycle:0.3:2", "linear:5",
                                   "triangle", "steplr:0:0.5"])
def test_a_bad_scheduler_is_one_line_naming_the_forms(value):
    with pytest.raises(UserError, match="lr-scheduler.*one-cycle\\[:PEAK\\]"):
        Config(lr_scheduler=value)


def test_batch_ramp_is_a_staircase_from_one_micro_batch_to_grad_accum_steps():
    config = Config(grad_accum_steps=4, batch_ramp=0.6, lr_decay_iters=100, warmup_iters=0)
    counts = [micro_batches(step, 0.0, config) for step in range(120)]
    assert counts[:20] == [1] * 20 and counts[20:40] == [2] * 20 and counts[40:60] == [3] * 20
    assert counts[60:] == [4] * 60  # full at 60% of the run, and after its end
    budget = dataclasses.replace(config, time_budget="10m")  # the share of the budget spent decides
    assert [micro_batches(0, spent, budget) for spent in (0.0, 0.19, 0.2, 0.59, 0.6, 1.2)] == [1, 1, 2, 3, 4, 4]
    assert micro_batches(0, 0.0, Config(grad_accum_steps=4)) == 4  # no ramp


@pytest.mark.parametrize("settings, message", [
    ({"batch_ramp": 0.6}, "batch-ramp = 0.6 needs grad-accum-steps above 1"),
    ({"batch_ramp": 0.5, "grad_accum_steps": 2, "epochs": 3, "task_type": "sst2"},
     "batch-ramp = 0.5 and epochs = 3: a ramp changes the steps an epoch takes"),
    ({"batch_ramp": 1.5, "grad_accum_steps": 2}, "batch-ramp = 1.5: expected a number in [0, 1]"),
])
def test_a_batch_ramp_without_room_to_grow_is_one_line(settings, message):
    with pytest.raises(UserError, match=re.escape(message)):
        Config(**settings)


def test_a_mask_rate_falls_along_a_line_or_steps_down_at_its_share_or_at_the_decay():
    config = Config(lr_decay_iters=100, warmup_iters=0)
    assert {mask_rate(step, 0.0, config) for step in (0, 50, 200)} == {0.15}
    line = dataclasses.replace(config, mask_rate="0.3:0.1")
    assert [mask_rate(step, 0.0, line) for step in (0, 50, 100, 200)] == pytest.approx([0.3, 0.2, 0.1, 0.1])
    step = dataclasses.replace(config, mask_rate="0.3:0.15@0.8")
    assert [mask_rate(step_, 0.0, step) for step_ in (0, 79, 80, 100)] == [0.3, 0.3, 0.15, 0.15]
    decay = dataclasses.replace(config, mask_rate="0.3:0.15@decay", lr_scheduler="wsd:0.25")
    assert [mask_rate(step_, 0.0, decay) for step_ in (0, 74, 75)] == [0.3, 0.3, 0.15]
    assert [in_stable_phase(step_, 0.0, decay) for step_ in (74, 75)] == [True, False]  # the same boundary
    budget = dataclasses.replace(step, time_budget="10m")  # the share of the budget spent decides
    assert [mask_rate(10 ** 6, spent, budget) for spent in (0.0, 0.79, 0.8)] == [0.3, 0.3, 0.15]


@pytest.mark.parametrize("settings, message", [
    ({"mask_rate": "0.15:0.3"}, "mask-rate = '0.15:0.3': expected a rate in (0, 1), or START:END[@AT]"),
    ({"mask_rate": "0.3:0.15@1"}, "mask-rate = '0.3:0.15@1': expected a rate in (0, 1), or START:END[@AT]"),
    ({"mask_rate": "0.3@0.5"}, "mask-rate = '0.3@0.5': expected"),
    ({"mask_rate": "0.3:0.15@decay"}, "mask-rate = 0.3:0.15@decay steps down where wsd's decay begins, but "
                                      "lr-scheduler = cosine"),
    ({"mask_rate": "0.3:0.15", "masking": "static"}, "mask-rate = 0.3:0.15 falls along the run: it goes with "
                                                     "masking = dynamic and task-type = mlm or electra"),
    ({"mask_rate": "0.3:0.15", "task_type": "clm"}, "not masking = dynamic, task-type = clm"),
])
def test_a_mask_rate_that_cannot_be_followed_is_one_line(settings, message):
    with pytest.raises(UserError, match=re.escape(message)):
        Config(**settings)


def test_a_length_curriculum_trains_on_short_rows_for_its_share_of_the_run():
    config = Config(seq_len=128, seq_len_curriculum="64:0.5", lr_decay_iters=100, warmup_iters=0)
    assert [sequence_length(step, 0.0, config) for step in (0, 49, 50, 99, 500)] == [64, 64, 128, 128, 128]
    budget = dataclasses.replace(config, time_budget="10m")
    assert [sequence_length(10 ** 6, spent, budget) for spent in (0.0, 0.49, 0.5)] == [64, 64, 128]
    assert sequence_length(0, 0.0, Config(seq_len=128)) == 128


@pytest.mark.parametrize("settings, message", [
    ({"seq_len_curriculum": "64"}, "seq-len-curriculum = '64': expected LENGTH:SHARE"),
    ({"seq_len_curriculum": "64:0"}, "seq-len-curriculum = '64:0': expected LENGTH:SHARE"),
    ({"seq_len_curriculum": "48:0.5"}, "seq-len-curriculum = 48:0.5: 48 must divide seq-len = 128 and be shorter"),
    ({"seq_len_curriculum": "128:0.5"}, "128 must divide seq-len = 128 and be shorter"),
    ({"seq_len_curriculum": "64:0.5", "masking": "static"}, "goes with task-type = mlm, masking = dynamic"),
    ({"seq_len_curriculum": "64:0.5", "task_type": "electra"}, "goes with task-type = mlm"),
])
def test_a_curriculum_that_cannot_cut_the_rows_is_one_line(settings, message):
    with pytest.raises(UserError, match=re.escape(message)):
        Config(seq_len=128, **settings)


def test_epochs_set_the_run_length_in_steps_and_warmup_ratio_a_share_of_them():
    config = Config(task_type="sst2", batch_size=32, grad_accum_steps=2, epochs=3, warmup_iters=500, max_iters=10)
    sized = with_run_length(config, train_examples=1000, world_size=2)
    # 3 passes over 1,000 examples at 128 a step: 23.4, and a last short step counts
    assert (sized.max_iters, sized.lr_decay_iters, sized.warmup_iters) == (24, 24, 24)
    ratio = with_run_length(dataclasses.replace(config, warmup_ratio=0.25), 1000, 2)
    assert (ratio.max_iters, ratio.warmup_iters) == (24, 6)
    steps_only = Config(max_iters=400, warmup_iters=10, warmup_ratio=0.1)
    assert with_run_length(steps_only, 1000, 1).warmup_iters == 40
    assert with_run_length(Config(), 1000, 1) == Config()


def stable_adamw_by_the_formula(param, grads, lr, betas, eps, weight_decay):
    """Wortsman et al. 2023's StableAdamW, one tensor, written from the paper: the weights after each
    gradient in turn, and each step's RMS."""
    (beta1, beta2), m, v, rms_seen = betas, torch.zeros_like(param), torch.zeros_like(param), []
    for t, g in enumerate(grads, start=1):
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        m_hat, v_hat = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
        rms = torch.sqrt(torch.mean(g * g / torch.clamp(v_hat, min=eps * eps)))
        eta = lr / max(1.0, rms.item())
        param = param - eta * weight_decay * param - eta * m_hat / (torch.sqrt(v_hat) + eps)
        rms_seen.append(rms.item())
    return param, rms_seen


def test_stable_adamw_steps_as_the_paper_s_formula_clipping_a_spike():
    generator = torch.Generator().manual_seed(0)
    shapes = [(6, 5), (7,)]
    starts = [torch.randn(shape, generator=generator, dtype=torch.float64) for shape in shapes]
    grads = [[torch.randn(shape, generator=generator, dtype=torch.float64) * (30.0 if t == 3 else 1.0)
              for t in range(5)] for shape in shapes]  # step 4's gradient is a spike
    params = [torch.nn.Parameter(start.clone()) for start in starts]
    optimizer = StableAdamW([{"params": params[:1], "weight_decay": 0.1}, {"params": params[1:], "weight_decay": 0.0}],
                            lr=0.01, betas=(0.9, 0.98), eps=1e-6)
    for t in range(5):
        for param, tensor_grads in zip(params, grads):
            param.grad = tensor_grads[t]
        optimizer.step()
    for param, start, tensor_grads, decay in zip(params, starts, grads, (0.1, 0.0)):
        expected, rms_seen = stable_adamw_by_the_formula(start, tensor_grads, 0.01, (0.9, 0.98), 1e-6, decay)
        assert rms_seen[3] > 1.5  # the spike is clipped (its rate nearly halved)
        assert torch.allclose(param.detach(), expected, rtol=0, atol=1e-12)
    assert optimizer.state[params[0]]["step"].item() == 5


def test_optimizer_stable_adamw_builds_it_beside_adamw():
    model = BertForSequenceClassification(ModelConfig(vocab_size=50, max_len=16, d_model=16, heads=2, n_layer=2,
                                                      num_labels=2))
    assert isinstance(make_optimizer(model, Config(optimizer="stable-adamw"), print), StableAdamW)
    assert type(make_optimizer(model, Config(fused_adamw=False), print)) is torch.optim.AdamW
    with pytest.raises(UserError, match="optimizer = 'adam': expected one of adamw, stable-adamw"):
        Config(optimizer="adam")
