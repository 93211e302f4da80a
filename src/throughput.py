"""Training loss and the task's statistics, tokens/s and MFU between two log lines, with pauses
(validation) left out; and the clock a time budget counts, with its record."""
import math
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from errors import UserError


class Throughput:
    """Sums the loss and the task's statistics on the device (no host sync per step) and reads the
    figures at a log line."""

    def __init__(self, flops_per_token: float, peak_flops: float, world_size: int, device: torch.device,
                 tokens: int, peak_measured: bool = False):
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops
        self.peak_measured = peak_measured  # peak_flops is a measurement, which a later one may raise
        self.reads = 0  # log lines read: the first one measures the peak again
        self.world_size = world_size
        self.loss_sum = torch.zeros((), device=device)
        self.micro_steps = 0
        self.reset(tokens)

    def reset(self, tokens: int):
        self.loss_sum.zero_()
        self.statistics = 0
        self.micro_steps = 0
        self.since, self.since_tokens, self.pause = time.perf_counter(), tokens, 0.0

    def add(self, loss: torch.Tensor, statistics: torch.Tensor):
        self.loss_sum += loss.detach().float()
        self.statistics = self.statistics + statistics.detach().double()
        self.micro_steps += 1

    @contextmanager
    def paused(self):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.pause += time.perf_counter() - started

    def read(self, tokens: int, restart: bool = True) -> tuple[float, torch.Tensor, float, float]:
        """Mean loss over all ranks' micro-batches, their summed statistics (on the CPU), tokens/s
        of all ranks, and MFU per rank since the last read; then starts counting afresh, unless
        restart is False (a run's last line, off the log interval: a resumed run goes on summing)."""
        self.reads += 1
        elapsed = time.perf_counter() - self.since - self.pause
        loss_sum, statistics = self.loss_sum.clone(), self.statistics.clone()  # this rank's stay for since_log
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(loss_sum)
            torch.distributed.all_reduce(statistics)
            loss_sum /= self.world_size
        mean_loss = loss_sum.item() / self.micro_steps
        tokens_per_sec = (tokens - self.since_tokens) / elapsed
        mfu = self.flops_per_token * tokens_per_sec / self.world_size / self.peak_flops
        if restart:
            self.reset(tokens)
        return mean_loss, statistics.cpu(), tokens_per_sec, mfu

    def since_log(self) -> dict:
        """This rank's sums since the last log line: a checkpoint keeps them, so that the first line
        after a resume averages the same steps as an uninterrupted run's."""
        statistics = self.statistics.cpu() if isinstance(self.statistics, torch.Tensor) else None
        return {"loss_sum": self.loss_sum.cpu(), "statistics": statistics, "micro_steps": self.micro_steps}

    def restore(self, sums: dict):
        """Go on from since_log()'s sums."""
        self.loss_sum.copy_(sums["loss_sum"])
        statistics = sums["statistics"]
        self.statistics = 0 if statistics is None else statistics.to(self.loss_sum.device)
        self.micro_steps = sums["micro_steps"]


class Clock:
    """Training time of a run: seconds so far, from a resumed run's count on, pauses left out."""
    now = staticmethod(time.monotonic)  # tests put a fake clock here

    def __init__(self, elapsed: float = 0.0):
        self.before = elapsed
        self.started = self.now()

    def elapsed(self) -> float:
        return self.before + self.now() - self.started

    @contextmanager
    def paused(self):
        """Time inside is not charged: validation and its checkpoints."""
        self.before = self.elapsed()
        try:
            yield
        finally:
            self.started = self.now()


CLOCK_RECORD = "clock.tsv"  # in the run directory


def start_clock_record(run_dir: Path, resumed_at: int):
    """runN/clock.tsv: the training seconds after each step, as the schedules read them, one line a
    step (rank 0's, appended as it goes: record_clock), so that replay-clock can repeat a time-budget
    run exactly. A resume cuts the lines past its step: those steps are taken again."""
    path = run_dir / CLOCK_RECORD
    kept = read_clock_record(path)[:resumed_at] if path.exists() else []
    path.write_text("step\tseconds\n" + "".join(f"{step}\t{seconds!r}\n" for step, seconds in enumerate(kept, 1)),
                    encoding="utf-8")


def record_clock(run_dir: Path, step: int, seconds: float):
    with (run_dir / CLOCK_RECORD).open("a", encoding="utf-8") as file:
        file.write(f"{step}\t{seconds!r}\n")


def read_clock_record(path: Path) -> list[float]:
    """A clock.tsv's seconds, step 1 first; one line naming the file where it is not one."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"{path}: cannot read the clock record ({getattr(error, 'strerror', None) or error})") from None
    if not lines or lines[0] != "step\tseconds":
        raise UserError(f"{path}: not a run's clock record (its first line is not 'step<TAB>seconds')")
    seconds = []
    for number, line in enumerate(lines[1:], 2):
        fields = line.split("\t")
        try:
            step, value = int(fields[0]), float(fields[1])
        except (ValueError, IndexError):
            raise UserError(f"{path}:{number}: expected a step and its seconds, got {line!r}") from None
        if step != len(seconds) + 1 or not math.isfinite(value) or value < (seconds[-1] if seconds else 0.0):
            raise UserError(f"{path}:{number}: expected step {len(seconds) + 1} and seconds that never fall, "
                            f"got {line!r}")
        seconds.append(value)
    return seconds
