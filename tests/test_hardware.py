"""The MFU denominator: published GPU peaks by name, the peak-tflops key, the best of several
measured tries, and a measured peak measured again at validations and when MFU would read above
100% (said in the log when it rose); the CPU allocator's and oneDNN's kernel cache's settings."""
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hardware
import main
from errors import UserError
# The real matmul_flops_once: conftest's skip_flops_measurement replaces hardware's for the session, after this.
from hardware import GIB, cgroup_memory_limit, matmul_flops_once, peak_flops, published_peak_flops
from test_cores import cgroup_tree


@pytest.mark.parametrize("name, tflops", [("NVIDIA H100 80GB HBM3", 989), ("NVIDIA H100 PCIe", 756),
                                          ("NVIDIA H200", 989), ("NVIDIA A100-SXM4-80GB", 312), ("NVIDIA L4", 121),
                                          ("NVIDIA L40S", 362)])
def test_published_peaks_by_device_name(name, tflops):
    assert published_peak_flops(name) == tflops * 1e12


def test_an_unknown_gpu_and_the_cpu_are_measured_and_the_key_wins(monkeypatch):
    assert published_peak_flops("Some Future GPU") is None
    tries = iter([1e11, 3e11, 2e11, 1e11, 1e11])
    monkeypatch.setattr(hardware, "matmul_flops_once", lambda device, dtype: next(tries))
    assert peak_flops(torch.device("cpu"), torch.bfloat16, 0.0) == (3e11, "measured now (best of 5 tries)")
    assert peak_flops(torch.device("cpu"), torch.bfloat16, 12.5) == (12.5e12, "set by peak-tflops")


def test_calls_compared_are_timed_in_turn_and_each_keeps_its_fastest(monkeypatch):
    """A stall then slows one try of each (measure_dtype.py's float32 against bf16), not every try of one."""
    clock, order = iter(range(100)), []
    monkeypatch.setattr(hardware.time, "perf_counter", lambda: next(clock))
    calls = {name: (lambda name=name: order.append(name)) for name in ("float32", "bf16")}
    assert hardware.fastest_seconds(calls, tries=3) == {"float32": 1, "bf16": 1}
    assert order == ["float32", "bf16"] * 4  # one untimed call each, then three rounds


def test_one_try_is_a_rate_of_real_matmuls():
    flops = matmul_flops_once(torch.device("cpu"), torch.float32, size=128, seconds=0.01)
    assert 1e6 < flops < 1e15


def test_an_mfu_above_100_percent_measures_the_peak_again_and_says_so(mlm_workdir, monkeypatch):
    peaks = iter([1e6, 1e6, 1e6, 1e6, 1e6] + [1e13] * 1000)  # busy at the start: a tiny peak; idle later
    monkeypatch.setattr(hardware, "matmul_flops_once", lambda device, dtype: next(peaks))
    main.main(["--max-iters", "3", "--log-interval", "1", "--peak-tflops", "0"])  # measured, not conftest's key
    log = (Path("runs") / "run0" / "logs" / "log.txt").read_text(encoding="utf-8")
    assert "matmul peak of 1e-06 TFLOP/s, measured now" in log
    assert "note: the matmul peak measured now, 10 TFLOP/s, is above the 1e-06 measured before" in log
    mfus = [float(line.split("| mfu ")[1].split("%")[0]) for line in log.splitlines() if "| mfu " in line]
    assert all(mfu <= 100 for mfu in mfus)


def test_a_validation_measures_the_peak_again_keeping_the_higher(mlm_workdir, monkeypatch):
    """A peak measured low at the start reads every MFU after it high, though below 100%: the
    validations measure again, and a lower measurement later does not lower the peak."""
    peaks = iter([1e6] * 5 + [1e13] * 5 + [1e12] * 1000)
    monkeypatch.setattr(hardware, "matmul_flops_once", lambda device, dtype: next(peaks))
    main.main(["--max-iters", "3", "--val-interval", "1", "--log-interval", "100", "--peak-tflops", "0"])
    lines = (Path("runs") / "run0" / "logs" / "log.txt").read_text(encoding="utf-8").splitlines()
    validations = [i for i, line in enumerate(lines) if " | val loss " in line]
    notes = [i for i, line in enumerate(lines) if line == (
        "note: the matmul peak measured now, 10 TFLOP/s, is above the 1e-06 measured before "
        "(the machine was busier then): mfu is against it from here")]
    assert len(notes) == 1 and validations[0] < notes[0] < validations[1]  # at step 1's validation
    assert sum("note: the matmul peak" in line for line in lines) == 1
    mfus = [float(line.split("| mfu ")[1].split("%")[0]) for line in lines if "| mfu " in line]
    assert mfus and all(mfu <= 100 for mfu in mfus)


def test_the_first_log_line_measures_the_peak_again(mlm_workdir, monkeypatch):
    """Before any validation: an MFU under 100% (one FLOP a token) against a peak measured low."""
    import trainer
    monkeypatch.setattr(trainer, "flops_per_token", lambda *args: 1.0)
    peaks = iter([1e6] * 5 + [1e13] * 1000)
    monkeypatch.setattr(hardware, "matmul_flops_once", lambda device, dtype: next(peaks))
    main.main(["--max-iters", "3", "--val-interval", "100", "--log-interval", "1", "--peak-tflops", "0"])
    lines = (Path("runs") / "run0" / "logs" / "log.txt").read_text(encoding="utf-8").splitlines()
    steps = [i for i, line in enumerate(lines) if line.startswith("step ") and "| mfu " in line]
    notes = [i for i, line in enumerate(lines) if line.startswith("note: the matmul peak measured now, 10 TFLOP/s")]
    assert len(notes) == 1 and notes[0] < steps[0]
    assert all(line.split("| mfu ")[1].startswith("0.0%") for line in (lines[i] for i in steps))


def test_a_set_or_published_peak_is_not_measured_again(mlm_workdir, monkeypatch):
    monkeypatch.setattr(hardware, "matmul_flops_once", lambda device, dtype: pytest.fail("measured"))
    main.main(["--max-iters", "2", "--val-interval", "1", "--peak-tflops", "1e-9"])  # MFU far above 100%
    log = (Path("runs") / "run0" / "logs" / "log.txt").read_text(encoding="utf-8")
    assert "set by peak-tflops" in log and "note: the matmul peak" not in log


def test_a_model_over_the_limit_is_refused_saying_its_size(monkeypatch):
    monkeypatch.setattr(hardware, "cgroup_memory_limit", lambda root=None: None)  # whatever cgroup runs the tests
    weights = 10**11
    with pytest.raises(UserError) as refused:
        hardware.check_fits_memory(weights, copies=4, limit_gib=None, source="config.ini (d-ff = 1000000000)",
                                   flag="--max-gib")
    needed = 16 * weights / 2**30
    assert str(refused.value) == (f"config.ini (d-ff = 1000000000): the model would allocate {needed:,.1f} "
                                  f"GiB (4 x {weights:,} float32 weights), more than this machine's memory "
                                  f"({hardware.machine_memory() / 2**30:,.1f} GiB; --max-gib GIB sets another limit)")


def test_a_model_over_the_address_space_limit_is_refused_saying_so(monkeypatch):
    """Under `ulimit -v` the machine's memory is not what the process may take: the allocator would fail."""
    half = hardware.machine_memory() // 2
    monkeypatch.setattr(hardware.resource, "getrlimit", lambda which: (half, resource.RLIM_INFINITY))
    weights = int(0.75 * hardware.machine_memory()) // 4  # one copy: fits the machine, not half of it
    for limit_gib in (None, 2 * half / 2**30):  # a --memory-limit-gib above it is no way past it either
        with pytest.raises(UserError, match=r"the model would allocate .* more than what this process's address-space "
                                            r"limit leaves \([\d.,]+ GiB; ulimit -v sets it\)$"):
            hardware.check_fits_memory(weights, copies=1, limit_gib=limit_gib, source="x", flag="--max-gib")
    hardware.check_fits_memory(weights // 8, copies=1, limit_gib=None, source="x", flag="--max-gib")


def test_the_limit_can_be_set():
    hardware.check_fits_memory(10**6, copies=2, limit_gib=1, source="x", flag="--max-gib")
    with pytest.raises(UserError, match=r"^x: the model would allocate 0.0075 GiB \(2 x 1,000,000 float32 weights\), "
                                        r"more than --max-gib 0.001 GiB$"):
        hardware.check_fits_memory(10**6, copies=2, limit_gib=0.001, source="x", flag="--max-gib")



V1_UNLIMITED = "9223372036854771712"  # what cgroup v1 writes for no limit: LONG_MAX rounded down to a page


def test_a_cgroup_v2_memory_limit_is_the_tightest_of_its_cgroups(tmp_path):
    root = cgroup_tree(tmp_path, "0::/slurm/job_7/step_0\n",
                       {"slurm/job_7/step_0/memory.max": "max", "slurm/job_7/memory.max": str(3 * GIB),
                        "slurm/memory.max": str(5 * GIB)})
    assert hardware.cgroup_memory_limit(root) == (3 * GIB, "memory.max")
    assert hardware.machine_memory(root) == min(3 * GIB, hardware.physical_memory())


def test_a_cgroup_v1_memory_limit_and_its_none(tmp_path):
    proc_self_cgroup = "5:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n"
    root = cgroup_tree(tmp_path, proc_self_cgroup, {"memory/docker/abc/memory.limit_in_bytes": str(2 * GIB),
                                                    "memory/memory.limit_in_bytes": V1_UNLIMITED})
    assert hardware.cgroup_memory_limit(root) == (2 * GIB, "memory.limit_in_bytes")
    unlimited = cgroup_tree(tmp_path / "unlimited", proc_self_cgroup, {"memory/memory.limit_in_bytes": V1_UNLIMITED})
    assert hardware.cgroup_memory_limit(unlimited) is None


def test_no_memory_limit_leaves_the_machine_memory(tmp_path):
    for name, files in (("max", {"user.slice/memory.max": "max"}), ("missing", {})):
        root = cgroup_tree(tmp_path / name, "0::/user.slice\n", files)
        assert hardware.cgroup_memory_limit(root) is None
        assert hardware.machine_memory(root) == hardware.physical_memory()
    assert hardware.machine_memory(tmp_path / "no-proc") == hardware.physical_memory()
    roomy = cgroup_tree(tmp_path / "roomy", "0::/\n", {"memory.max": str(4 * hardware.physical_memory())})
    assert hardware.machine_memory(roomy) == hardware.physical_memory()  # a limit above the host's memory


def test_a_model_over_the_containers_limit_is_refused_naming_it(monkeypatch, tmp_path):
    """docker --memory 1g on a larger host: the limit that gets the process killed is the one named."""
    root = cgroup_tree(tmp_path, "0::/\n", {"memory.max": str(GIB)})
    monkeypatch.setattr(hardware, "physical_memory", lambda: 64 * GIB)
    monkeypatch.setattr(hardware, "cgroup_memory_limit", lambda host=None: cgroup_memory_limit(root))
    monkeypatch.setattr(hardware, "address_space_room", lambda: None)
    with pytest.raises(UserError) as refused:
        hardware.check_fits_memory(10**8, copies=4, limit_gib=None, source="config.ini", flag="--max-gib")
    assert str(refused.value) == ("config.ini: the model would allocate 1.5 GiB (4 x 100,000,000 float32 weights), "
                                  "more than this container's memory limit (cgroup memory.max: 1.0 GiB; --max-gib GIB "
                                  "sets another limit)")
    monkeypatch.setattr(hardware, "physical_memory", lambda: GIB // 2)  # the host's memory is the smaller
    with pytest.raises(UserError, match=r"more than this machine's memory \(0.5 GiB; --max-gib GIB sets another"):
        hardware.check_fits_memory(10**8, copies=4, limit_gib=None, source="config.ini", flag="--max-gib")


HEAP_CHECK = """
import ctypes, sys
import torch
import hardware
class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]
mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
mallinfo2.restype = MallInfo2
if sys.argv[1] == "kept":
    assert hardware.keep_freed_memory()
mapped = mallinfo2().hblkhd
block = torch.ones(6 * 2**20)  # 24 MiB
mapped_with_block = mallinfo2().hblkhd
del block
print(mapped_with_block - mapped, mallinfo2().fordblks)
"""


@pytest.mark.skipif(not hasattr(os, "confstr") or "glibc" not in (os.confstr("CS_GNU_LIBC_VERSION") or ""),
                    reason="mallopt and mallinfo2 are glibc's")
def test_freed_memory_is_kept_for_the_next_step_under_glibc():
    """A fresh process maps a 24 MiB block of its own and unmaps it when freed (the next one faults
    its pages in again); after keep_freed_memory the block comes from the heap and stays there, free."""
    def run(arm: str) -> tuple[int, int]:
        output = subprocess.run([sys.executable, "-c", HEAP_CHECK, arm], capture_output=True, text=True, check=True,
                                cwd=Path(hardware.__file__).parent).stdout
        return tuple(int(number) for number in output.split())
    mapped, _ = run("default")
    assert mapped >= 24 * 2**20
    mapped, free_in_heap = run("kept")
    assert mapped == 0 and free_in_heap >= 24 * 2**20


KERNEL_CACHE_CHECK = """
import os, sys
import hardware
if sys.argv[1] == "kept":
    hardware.keep_kernels_for_every_width()
import torch
weight = torch.randn(8, 8, dtype=torch.bfloat16)
for rows in [*range(100, 1200), 100]:  # 1,100 shapes, then the first again
    torch.randn(rows, 8, dtype=torch.bfloat16) @ weight
"""


@pytest.mark.skipif(not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="bf16 matmuls run on oneDNN with bf16")
@pytest.mark.parametrize("arm, environment, built_again", [("default", {}, True), ("kept", {}, False),
                                                           ("kept", {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024"}, True)])
def test_onednn_keeps_a_kernel_for_every_width_unless_the_user_said_otherwise(arm, environment, built_again):
    """oneDNN's log of kernel builds: after 1,100 other shapes, the first is built again by default (its
    cache keeps the last 1,024), found in the cache once the setting is made, and a capacity set in the
    environment stays."""
    inherited = {name: value for name, value in os.environ.items() if name != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    log = subprocess.run([sys.executable, "-c", KERNEL_CACHE_CHECK, arm], capture_output=True, text=True, check=True,
                         cwd=Path(hardware.__file__).parent,
                         env={**inherited, "ONEDNN_VERBOSE": "profile_create", **environment}).stdout
    builds = [line.split(",")[3] for line in log.splitlines() if ",100x8:8x8," in line]
    assert builds[0] == "create:cache_miss" and len(builds) == 2
    assert builds[1] == ("create:cache_miss" if built_again else "create:cache_hit")


@pytest.mark.parametrize("environment, threads, cores, expected", [
    ({}, 8, 2, 2), ({}, 2, 8, 2), ({"OMP_NUM_THREADS": "6"}, 6, 2, None)])
def test_torchs_threads_are_capped_at_the_cores_a_container_allows(monkeypatch, environment, threads, cores, expected):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    chosen = []
    monkeypatch.setattr(hardware.torch, "get_num_threads", lambda: threads)
    monkeypatch.setattr(hardware.torch, "set_num_threads", chosen.append)
    monkeypatch.setattr(hardware, "available_cores", lambda: cores)
    hardware.use_the_cores_allowed()
    assert chosen == ([] if expected is None else [expected])
