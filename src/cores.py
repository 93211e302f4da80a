"""The cores this process may run on: how many workers the data preparers start by default, and how
`--ddp` shares torch's threads among its ranks; and the cgroups (a container's `--cpus` and
`--memory`, a Slurm job's) that hold the limits of its share of the machine. Torch-free, as the
preparers are."""
import os
from pathlib import Path, PurePosixPath

HOST = Path("/")  # where /proc and /sys/fs/cgroup are; tests give a tree of their own


def available_cores(root: Path = HOST) -> int:
    """The cores this process may run on: its affinity (a Slurm or taskset allocation, not the
    machine's count), fewer where its cgroup's CPU quota allows less (`docker --cpus 2` on a 64-core
    host: 2), at least one."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_limit(root)
    return max(1, min(cores, quota) if quota is not None else cores)


def cgroup_cpu_limit(root: Path = HOST) -> int | None:
    """The cores this process's CPU quota pays for, rounded up (1.5 CPUs: 2), the tightest of its
    cgroup and the cgroups above it; None where none sets one (v2's "max", v1's -1, no cgroup files)."""
    limits = []
    for folder in cgroup_folders("cpu", root):
        quota_and_period = read_words(folder / "cpu.max") or (read_words(folder / "cpu.cfs_quota_us")
                                                              + read_words(folder / "cpu.cfs_period_us"))
        if len(quota_and_period) != 2 or quota_and_period[0] in ("max", "-1"):
            continue
        try:
            quota, period = map(int, quota_and_period)
        except ValueError:
            continue
        if quota > 0 and period > 0:
            limits.append(-(-quota // period))
    return min(limits, default=None)


def cgroup_folders(controller: str, root: Path = HOST) -> list[Path]:
    """The folders of this process's cgroups that may hold a `controller`'s (cpu, memory) limits:
    its own cgroup's first, then each one above it. A container sees its own cgroup as the tree's
    top while /proc/self/cgroup may still name the host's path, so the walk goes up to the top."""
    folders = []
    for tree, path in cgroup_trees(controller, Path(root)):
        parts = [part for part in PurePosixPath(path).parts if part not in ("/", "..")]
        folders += [tree.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]
    return folders


def cgroup_trees(controller: str, root: Path) -> list[tuple[Path, str]]:
    """(tree, this process's cgroup in it) from /proc/self/cgroup: cgroup v2's unified tree, and
    the controller's own tree under v1 (a hybrid machine has both); none where it is unreadable."""
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:  # not Linux, or no /proc
        return []
    trees, found = root / "sys/fs/cgroup", []
    for hierarchy, controllers, path in (line.split(":", 2) for line in lines if line.count(":") >= 2):
        if hierarchy == "0" and not controllers:
            found.append((trees, path))
        elif controller in controllers.split(","):  # mounted as cpu,cpuacct with cpu a link to it, or as cpu
            joined = trees / controllers
            found.append((joined if joined.is_dir() else trees / controller, path))
    return found


def read_words(path: Path) -> list[str]:
    """The words of a cgroup file, none where it is missing (a controller not enabled, the tree's top)."""
    try:
        return path.read_text().split()
    except OSError:
        return []
