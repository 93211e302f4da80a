"""The optimizer and its schedules: AdamW's parameter groups; the learning rate, the mask rate, the
batch ramp and the length curriculum, each a pure function of the step, the share of the time
budget spent and the config."""
import dataclasses
import math

import torch
from torch import nn

from config import Config
from run_plan import Schedule, parse_curriculum, parse_mask_rate, parse_scheduler


def make_optimizer(model: nn.Module, config: Config, log) -> torch.optim.Optimizer:
    """AdamW (or StableAdamW) with weight decay on matrices only (not on biases, norms), fused when
    asked; each group's lr_scale is its share of the scheduled rate (layer-lr-decay)."""
    groups = {}
    for name, param in model.named_parameters():
        if param.requires_grad:
            decay = config.weight_decay if param.dim() >= 2 else 0.0
            scale = config.layer_lr_decay ** layers_above(name, model)
            groups.setdefault((decay, scale), []).append(param)
    groups = [{"params": params, "weight_decay": decay, "lr_scale": scale}
              for (decay, scale), params in groups.items()]
    kwargs = dict(lr=config.learning_rate, betas=(config.beta1, config.beta2))
    if config.optimizer == "stable-adamw":
        return StableAdamW(groups, **kwargs)
    if config.fused_adamw:
        try:
            return torch.optim.AdamW(groups, fused=True, **kwargs)
        except (RuntimeError, ValueError) as error:
            log(f"warning: fused AdamW is not supported here ({error}); using the default AdamW")
    return torch.optim.AdamW(groups, **kwargs)


class StableAdamW(torch.optim.Optimizer):
    """AdamW whose step on each tensor is clipped as Adafactor clips updates (Wortsman et al. 2023;
    ModernBERT, Ettin and mmBERT train with it): the tensor's rate is divided by max(1, RMS), the root
    mean square over the tensor of g^2 / max(v, eps^2), v the bias-corrected second moment. A
    gradient far above its running average (a loss spike's) then moves the weights no further than
    usual, which keeps high learning rates stable without gradient clipping; while RMS <= 1 the step
    is AdamW's. The decoupled weight decay takes the clipped rate too. Multi-tensor (foreach) ops:
    PyTorch has no fused kernel for the clipped step. State as torch's AdamW names it, so a run
    can switch between the two on resume."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            params = [param for param in group["params"] if param.grad is not None]
            if params:
                self.step_group(group, params)

    def step_group(self, group: dict, params: list[torch.Tensor]):
        (beta1, beta2), eps = group["betas"], group["eps"]
        grads = [param.grad for param in params]
        states = [self.moments(param) for param in params]
        means, squares = [state["exp_avg"] for state in states], [state["exp_avg_sq"] for state in states]
        for state in states:
            state["step"] += 1
        steps = [state["step"].item() for state in states]  # CPU tensors, as torch's AdamW keeps them
        torch._foreach_lerp_(means, grads, 1 - beta1)
        torch._foreach_mul_(squares, beta2)
        torch._foreach_addcmul_(squares, grads, grads, 1 - beta2)
        second = torch._foreach_div(squares, [1 - beta2 ** step for step in steps])
        denominators = torch._foreach_sqrt(second)
        torch._foreach_add_(denominators, eps)
        torch._foreach_clamp_min_(second, eps * eps)
        ratios = torch._foreach_mul(grads, grads)
        torch._foreach_div_(ratios, second)
        sums = torch.stack(torch._foreach_norm(ratios, 1))  # the ratios are >= 0: their L1 norms are their sums
        sizes = torch.tensor([param.numel() for param in params], device=sums.device, dtype=sums.dtype)
        rates = group["lr"] / (sums / sizes).sqrt().clamp(min=1.0)
        if group["weight_decay"]:
            torch._foreach_mul_(params, (1 - rates * group["weight_decay"]).unbind())
        torch._foreach_reciprocal_(denominators)
        torch._foreach_mul_(denominators, means)  # now the update direction, m / (sqrt(v) + eps)
        first_corrections = torch.tensor([1 - beta1 ** step for step in steps], device=rates.device, dtype=rates.dtype)
        torch._foreach_mul_(denominators, (rates / first_corrections).unbind())
        torch._foreach_sub_(params, denominators)

    def moments(self, param: torch.Tensor) -> dict:
        state = self.state[param]
        if not state:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        return state


def layers_above(name: str, model: nn.Module) -> int:
    """How many encoder layers lie above a parameter: n-layer for the embeddings, n-layer - 1 - i
    for layer i, 0 for the rest (final norm, heads, an ELECTRA generator)."""
    layers = len(model.encoder.layers)
    if name.startswith("encoder.embeddings."):
        return layers
    if name.startswith("encoder.layers."):
        return layers - 1 - int(name.split(".")[2])
    return 0


def learning_rate(step: int, budget_share: float, config: Config, resumed_at: int | None = None) -> float:
    """The rate for `step`: lr-scheduler's shape over the run (the share of the time budget spent,
    0..1, when the config has a budget, else the step); after a resume at step `resumed_at`, ramped
    back up over resume-warmup-iters steps."""
    schedule = parse_scheduler(config.lr_scheduler)
    if schedule.name == "one-cycle":
        rate = one_cycle(run_progress(step, budget_share, config), schedule.peak, config)
    elif schedule.name == "wsd":
        rate = warmup(step, config) * warmup_stable_decay(run_progress(step, budget_share, config), schedule, config)
    elif schedule.name in ("cosine", "linear"):
        decay = cosine_decay if schedule.name == "cosine" else linear_decay
        rate = warmup(step, config) * decay(decay_progress(step, budget_share, config), config)
    else:
        rate = warmup(step, config) * config.learning_rate
        if schedule.name == "steplr":
            rate *= schedule.gamma ** (max(0, step - config.warmup_iters) // schedule.step)
    if resumed_at is not None and config.resume_warmup_iters:
        rate *= min(1.0, (step - resumed_at + 1) / (config.resume_warmup_iters + 1))
    return rate


def warmup(step: int, config: Config) -> float:
    """The share of the rate during warmup-iters: a linear ramp, then 1."""
    return min(1.0, (step + 1) / (config.warmup_iters + 1))


def decay_progress(step: int, budget_share: float, config: Config) -> float:
    """How far the decay has gone, 0..1: the share of the time budget spent, so that the floor comes
    exactly when time runs out (Cramming's budget schedules); without a budget, the share of the
    steps from warmup-iters to lr-decay-iters."""
    if config.budget_seconds:
        return min(max(budget_share, 0.0), 1.0)
    steps = max(1, config.lr_decay_iters - config.warmup_iters)
    return min(max((step - config.warmup_iters) / steps, 0.0), 1.0)


def run_progress(step: int, budget_share: float, config: Config) -> float:
    """The share of the run done, 0..1: of the time budget, else of lr-decay-iters steps."""
    done = budget_share if config.budget_seconds else step / max(1, config.lr_decay_iters)
    return min(max(done, 0.0), 1.0)


def cosine_decay(progress: float, config: Config) -> float:
    """learning-rate at progress 0 down to min-learning-rate at 1 along a half cosine."""
    return config.min_learning_rate + 0.5 * (1 + math.cos(math.pi * progress)) * (
        config.learning_rate - config.min_learning_rate)


def linear_decay(progress: float, config: Config) -> float:
    """learning-rate at progress 0 down to min-learning-rate at 1 along a straight line."""
    return config.learning_rate - progress * (config.learning_rate - config.min_learning_rate)


def warmup_stable_decay(progress: float, schedule: Schedule, config: Config) -> float:
    """learning-rate until the last `decay` share of the run, then down to min-learning-rate at its
    end along 1 - sqrt (Hägele et al. 2024, as ModernBERT and Ettin decay) or a straight line. Any
    checkpoint of the stable phase can be decayed into a finished model, or trained on for longer."""
    into = (progress - (1 - schedule.decay)) / schedule.decay
    if into <= 0:
        return config.learning_rate
    left = 1 - (math.sqrt(into) if schedule.shape == "sqrt" else into)
    return config.min_learning_rate + left * (config.learning_rate - config.min_learning_rate)


def in_stable_phase(step: int, budget_share: float, config: Config) -> bool:
    """Whether the rate at `step` is wsd's constant one, the decay not begun."""
    schedule = parse_scheduler(config.lr_scheduler)
    return schedule.name == "wsd" and run_progress(step, budget_share, config) < 1 - schedule.decay


def one_cycle(progress: float, peak: float, config: Config) -> float:
    """The triangle of Cramming's budget schedule: a straight line from min-learning-rate up to
    learning-rate at `peak` (a share of the run), then straight down to min-learning-rate at the end."""
    low, high = config.min_learning_rate, config.learning_rate
    if progress < peak:
        return low + (high - low) * progress / peak
    return high - (high - low) * (progress - peak) / (1 - peak)


def mask_rate(step: int, budget_share: float, config: Config) -> float:
    """The share of the tokens masked at `step`: mask-rate's START falling to END along a straight
    line over the run, or stepping down at its AT (a share of the run, or where wsd's decay begins);
    a higher rate early teaches more per step, a lower one late matches what the model is used on
    (Ettin and mmBERT mask 30% then less in the decay)."""
    rate = parse_mask_rate(config.mask_rate)
    progress = run_progress(step, budget_share, config)
    if rate.at is None:
        return rate.start + progress * (rate.end - rate.start)
    switch = 1 - parse_scheduler(config.lr_scheduler).decay if rate.at == "decay" else rate.at
    return rate.start if progress < switch else rate.end


def micro_batches(step: int, budget_share: float, config: Config) -> int:
    """Micro-batches in the step: grad-accum-steps; under batch-ramp a staircase from one up to
    grad-accum-steps, reached at that share of the run (Cramming ramps the batch so; an early step
    on a small batch teaches as much as a late one on a large batch)."""
    if not config.batch_ramp:
        return config.grad_accum_steps
    share = run_progress(step, budget_share, config) / config.batch_ramp
    return min(config.grad_accum_steps, 1 + math.floor((config.grad_accum_steps - 1) * share))


def sequence_length(step: int, budget_share: float, config: Config) -> int:
    """The row length of the step: seq-len-curriculum's LENGTH for its SHARE of the run, else seq-len
    (short rows first: a small model learns local context sooner, as BabyLM's entries found)."""
    curriculum = parse_curriculum(config.seq_len_curriculum)
    if curriculum and run_progress(step, budget_share, config) < curriculum.share:
        return curriculum.length
    return config.seq_len


def with_run_length(config: Config, train_examples: int, world_size: int) -> Config:
    """epochs and warmup-ratio as steps: max-iters and lr-decay-iters the steps of `epochs` passes over
    the training examples at the global batch (a last short batch counts), warmup-iters the
    warmup-ratio share of them. A config with neither is returned as it is."""
    steps = config.max_iters
    if config.epochs:
        per_step = config.batch_size * config.grad_accum_steps * world_size
        steps = max(1, math.ceil(config.epochs * train_examples / per_step))
        config = dataclasses.replace(config, max_iters=steps, lr_decay_iters=steps,
                                     warmup_iters=min(config.warmup_iters, steps))
    if config.warmup_ratio:
        config = dataclasses.replace(config, warmup_iters=round(config.warmup_ratio * steps))
    return config
