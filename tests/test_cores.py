"""The cores a process may run on: its affinity, and the CPU quota of its cgroup (a container's
`--cpus`, a Slurm job's), read from fake /proc and /sys/fs/cgroup trees."""
import os
from pathlib import Path

import pytest

import cores

SIXTY_FOUR = set(range(64))


def cgroup_tree(root: Path, proc_self_cgroup: str, files: dict[str, str]) -> Path:
    """A /proc/self/cgroup and files under /sys/fs/cgroup, as a container or a Slurm job sees them."""
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text(proc_self_cgroup)
    for name, text in files.items():
        path = root / "sys/fs/cgroup" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return root


@pytest.fixture
def sixty_four_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: SIXTY_FOUR, raising=False)


def test_available_cores_are_the_allocation_not_the_machine(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert cores.available_cores(tmp_path) == 3  # a taskset or Slurm allocation of three cores on a 64-core machine


def test_available_cores_fall_back_to_the_machine_where_there_is_no_affinity(monkeypatch, tmp_path):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert cores.available_cores(tmp_path) == 8
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # unknown: one
    assert cores.available_cores(tmp_path) == 1


def test_a_cgroup_v2_quota_caps_the_cores(sixty_four_cores, tmp_path):
    """docker --cpus 2.5 on a 64-core host: 3 cores' worth of threads, not 64."""
    root = cgroup_tree(tmp_path, "0::/system.slice/docker-abc.scope\n",
                       {"system.slice/docker-abc.scope/cpu.max": "250000 100000", "system.slice/cpu.max": "max 100000"})
    assert cores.cgroup_cpu_limit(root) == 3
    assert cores.available_cores(root) == 3


def test_the_tightest_of_the_nested_cgroups_wins(sixty_four_cores, tmp_path):
    root = cgroup_tree(tmp_path, "0::/slurm/uid_1000/job_7/step_0\n",
                       {"slurm/uid_1000/job_7/step_0/cpu.max": "max 100000",
                        "slurm/uid_1000/job_7/cpu.max": "400000 100000", "slurm/cpu.max": "200000 100000"})
    assert cores.available_cores(root) == 2


def test_no_quota_leaves_the_affinity(sixty_four_cores, tmp_path):
    root = cgroup_tree(tmp_path, "0::/user.slice\n", {"user.slice/cpu.max": "max 100000"})
    assert cores.cgroup_cpu_limit(root) is None
    assert cores.available_cores(root) == 64
    assert cores.cgroup_cpu_limit(cgroup_tree(tmp_path / "bare", "0::/user.slice\n", {})) is None  # no files
    assert cores.cgroup_cpu_limit(tmp_path / "no-proc") is None  # not Linux


def test_an_affinity_below_the_quota_wins_and_a_fraction_of_a_core_is_one(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    root = cgroup_tree(tmp_path, "0::/\n", {"cpu.max": "800000 100000"})  # a container's own cgroup namespace
    assert cores.available_cores(root) == 2
    root = cgroup_tree(tmp_path / "half", "0::/\n", {"cpu.max": "50000 100000"})
    assert cores.cgroup_cpu_limit(root) == 1 and cores.available_cores(root) == 1


def test_a_cgroup_v1_quota_caps_the_cores(sixty_four_cores, tmp_path):
    proc_self_cgroup = "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n0::/\n"
    root = cgroup_tree(tmp_path, proc_self_cgroup, {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "150000",
                                                    "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000"})
    assert cores.available_cores(root) == 2
    unlimited = cgroup_tree(tmp_path / "unlimited", proc_self_cgroup,
                            {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "-1",
                             "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000"})
    assert cores.available_cores(unlimited) == 64


def test_a_container_that_sees_its_cgroup_as_the_top_of_the_tree(sixty_four_cores, tmp_path):
    """/proc/self/cgroup names the host's path, which the container's /sys/fs/cgroup/cpu does not have:
    its own limits are at the top, found by walking up."""
    root = cgroup_tree(tmp_path, "2:cpu:/docker/abc\n", {"cpu/cpu.cfs_quota_us": "400000",
                                                        "cpu/cpu.cfs_period_us": "100000"})
    assert cores.available_cores(root) == 4


def test_this_machine_reads_without_error():
    assert cores.available_cores() >= 1
