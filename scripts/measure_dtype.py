"""float32 against bf16 for a config's training step on this machine, at one or more model sizes,
beside what `dtype = auto` picks (hardware.auto_dtype: a rule, which tables like this one are the
evidence for).

    python scripts/measure_dtype.py --config etc/templates/config_cpu.ini
    python scripts/measure_dtype.py --config etc/templates/config_cpu.ini --sizes 2x64 2x128 4x256 6x768
    python scripts/measure_dtype.py --steps 5 --batch-size 16       # ./config.ini, any key overridden

Each size is built as main.py builds the run (task, model, optimizer, data; heads of 64 dimensions,
d-ff 4 x d-model); both dtypes take a warm-up step, then their steps are timed in turn (float32,
bf16, float32, ...), each keeping its fastest, so that a busy moment slows a step of each, not all
of one. A measurement only: nothing here changes what a run computes, and nothing is written
under base-dir/runs.
"""
import argparse
import dataclasses
import re
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
import hardware  # noqa: E402
import main as training  # noqa: E402
from errors import UserError, exit_on_user_error  # noqa: E402
from ini import load_config  # noqa: E402
from trainer import Trainer  # noqa: E402

DTYPES = (torch.float32, torch.bfloat16)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Other options are config keys: --KEY VALUE overrides the config.")
    parser.add_argument("--config", type=Path, help="config file (default: ./config.ini)")
    parser.add_argument("--sizes", nargs="+", metavar="LxD",
                        help="n-layer x d-model, e.g. 2x128 (default: the config's own size)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per dtype and size (the fastest kept)")
    args, overrides = parser.parse_known_args(argv)
    if args.steps < 1:
        raise UserError(f"--steps {args.steps}: expected at least 1")
    for size in args.sizes or ():
        if not re.fullmatch(r"[1-9]\d*x[1-9]\d*", size):
            raise UserError(f"--sizes {size}: expected n-layer x d-model, such as 2x128")
    return args, overrides


def sized(config, size: str | None):
    """The config at n-layer x d-model `size` (heads of 64 dimensions, d-ff 4 x d-model), or as it is."""
    if size is None:
        return config
    layers, width = map(int, size.split("x"))
    return dataclasses.replace(config, n_layer=layers, d_model=width, heads=max(1, width // 64), d_ff=4 * width)


def step_seconds(config, steps: int) -> dict[torch.dtype, float]:
    """The fastest training step of each dtype in DTYPES, their steps taken in turn."""
    prepared = {}
    for dtype in DTYPES:
        trainer = Trainer(dataclasses.replace(config, dtype=str(dtype).removeprefix("torch.")),
                          training.make_task(config))
        run, batches = trainer.scratch_run()
        meter = trainer.throughput_meter(run)
        prepared[dtype] = (trainer, run, batches, meter)
    steps_of = {dtype: lambda parts=parts: timed_step(*parts) for dtype, parts in prepared.items()}
    return hardware.fastest_seconds(steps_of, tries=steps)


def timed_step(trainer: Trainer, run, batches, meter):
    trainer.train_step(run, batches, meter)
    hardware.synchronize(trainer.device)


def row(config, seconds: dict[torch.dtype, float]) -> str:
    chosen, _ = hardware.auto_dtype(hardware.select_device(config.device))
    fp32, bf16 = seconds[torch.float32], seconds[torch.bfloat16]
    return f"| {config.n_layer} x {config.d_model} | {fp32 * 1e3:,.1f} | {bf16 * 1e3:,.1f} | {fp32 / bf16:.2f}x | " \
           f"{str(chosen).removeprefix('torch.')} |"


@exit_on_user_error
def main(argv=None):
    args, overrides = parse_args(argv)
    config = load_config(args.config, overrides)
    device = hardware.select_device(config.device)
    if hardware.fast_dtype(device) != torch.bfloat16:
        raise UserError(f"device {device} has no bf16: dtype = auto runs "
                        f"{str(hardware.auto_dtype(device)[0]).removeprefix('torch.')} here, "
                        f"nothing to compare")
    started = time.perf_counter()
    print(f"{config.task_type}, batch {config.batch_size} x {config.seq_len}, device {device}, "
          f"{torch.get_num_threads()} threads; ms per training step, the fastest of {args.steps}\n")
    print("| model | float32 | bf16 | bf16's gain | dtype = auto |\n|---|---:|---:|---:|---|")
    for size in args.sizes or [None]:
        config_at_size = sized(config, size)
        print(row(config_at_size, step_seconds(config_at_size, args.steps)), flush=True)
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
