"""Where a training step's time goes: torch.profiler over the trainer's own step.

    python scripts/profile_step.py --config etc/templates/config_cpu.ini      # the demo's 2 x 128
    python scripts/profile_step.py --config etc/templates/config_cpu.ini --n-layer 4 --d-model 256 --heads 4
    python scripts/profile_step.py --steps 20 --rows 25                       # ./config.ini

Builds the run as main.py does (task, model, optimizer, data, compile, dtype: every config key
applies, and any key can be overridden as for main.py), runs --warmup steps, times --steps
steps as the training log does (tokens/s, MFU against the matmul peak), then profiles as many
more and prints three markdown tables: the step's phases (trainer.PHASES, as Trainer.train_step
records them), each with the time its operators took and the time between them (Python and the
framework); the time by kind of work (matmuls, attention, norms, the optimizer, ...: TIME_KINDS);
and the operators that took the most time themselves. Nothing is written under base-dir/runs.
"""
import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
import hardware  # noqa: E402
import main as training  # noqa: E402
from errors import UserError, exit_on_user_error  # noqa: E402
from ini import load_config  # noqa: E402
from trainer import PHASES, Trainer  # noqa: E402


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Other options are config keys: --KEY VALUE overrides the config.")
    parser.add_argument("--config", type=Path, help="config file (default: ./config.ini)")
    parser.add_argument("--warmup", type=int, default=5, help="steps before timing (compile, allocation)")
    parser.add_argument("--steps", type=int, default=10, help="steps timed, then as many profiled")
    parser.add_argument("--rows", type=int, default=15, help="operators listed")
    args, overrides = parser.parse_known_args(argv)
    if args.warmup < 0 or args.steps < 1 or args.rows < 1:
        raise UserError("--warmup must be >= 0, --steps and --rows >= 1")
    return args, overrides


def prepared_run(config):
    """The trainer, a fresh run that keeps nothing, and its batches."""
    trainer = Trainer(config, training.make_task(config))
    return trainer, *trainer.scratch_run()


def time_steps(trainer: Trainer, run, batches, meter, steps: int) -> tuple[float, float, float]:
    """Seconds per step, and tokens/s and MFU as the training log reads them, over `steps` steps."""
    hardware.synchronize(trainer.device)
    meter.reset(run.tokens)
    started = time.perf_counter()
    for _ in range(steps):
        trainer.train_step(run, batches, meter)
    hardware.synchronize(trainer.device)
    seconds = time.perf_counter() - started
    _, _, tokens_per_sec, mfu = meter.read(run.tokens)
    return seconds / steps, tokens_per_sec, mfu


def profile_steps(trainer: Trainer, run, batches, meter, steps: int):
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if trainer.device.type == "cuda" else [])
    with profile(activities=activities) as profiler:
        for _ in range(steps):
            trainer.train_step(run, batches, meter)
        hardware.synchronize(trainer.device)
    return profiler.key_averages()


# Where a step's time goes: each kernel (on a GPU) or operator (elsewhere) in the first kind one of
# whose substrings its name holds; attention first, since its fused kernels' names hold "gemm" too.
# Inductor names a fused kernel by what it holds (a norm with its residual add: "norm").
TIME_KINDS = (("attention", ("attention", "flash", "fmha", "sdpa")),
              ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "aten::mm", "aten::addmm", "aten::bmm",
                          "linear")),
              ("optimizer", ("adam", "multi_tensor")),
              ("norm", ("layer_norm", "rms_norm")),
              ("softmax and loss", ("softmax", "nll", "cross_entropy")),
              ("copies and casts", ("memcpy", "memset", "aten::copy_", "aten::_to_copy")))


def time_kind(name: str) -> str:
    lowered = name.lower()
    return next((kind for kind, parts in TIME_KINDS if any(part in lowered for part in parts)), "other")


def timed_events(events, on_gpu: bool) -> list[tuple[str, float]]:
    """(name, microseconds) of what did the work: each GPU kernel's device time, or each CPU operator's
    own time (the phases' and profiler steps' own time is the framework's, between operators)."""
    if on_gpu:
        return [(event.key, event.self_device_time_total) for event in events
                if event.device_type == torch.autograd.DeviceType.CUDA]
    return [(event.key, event.self_cpu_time_total) for event in events
            if event.key not in PHASES and not event.key.startswith("ProfilerStep")]


def time_by_kind(timed: list[tuple[str, float]]) -> dict[str, float]:
    """Microseconds by TIME_KINDS' kind, and "other" (elementwise work: GELU, dropout, adds, casts)."""
    totals = {kind: 0.0 for kind, _ in TIME_KINDS} | {"other": 0.0}
    for name, microseconds in timed:
        totals[time_kind(name)] += microseconds
    return totals


def kind_table(events, steps: int, device: torch.device) -> list[str]:
    totals = time_by_kind(timed_events(events, device.type == "cuda"))
    whole = sum(totals.values()) or 1.0
    lines = ["| kind of work | ms per step | share of operator time |", "|---|---:|---:|"]
    return lines + [f"| {kind} | {us / steps / 1e3:.2f} | {us / whole:.1%} |" for kind, us in totals.items()]


def phase_table(events, seconds_per_step: float) -> list[str]:
    """Each phase's time per step: inside operators, and the rest (Python, the framework)."""
    by_name = {event.key: event for event in events}
    lines = ["| phase | ms per step | share of the step | of which between operators |",
             "|---|---:|---:|---:|"]
    profiled = sum(by_name[name].cpu_time_total for name in PHASES if name in by_name)
    for name in PHASES:
        if name not in by_name:
            continue
        event = by_name[name]
        share = event.cpu_time_total / profiled
        lines.append(f"| {name} | {seconds_per_step * share * 1e3:.2f} | {share:.1%} | "
                     f"{event.self_cpu_time_total / event.cpu_time_total:.1%} |")
    lines.append(f"| the step (timed without the profiler) | {seconds_per_step * 1e3:.2f} | 100% | |")
    return lines


def operator_table(events, steps: int, rows: int, device: torch.device) -> list[str]:
    """The operators that took most time themselves (on the GPU where there is one)."""
    attribute = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    operators = [event for event in events if event.key not in PHASES and not event.key.startswith("ProfilerStep")]
    total = sum(getattr(event, attribute) for event in operators)
    lines = ["| operator | calls per step | ms per step | share of operator time |", "|---|---:|---:|---:|"]
    for event in sorted(operators, key=lambda event: getattr(event, attribute), reverse=True)[:rows]:
        own = getattr(event, attribute)
        lines.append(f"| `{event.key}` | {event.count / steps:g} | {own / steps / 1e3:.2f} | {own / total:.1%} |")
    return lines


@exit_on_user_error
def main(argv=None):
    args, overrides = parse_args(argv)
    config = load_config(args.config, overrides)
    trainer, run, batches = prepared_run(config)
    meter = trainer.throughput_meter(run)  # measures the matmul peak MFU is against, as training does
    for _ in range(args.warmup):
        trainer.train_step(run, batches, meter)
    seconds_per_step, tokens_per_sec, mfu = time_steps(trainer, run, batches, meter, args.steps)
    mfu *= trainer.measure_peak_again(run, meter)  # the higher of two measurements, as training keeps
    events = profile_steps(trainer, run, batches, meter, args.steps)
    print(f"{config.n_layer} x {config.d_model}, batch {config.batch_size} x {config.seq_len}, "
          f"{config.task_type}, device {trainer.device}, {str(trainer.dtype).removeprefix('torch.')}, "
          f"compile {str(config.compile).lower()}: {seconds_per_step * 1e3:.1f} ms per step, "
          f"{tokens_per_sec:,.0f} tokens/s, MFU {mfu:.1%} of {meter.peak_flops / 1e9:,.0f} GFLOP/s\n")
    print("\n".join(phase_table(events, seconds_per_step)))
    print()
    print("\n".join(kind_table(events, args.steps, trainer.device)))
    print()
    print("\n".join(operator_table(events, args.steps, args.rows, trainer.device)))


if __name__ == "__main__":
    main()
