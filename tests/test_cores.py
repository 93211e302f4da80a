import os

import cores


def test_available_cores_are_the_allocation_not_the_machine(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert cores.available_cores() == 3  # a taskset or Slurm allocation of three cores on a 64-core machine


def test_available_cores_fall_back_to_the_machine_where_there_is_no_affinity(monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert cores.available_cores() == 8
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # unknown: one
    assert cores.available_cores() == 1
