"""src/throughput.py: the figures of a log line (mean loss, summed statistics, tokens/s, MFU) with
pauses left out, the sums a checkpoint keeps, and the clock a time budget counts (a fake clock)."""
import pytest
import torch

import throughput
from throughput import Clock, Throughput


@pytest.fixture
def now(monkeypatch) -> list[float]:
    """The seconds time.perf_counter and Clock read, set by the test."""
    seconds = [100.0]
    monkeypatch.setattr(throughput.time, "perf_counter", lambda: seconds[0])
    monkeypatch.setattr(Clock, "now", staticmethod(lambda: seconds[0]))
    return seconds


def meter(tokens: int = 0) -> Throughput:
    return Throughput(flops_per_token=1e6, peak_flops=1e12, world_size=1, device=torch.device("cpu"), tokens=tokens)


def summed(figures: tuple) -> tuple[float, list]:
    """The mean loss and the statistics of a read, as plain numbers."""
    return figures[0], figures[1].tolist()


def test_a_log_line_reads_the_mean_loss_the_summed_statistics_and_the_rates(now):
    figures = meter(tokens=5000)
    figures.add(torch.tensor(2.0), torch.tensor([10, 4]))
    figures.add(torch.tensor(4.0), torch.tensor([20, 6]))
    now[0] += 2.0
    loss, statistics, tokens_per_sec, mfu = figures.read(tokens=5000 + 4096)
    assert loss == 3.0 and statistics.tolist() == [30, 10]
    assert tokens_per_sec == 2048 and mfu == pytest.approx(1e6 * 2048 / 1e12)
    figures.add(torch.tensor(1.0), torch.tensor([1, 1]))
    now[0] += 1.0
    loss, statistics, tokens_per_sec, _ = figures.read(tokens=9096 + 1000)  # counted afresh
    assert (loss, statistics.tolist(), tokens_per_sec) == (1.0, [1, 1], 1000)


def test_a_pause_is_left_out_of_the_rates(now):
    figures = meter()
    figures.add(torch.tensor(1.0), torch.tensor([1]))
    with figures.paused():
        now[0] += 50.0  # validation
    now[0] += 1.0
    assert figures.read(tokens=512)[2] == 512


def test_a_line_off_the_interval_goes_on_summing(now):
    figures = meter()
    figures.add(torch.tensor(2.0), torch.tensor([1]))
    now[0] += 1.0
    figures.read(tokens=10, restart=False)
    figures.add(torch.tensor(4.0), torch.tensor([3]))
    now[0] += 1.0
    assert summed(figures.read(tokens=20)) == (3.0, [4])


def test_the_sums_since_a_log_line_carry_over_to_a_resumed_meter(now):
    saved = meter()
    saved.add(torch.tensor(2.0), torch.tensor([5, 1]))
    resumed = meter(tokens=10)
    resumed.restore(saved.since_log())
    resumed.add(torch.tensor(4.0), torch.tensor([5, 3]))
    now[0] += 1.0
    assert summed(resumed.read(tokens=20)) == (3.0, [10, 4])
    fresh = meter()
    fresh.restore(meter().since_log())  # saved right after a log line: nothing summed yet
    fresh.add(torch.tensor(1.0), torch.tensor([2]))
    now[0] += 1.0
    assert summed(fresh.read(tokens=1)) == (1.0, [2])


def test_the_clock_goes_on_from_a_resumed_count_and_skips_pauses(now):
    clock = Clock(elapsed=30.0)
    now[0] += 5.0
    assert clock.elapsed() == 35.0
    with clock.paused():
        now[0] += 100.0
    now[0] += 1.0
    assert clock.elapsed() == 36.0
