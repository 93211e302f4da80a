"""The optimizer and its learning-rate schedule: AdamW's parameter groups, and each schedule a
pure function of the step and the config."""
import dataclasses
import math

import torch
from torch import nn

from config import Config, parse_scheduler


def make_optimizer(model: nn.Module, config: Config, log) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on biases, norms), fused when asked; each
    group's lr_scale is its share of the scheduled rate (layer-lr-decay)."""
    groups = {}
    for name, param in model.named_parameters():
        if param.requires_grad:
            decay = config.weight_decay if param.dim() >= 2 else 0.0
            scale = config.layer_lr_decay ** layers_above(name, model)
            groups.setdefault((decay, scale), []).append(param)
    groups = [{"params": params, "weight_decay": decay, "lr_scale": scale}
              for (decay, scale), params in groups.items()]
    kwargs = dict(lr=config.learning_rate, betas=(config.beta1, config.beta2))
    if config.fused_adamw:
        try:
            return torch.optim.AdamW(groups, fused=True, **kwargs)
        except (RuntimeError, ValueError) as error:
            log(f"warning: fused AdamW is not supported here ({error}); using the default AdamW")
    return torch.optim.AdamW(groups, **kwargs)


def layers_above(name: str, model: nn.Module) -> int:
    """How many encoder layers lie above a parameter: n-layer for the embeddings, n-layer - 1 - i
    for layer i, 0 for the rest (final norm, heads, an ELECTRA generator)."""
    layers = len(model.encoder.layers)
    if name.startswith("encoder.embeddings."):
        return layers
    if name.startswith("encoder.layers."):
        return layers - 1 - int(name.split(".")[2])
    return 0


def learning_rate(step: int, spent: float, config: Config, resumed_at: int | None = None) -> float:
    """The rate for `step`: lr-scheduler's, by the share of the time budget spent (0..1) when the
    config has a budget and the cosine schedule, else by the step; after a resume at step
    `resumed_at`, ramped back up over resume-warmup-iters steps."""
    name, every, gamma = parse_scheduler(config.lr_scheduler)
    if name == "cosine":
        rate = budget_lr(step, spent, config) if config.budget_seconds else cosine_lr(step, config)
    else:
        rate = warmup(step, config) * config.learning_rate
        if name == "steplr":
            rate *= gamma ** (max(0, step - config.warmup_iters) // every)
    if resumed_at is not None and config.resume_warmup_iters:
        rate *= min(1.0, (step - resumed_at + 1) / (config.resume_warmup_iters + 1))
    return rate


def warmup(step: int, config: Config) -> float:
    """The share of the rate during warmup-iters: a linear ramp, then 1."""
    return min(1.0, (step + 1) / (config.warmup_iters + 1))


def budget_lr(step: int, spent: float, config: Config) -> float:
    """Learning rate under a time budget: cosine from learning-rate down to min-learning-rate as the
    share of the budget spent goes from 0 to 1, so the floor comes exactly when time runs out, as
    Cramming's budget schedules do; a linear ramp over the first warmup-iters steps scales it in."""
    ramp = warmup(step, config)
    progress = min(max(spent, 0.0), 1.0)
    decayed = config.min_learning_rate + 0.5 * (1 + math.cos(math.pi * progress)) * (
        config.learning_rate - config.min_learning_rate)
    return ramp * decayed


def cosine_lr(step: int, config: Config) -> float:
    """Learning rate at `step`: linear warmup to learning-rate over warmup-iters, then cosine
    decay to min-learning-rate at lr-decay-iters, then constant."""
    if step < config.warmup_iters:
        return config.learning_rate * (step + 1) / (config.warmup_iters + 1)
    if step >= config.lr_decay_iters:
        return config.min_learning_rate
    progress = (step - config.warmup_iters) / max(1, config.lr_decay_iters - config.warmup_iters)
    return config.min_learning_rate + 0.5 * (1 + math.cos(math.pi * progress)) * (
        config.learning_rate - config.min_learning_rate)


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
