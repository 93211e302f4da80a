"""Training in several processes with torch.distributed: `--ddp --nproc N` starts and watches N
ranks on this machine; under torchrun (RANK, WORLD_SIZE, LOCAL_RANK set) main.py joins its group.
"""
import ctypes
import datetime
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from errors import UserError
from tokenizing import default_workers

# A collective that waits longer than this fails the run instead of hanging it: long enough for
# rank 0 to save a large checkpoint while the others wait at the barrier.
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=10)
# Where a rank started by launch() writes its UserError (rankN.txt), so that the launcher prints it
# once, or its traceback (rankN.traceback), so that the console keeps one line.
ERROR_FILE_VARIABLE = "BERT_DDP_ERROR_FILE"
# The launcher's process id, given to the ranks it starts: they die with it (die_with_launcher).
LAUNCHER_VARIABLE = "BERT_DDP_LAUNCHER_PID"
PR_SET_PDEATHSIG = 1  # linux/prctl.h
MAIN = Path(__file__).resolve().with_name("main.py")

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


def all_ranks(flag: torch.Tensor) -> torch.Tensor:
    """A bool device tensor, True only where it is True on every rank (the finite-loss check)."""
    if not dist.is_initialized():
        return flag
    as_int = flag.to(torch.int32)
    dist.all_reduce(as_int, op=dist.ReduceOp.MIN)
    return as_int.bool()


def die_with_launcher(launcher: int):
    """A rank of launch() is killed when its launcher dies, however it dies (kill -9 too): a run
    is never written by processes nobody controls. Linux: the kernel's parent-death signal;
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
    """Call run() in a rank: a UserError goes to the launcher's error file (printed there once)
    when launch() started us, else it is raised; the process group is left either way."""
    if LAUNCHER_VARIABLE in os.environ:
        die_with_launcher(int(os.environ[LAUNCHER_VARIABLE]))
    error_file = os.environ.get(ERROR_FILE_VARIABLE)
    try:
        run()
        if dist.is_initialized():
            dist.barrier()  # leave together: a rank exiting while a peer still talks to it aborts the peer
        if error_file:
            finished_file(Path(error_file)).touch()  # every rank has finished: the run is complete
    except Exception as error:
        if not error_file:
            raise
        if isinstance(error, UserError):
            Path(error_file).write_text(str(error), encoding="utf-8")
            sys.exit(2)
        Path(error_file).with_suffix(".traceback").write_text(traceback.format_exc(), encoding="utf-8")
        sys.exit(1)
    finally:
        leave()


def finished_file(error_file: Path) -> Path:
    """Where a rank of launch() says that it, and so every rank, has finished the run (rankN.finished)."""
    return error_file.with_suffix(".finished")


def launch(argv: list[str], nproc: int, master_addr: str, master_port: int) -> int:
    """Run `main.py argv` as ranks 0..nproc-1 on this machine and wait for them.

    When one rank fails, the others are killed at once (they would only wait for it until the
    collective timeout); the return value is the exit code to leave with, and the message says
    which rank failed. A UserError is printed once, however many ranks raised it; the ranks'
    tracebacks stay in files the message names, not on the console.
    """
    check_port_free(master_port)
    error_dir = Path(tempfile.mkdtemp(prefix="bert-ddp-"))
    try:
        failed = run_ranks(argv, nproc, master_addr, master_port, error_dir)
        return 0 if failed is None else report_failure(*failed, nproc, error_dir)
    finally:
        if not any(error_dir.glob("*.traceback")):
            shutil.rmtree(error_dir, ignore_errors=True)


def threads_per_rank(nproc: int) -> int:
    """The cores this process may use shared among the ranks: torch gives each process a thread per
    core, and N ranks each spinning that many threads on the same cores run CPU steps several times
    slower (torchrun sets 1; OMP_NUM_THREADS set by the user wins)."""
    return max(1, default_workers() // nproc)


def run_ranks(argv: list[str], nproc: int, master_addr: str, master_port: int,
              error_dir: Path) -> tuple[int, int] | None:
    """Start the ranks, pass SIGTERM on to them, and wait: (rank, exit code) of the first that failed."""
    processes, error_files = [], [error_dir / f"rank{rank}.txt" for rank in range(nproc)]
    threads = {"OMP_NUM_THREADS": str(threads_per_rank(nproc))} if "OMP_NUM_THREADS" not in os.environ else {}
    for rank in range(nproc):
        env = os.environ | threads | {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc),
                            "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": master_addr,
                            "MASTER_PORT": str(master_port), ERROR_FILE_VARIABLE: str(error_files[rank]),
                            LAUNCHER_VARIABLE: str(os.getpid())}
        processes.append(subprocess.Popen([sys.executable, str(MAIN), *argv], env=env))
    print(f"started {nproc} processes: " + ", ".join(f"rank {rank} pid {process.pid}"
                                                    for rank, process in enumerate(processes)),
          file=sys.stderr, flush=True)

    def forward(signum, frame):  # Ctrl-C reaches the ranks directly; `kill PARENT` is passed on
        for process in processes:
            if process.poll() is None:
                process.send_signal(signum)
    previous = {signum: signal.signal(signum, forward) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        return wait_for_first_failure(processes, [finished_file(path) for path in error_files])
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def report_failure(rank: int, code: int, nproc: int, error_dir: Path) -> int:
    """One line on the console; the exit code to leave with."""
    # A UserError in one rank can make another fail first (its peer is gone): report the cause.
    error_files = sorted(error_dir.glob("rank*.txt"), key=lambda path: int(path.stem[4:]))
    if error_files:
        print(f"error: {error_files[0].read_text(encoding='utf-8')}", file=sys.stderr)
        return 2
    how = exit_description(code)
    tracebacks = sorted(error_dir.glob("*.traceback"))
    where = f" (tracebacks: {', '.join(map(str, tracebacks))})" if tracebacks else ""
    print(f"error: rank {rank} of {nproc} {how}; the other ranks were stopped{where}", file=sys.stderr)
    return 128 - code if code < 0 else code


def exit_description(code: int) -> str:
    return f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"


def check_port_free(port: int):
    """Rank 0 listens on dist-master-port: a port in use is named before any rank starts."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the rendezvous store does
        try:
            probe.bind(("", port))
        except OSError as error:
            raise UserError(f"dist-master-port = {port}: the port is in use ({error.strerror}); "
                            f"choose a free one") from None


def exit_codes(processes: list[subprocess.Popen], finished: list[Path], warned: set) -> list[int | None]:
    """Each rank's exit code so far (None: running), 0 for one that failed after its `finished`
    file, with a warning the first time (its rank goes into `warned`)."""
    codes = [process.poll() for process in processes]
    for rank, code in enumerate(codes):
        if code not in (None, 0) and finished[rank].exists():
            if rank not in warned:
                print(f"warning: rank {rank} {exit_description(code)} after the run had finished "
                      f"(in torch.distributed's teardown); the run is complete", file=sys.stderr, flush=True)
                warned.add(rank)
            codes[rank] = 0
    return codes


def wait_for_first_failure(processes: list[subprocess.Popen], finished: list[Path]) -> tuple[int, int] | None:
    """Wait for all; on the first non-zero exit kill the rest and return (rank, exit code). A rank
    that failed after writing its `finished` file (every rank had passed the last barrier) failed
    in torch.distributed's teardown, with the run complete: a warning, not a failure."""
    warned = set()
    while True:
        codes = exit_codes(processes, finished, warned)
        failed = [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            for process in processes:
                if process.poll() is None:
                    process.kill()
            for process in processes:
                process.wait()
            # gloo aborts a rank whose peer vanished (SIGABRT, "terminate called"): when ranks fail
            # within one look, name the one that did not merely react to another's death.
            return min(failed, key=lambda failure: failure[1] == -signal.SIGABRT)
        if all(code == 0 for code in codes):
            return None
        time.sleep(0.02)
