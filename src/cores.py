"""The cores this process may run on: how many workers the data preparers start by default, and how
`--ddp` shares torch's threads among its ranks. Torch-free, as the preparers are."""
import os


def available_cores() -> int:
    """The cores this process may run on (a Slurm or taskset allocation, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
