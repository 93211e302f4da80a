"""The machine a run uses: device and autocast dtype, the matmul peak MFU is measured against,
and batches moved to the device (pinned memory, the next batch prefetched)."""
import time

import torch

from errors import UserError


def select_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device = {name}: CUDA is not available on this machine (use device = cpu or auto)")
    return torch.device(name)


def cpu_supports_bf16() -> bool:
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def select_dtype(name: str, device: torch.device) -> torch.dtype:
    """Autocast dtype: bf16 where the hardware has it, else fp16 on CUDA (with a GradScaler), else fp32."""
    if name != "auto":
        return getattr(torch, name)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_supports_bf16() else torch.float32


def measure_matmul_flops(device: torch.device, dtype: torch.dtype, size: int = 1024,
                         seconds: float = 0.3) -> float:
    """Peak matmul rate actually reached on this device: the denominator of MFU."""
    generator = torch.Generator(device=device).manual_seed(0)  # leaves the training RNG alone
    a = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(3):
        a @ b
    synchronize()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            a @ b
        count += 10
        synchronize()
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
