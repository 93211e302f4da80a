"""The optimizers: AdamW's parameter groups (weight decay on matrices, layer-lr-decay) and
StableAdamW. The rates they take at each step are run_plan.py's."""
import torch
from torch import nn

from config import Config


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
