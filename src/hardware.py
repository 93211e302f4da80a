"""The machine a run uses: its memory (a model too large refused before it is built), device and
autocast dtype, the matmul peak MFU is measured against, and batches moved to the device (pinned
memory, the next batch prefetched)."""
import ctypes
import math
import os
import resource
import time
from pathlib import Path
from typing import Any, Callable

import torch

from cores import HOST, available_cores, cgroup_folders, read_words
from errors import UserError

BYTES_PER_WEIGHT = 4  # float32: how models are built and checkpoints stored
GIB = 2**30
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
ONEDNN_KERNELS_KEPT = 16_384  # at 38 kernels a training step's width, every width up to about 400
CGROUP_V1_UNLIMITED = 2**60  # v1's memory.limit_in_bytes without a limit: about 2**63, rounded to a page


def select_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device = {name}: CUDA is not available on this machine (use device = cpu or auto)")
    return torch.device(name)


def use_the_cores_allowed():
    """torch's threads capped at the cores this process may use (cores.available_cores: a container's
    or a Slurm job's quota, which torch's default of the affinity's cores ignores), so that its
    threads do not take turns on fewer cores; OMP_NUM_THREADS, where set (--ddp sets it per rank), wins."""
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(min(torch.get_num_threads(), available_cores()))


def keep_freed_memory() -> bool:
    """Under glibc, blocks up to 32 MiB come from the heap and up to 1 GiB freed at its top stays with
    the process, so a CPU training step reuses the pages the last one touched instead of faulting in
    fresh zeroed ones (1.10-1.15x on the 4 x 256 fine-tuning step, the same peak memory: etc/results/speed.md,
    "Fine-tuning past 3x"), as Intel's launcher gets from preloading jemalloc or tcmalloc. Elsewhere
    (macOS, musl) nothing; returns whether it was set."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, 32 * 2**20) and mallopt(M_TRIM_THRESHOLD, GIB))


def keep_kernels_for_every_width():
    """oneDNN, which runs bf16 matmuls on the CPU, builds a kernel for each matmul shape and keeps the
    last 1,024 it built; a fine-tuning step at its batch's exact width uses about 40, so with more
    than 25 widths in play (SST-2's first 192 batches have 53) a step mostly builds its kernels anew:
    1.1-1.15x on the 4 x 256 step, in less memory than the rebuilding churns (etc/results/step-time.md, "oneDNN's
    kernels for every width"). Keeps ONEDNN_KERNELS_KEPT. oneDNN reads the setting at the process's
    first matmul, so this runs before that; a value already in the environment stays."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(ONEDNN_KERNELS_KEPT))


def machine_memory(root: Path = HOST) -> int:
    """Bytes of memory this process may use: the machine's, or less where its cgroup's limit (a
    container's `--memory`, a Slurm job's `--mem`) is less."""
    return memory_and_its_cgroup_file(root)[0]


def physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cgroup_memory_limit(root: Path = HOST) -> tuple[int, str] | None:
    """The bytes this process's cgroup, or one above it, may hold, the tightest, and the file that
    says so (memory.max, v1's memory.limit_in_bytes); None where none sets a limit (v2's "max", v1's
    huge value, no cgroup files)."""
    limits = []
    for folder in cgroup_folders("memory", root):
        for name in ("memory.max", "memory.limit_in_bytes"):
            words = read_words(folder / name)
            if len(words) == 1 and words[0].isdigit() and int(words[0]) < CGROUP_V1_UNLIMITED:
                limits.append((int(words[0]), name))
    return min(limits, default=None)


def memory_and_its_cgroup_file(root: Path = HOST) -> tuple[int, str | None]:
    """machine_memory, and the cgroup file that sets it where the container's limit is the smaller
    (None: the machine's memory)."""
    physical, limit = physical_memory(), cgroup_memory_limit(root)
    return limit if limit is not None and limit[0] < physical else (physical, None)


def address_space_room() -> int | None:
    """Bytes this process may still map under its address-space limit (ulimit -v), beside what it
    maps now (torch alone maps hundreds of MiB); None where there is no limit."""
    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    if limit == resource.RLIM_INFINITY:
        return None
    try:
        mapped = int(Path("/proc/self/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # not Linux
        mapped = 0
    return max(0, limit - mapped)


def memory_limit(limit_gib: float | None, flag: str) -> tuple[float, str]:
    """The bytes a model may take, and how to name that limit: limit_gib where given (swap may hold
    more than the machine's memory), else the machine's memory or its container's limit; never more
    than the address-space limit leaves, which no allocation gets past."""
    if limit_gib is None:
        limit, cgroup_file = memory_and_its_cgroup_file()
        # A model the host would hold gets the process killed in a container that allows less.
        place = f"this container's memory limit (cgroup {cgroup_file}: " if cgroup_file else "this machine's memory ("
        text = f"{place}{gib_text(limit)}; {flag} GIB sets another limit)"
    else:
        limit, text = limit_gib * GIB, f"{flag} {limit_gib:g} GiB"
    room = address_space_room()
    if room is not None and room < limit:
        return room, f"what this process's address-space limit leaves ({gib_text(room)}; ulimit -v sets it)"
    return limit, text


def check_fits_memory(weights: int, *, copies: int, limit_gib: float | None, source: str, flag: str):
    """Refuse a model of `weights` float32 weights (model.estimated_parameters) that, `copies` times over
    (import: 2; training: weights, gradients and Adam's two moments, 4), would take more than
    limit_gib, or than the machine's memory when None, or than the address-space limit leaves: one
    line before anything is allocated, not a process the kernel kills or an allocator's traceback.
    source names what set the shape (a file and its keys); flag, how to raise the limit."""
    needed = copies * BYTES_PER_WEIGHT * weights
    limit, limit_text = memory_limit(limit_gib, flag)
    if needed > limit:
        raise UserError(f"{source}: the model would allocate {gib_text(needed)} ({copies} x {weights:,} float32 "
                        f"weights), more than {limit_text}")


def gib_text(size: float) -> str:
    """Bytes in GiB, with the digits a small model needs too (0.0014 GiB, not 0.0)."""
    return f"{size / GIB:,.1f} GiB" if size >= GIB else f"{size / GIB:.2g} GiB"


def cpu_supports_bf16() -> bool:
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def select_dtype(name: str, device: torch.device) -> torch.dtype:
    """The autocast dtype of `dtype = name` on `device`."""
    return getattr(torch, name) if name != "auto" else auto_dtype(device)[0]


def fast_dtype(device: torch.device) -> torch.dtype:
    """The device's fastest autocast dtype for wide matmuls: bf16 where it has it, else fp16 on CUDA
    (with a GradScaler), else float32."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_supports_bf16() else torch.float32


def auto_dtype(device: torch.device) -> tuple[torch.dtype, str]:
    """dtype = auto, and why (for the log): the device's fast_dtype, a rule of the device and never a
    timing, so that every run of a config on a machine chooses alike. On the bf16 CPUs measured, bf16
    ran the MLM step 1.3-2.8x faster than float32 at every size from 2 x 32 to 6 x 768 (etc/results/speed.md,
    "dtype = auto on a CPU"); where the two are close, either is fine as long as it is the same."""
    dtype = fast_dtype(device)
    if dtype == torch.float32:
        return dtype, "this CPU has no bf16"
    return dtype, f"this {'GPU' if device.type == 'cuda' else 'CPU'}'s fastest: {str(dtype).removeprefix('torch.')}"


def use_deterministic_algorithms():
    """deterministic = true: the kernels that add in any order (CUDA's atomic adds, cuBLAS's split
    reductions, cuDNN's autotuned choices) replaced by ones that repeat, as transformers'
    full_determinism does; an op without such a kernel warns instead of stopping the run. cuBLAS
    reads its workspace setting at its first call, so this runs before the model is built."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False


# Published dense (no sparsity) tensor-core peaks in TFLOP/s, bf16 (fp16 where there is no bf16),
# by a part of the device name; the first match wins, so longer names come first.
PUBLISHED_PEAK_TFLOPS = (("H200", 989.0), ("H100 PCIe", 756.0), ("H100", 989.0), ("A100", 312.0),
                         ("L40S", 362.0), ("L4", 121.0), ("A10G", 70.0), ("A10", 125.0), ("RTX 4090", 165.0),
                         ("RTX 3090", 71.0), ("V100", 125.0), ("T4", 65.0))


def published_peak_flops(device_name: str) -> float | None:
    """The device's published dense bf16/fp16 peak in FLOP/s, or None when the table lacks it."""
    for part, tflops in PUBLISHED_PEAK_TFLOPS:
        if part.lower() in device_name.lower():
            return tflops * 1e12
    return None


MEASURED_NOW = "measured now (best of 5 tries)"  # peak_flops's source when it measured the peak


def peak_flops(device: torch.device, dtype: torch.dtype, given_tflops: float) -> tuple[float, str]:
    """The denominator of MFU and where it comes from: peak-tflops when set; on CUDA the published
    figure for the device; else the best of several short matmul measurements."""
    if given_tflops:
        return given_tflops * 1e12, "set by peak-tflops"
    if device.type == "cuda" and dtype != torch.float32:
        name = torch.cuda.get_device_name(device)
        published = published_peak_flops(name)
        if published:
            return published, f"published for {name}"
    return measure_matmul_flops(device, dtype), MEASURED_NOW


def measure_matmul_flops(device: torch.device, dtype: torch.dtype, tries: int = 5) -> float:
    """The matmul rate this device reaches now, the best of several short tries: a busy moment
    lowers one try, not the best."""
    return max(matmul_flops_once(device, dtype) for _ in range(tries))


def seconds_per_call(call: Callable[[], object], tries: int = 3) -> float:
    """The fastest of `tries` timed calls of a CPU function, after one untimed (its first-call costs)."""
    return fastest_seconds({None: call}, tries)[None]


def fastest_seconds(calls: dict[Any, Callable[[], object]], tries: int = 3) -> dict[Any, float]:
    """seconds_per_call for several functions compared, their calls taken in turn (a, b, a, b, ...):
    a host that stalls a core for part of a second then slows a try of each, not every try of one."""
    for call in calls.values():
        call()
    fastest = dict.fromkeys(calls, math.inf)
    for _ in range(tries):
        for key, call in calls.items():
            start = time.perf_counter()
            call()
            fastest[key] = min(fastest[key], time.perf_counter() - start)
    return fastest


def synchronize(device: torch.device):
    """Wait for the device's queued work, so that a clock read after it counts that work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_flops_once(device: torch.device, dtype: torch.dtype, size: int = 1024, seconds: float = 0.1) -> float:
    """Matmul rate of one short try of size x size products."""
    generator = torch.Generator(device=device).manual_seed(0)  # leaves the training RNG alone
    a = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    for _ in range(3):
        a @ b
    synchronize(device)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            a @ b
        count += 10
        synchronize(device)
    return 2 * size ** 3 * count / (time.perf_counter() - start)


def to_device(batch: dict, device: torch.device, non_blocking: bool) -> dict:
    """numpy arrays to device tensors; pinned host memory lets the copy overlap compute."""
    moved = {}
    for name, value in batch.items():
        if value is None:
            moved[name] = None
            continue
        tensor = torch.from_numpy(value)
        if device.type == "cuda" and non_blocking:
            tensor = tensor.pin_memory().to(device, non_blocking=True)
        else:
            tensor = tensor.to(device)
        moved[name] = tensor
    return moved


def prefetch(batches, device: torch.device, non_blocking: bool):
    """Yield (position, device batch) while the next batch is already assembled and on its way."""
    iterator = iter(batches)
    position, batch = next(iterator)
    upcoming = (position, to_device(batch, device, non_blocking))
    for position, batch in iterator:
        current, upcoming = upcoming, (position, to_device(batch, device, non_blocking))
        yield current
    yield upcoming
