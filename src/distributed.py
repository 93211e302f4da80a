"""A run in several processes (torch.distributed): joining the group the environment describes
(torchrun's, or launcher.py's for --ddp), and the collectives the trainer and the tasks need, each
the identity in a single process. A rank's process itself (dying with its launcher, reporting to
it) is rank_process.py's.
"""
import datetime
import os

import torch
import torch.distributed as dist

from errors import UserError

# A collective that waits longer than this fails the run instead of hanging it: long enough for
# rank 0 to save a large checkpoint while the others wait at the barrier.
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=10)

_control_group = None  # gloo group for host-side agreement (the stop flag) without a device sync


def join(device: torch.device, backend: str = "auto") -> tuple[int, int, int]:
    """Join the process group the environment describes (env:// rendezvous at MASTER_ADDR:MASTER_PORT):
    dist-backend (auto: NCCL with one GPU per rank on CUDA, gloo on CPU). Returns rank, world size, local rank."""
    global _control_group
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if device.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise UserError(f"local rank {local_rank} has no GPU: this machine has {torch.cuda.device_count()}")
        torch.cuda.set_device(local_rank)
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    elif backend == "nccl" and device.type != "cuda":
        raise UserError(f"dist-backend = nccl needs CUDA devices, but device is {device}: use gloo")
    try:
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=COLLECTIVE_TIMEOUT)
    except dist.DistNetworkError as error:
        if "EADDRINUSE" not in str(error) and "address already in use" not in str(error).lower():
            raise
        raise UserError(f"dist-master-port = {os.environ['MASTER_PORT']}: the port is in use "
                        f"(another run?); choose a free one") from None
    _control_group = dist.new_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT) if backend != "gloo" else None
    return rank, world_size, local_rank


def leave():
    global _control_group
    if dist.is_initialized():
        dist.destroy_process_group()
    _control_group = None


def any_rank(flag: bool) -> bool:
    """True on every rank when `flag` is True on any: all ranks stop at the same step."""
    if not dist.is_initialized():
        return flag
    tensor = torch.tensor([int(flag)])
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=_control_group)
    return bool(tensor.item())


def from_rank0(value: float) -> float:
    """Rank 0's value on every rank: its clock decides when a time budget is spent."""
    if not dist.is_initialized():
        return value
    tensor = torch.tensor([value], dtype=torch.float64)
    dist.broadcast(tensor, src=0, group=_control_group)
    return tensor.item()


def every_rank(value) -> list:
    """Each rank's `value` (any picklable object), in rank order, on every rank: an evaluation's
    predictions brought together. [value] in a single process."""
    if not dist.is_initialized():
        return [value]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def all_ranks(flag: torch.Tensor) -> torch.Tensor:
    """A bool device tensor, True only where it is True on every rank (the finite-loss check)."""
    if not dist.is_initialized():
        return flag
    as_int = flag.to(torch.int32)
    dist.all_reduce(as_int, op=dist.ReduceOp.MIN)
    return as_int.bool()
