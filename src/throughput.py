"""Training loss and the task's statistics, tokens/s and MFU between two log lines, with pauses
(validation) left out; and the clock a time budget counts."""
import time
from contextlib import contextmanager

import torch


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
