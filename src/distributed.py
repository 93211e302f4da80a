"""A rank of a run in several processes (torch.distributed): joining the group the environment
describes (torchrun's, or launcher.py's for --ddp), the collectives the trainer needs, and the rank's
side of the launcher's protocol (die with it, report errors and completion to it).
"""
import ctypes
import datetime
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from errors import UserError

# A collective that waits longer than this fails the run instead of hanging it: long enough for
# rank 0 to save a large checkpoint while the others wait at the barrier.
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=10)
# Where a rank started by launch() writes its UserError (rankN.txt), so that the launcher prints it
# once, or its traceback (rankN.traceback), so that the console keeps one line.
ERROR_FILE_VARIABLE = "BERT_DDP_ERROR_FILE"
# The launcher's process id, given to the ranks it starts: they die with it (die_with_launcher).
LAUNCHER_VARIABLE = "BERT_DDP_LAUNCHER_PID"
PR_SET_PDEATHSIG = 1  # linux/prctl.h

_control_group = None  # gloo group for host-side agreement (the stop flag) without a device sync


def launched() -> bool:
    """True in a rank started by torchrun or by launch()."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


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


def die_with_launcher(launcher: int):
    """A rank is killed when its launcher dies, however it dies (kill -9 too): a run is never
    written by processes nobody controls. Linux: the kernel's parent-death signal;
    elsewhere a thread that watches the parent."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
            raise OSError(ctypes.get_errno(), "prctl")
    except (OSError, AttributeError):  # no prctl here
        threading.Thread(target=watch_parent, args=(launcher,), daemon=True, name="watch launcher").start()
    if os.getppid() != launcher:  # it died before the signal was asked for
        os.kill(os.getpid(), signal.SIGKILL)


def watch_parent(launcher: int, interval: float = 0.5):
    while os.getppid() == launcher:
        time.sleep(interval)
    os.kill(os.getpid(), signal.SIGKILL)


def rank_main(run):
    """Call run() in a rank, which dies with what started it (launch(), or torchrun's agent on this
    machine): a UserError goes to the launcher's error file (printed there once) when launch()
    started us, else it is raised; the process group is left either way."""
    die_with_launcher(int(os.environ.get(LAUNCHER_VARIABLE, os.getppid())))
    error_file = os.environ.get(ERROR_FILE_VARIABLE)
    try:
        run()
        if dist.is_initialized():
            dist.barrier()  # leave together: a rank exiting while a peer still talks to it aborts the peer
        if error_file:
            finished_file(Path(error_file)).touch()  # every rank has finished: the run is complete
    except Exception as error:
        if not error_file and lost_a_peer(error):  # torchrun: its agent reports the exit code
            print(f"error: rank {dist.get_rank()}: another process of the job ended ({first_line(error)}); "
                  f"resume the job with --cp and its last checkpoint", file=sys.stderr)
            sys.exit(1)
        if not error_file:
            raise
        if isinstance(error, UserError):
            Path(error_file).write_text(str(error), encoding="utf-8")
            sys.exit(2)
        Path(error_file).with_suffix(".traceback").write_text(traceback.format_exc(), encoding="utf-8")
        sys.exit(1)
    finally:
        leave()


# What gloo and NCCL say when a peer process is gone (killed, or its machine lost).
PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "remote process exited",
             "communicator was aborted")


def lost_a_peer(error: Exception) -> bool:
    return isinstance(error, RuntimeError) and dist.is_initialized() and any(text in str(error) for text in PEER_LOST)


def first_line(error: Exception) -> str:
    """The gist of a backend's message: its first sentence, without the source location in brackets."""
    line = str(error).strip().splitlines()[0]
    line = line.split("] ", 1)[1] if line.startswith("[") and "] " in line else line
    return line.split(". ", 1)[0]


def finished_file(error_file: Path) -> Path:
    """Where a rank of launch() says that it, and so every rank, has finished the run (rankN.finished)."""
    return error_file.with_suffix(".finished")
