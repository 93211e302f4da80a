"""A run's directory and what is written there as it trains: runs/runN, log.txt, the console
above the progress bar, TensorBoard scalars and optionally Weights & Biases."""
import errno
import fcntl
import os
import re
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.record_writer import RecordWriter
from tqdm import tqdm

from atomic import atomic_write
from config import Config
from errors import UserError, naming_a_full_disk

# A metric with no value on the data it was measured on: a correlation where the predictions (or
# the labels) are all equal, scipy's NaN. It is said so, never plotted, and never a best score.
UNDEFINED = "undefined (constant predictions or labels)"


def metric_text(value) -> str:
    """A metric as log lines and tables show it: a fraction to 4 places, a count as it is, None as UNDEFINED."""
    if value is None:
        return UNDEFINED
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def create_run_dir(runs_dir: Path, run_id: str = "") -> Path:
    """runs/RUN-ID, which must not exist yet, or runs/runN for the next free N; mkdir is the
    lock, so two runs never share one."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    if run_id:
        run_dir = runs_dir / run_id
        try:
            run_dir.mkdir()
        except FileExistsError:
            if held_by_another_process(run_dir):
                raise UserError(f"run-id = {run_id}: another process is training in {run_dir}; wait for it to "
                                f"end, or choose another run-id") from None
            latest = run_dir / "checkpoints" / "checkpoint.pt"
            if not latest.is_file():  # a run killed before its first save
                raise UserError(f"run-id = {run_id}: {run_dir} exists but holds no checkpoint to resume; "
                                f"remove it, or choose another run-id") from None
            raise UserError(f"run-id = {run_id}: {run_dir} exists; resume it with --cp {latest}, "
                            f"or choose another run-id") from None
        return run_dir
    number = 0
    while True:
        run_dir = runs_dir / f"run{number}"
        try:
            run_dir.mkdir()
            return run_dir
        except FileExistsError:
            number += 1


def write_run_config(run_dir: Path, config: Config, processes: int, start: str | None):
    """runN/config.ini: every key of the run (it loads with --config), then as comments the number
    of processes and the checkpoint whose weights it started from (run_provenance reads them)."""
    lines = config.describe() + [f"# {processes} process(es)"] + ([f"# started from {start}"] if start else [])
    atomic_write(run_dir / "config.ini", lambda temp: temp.write_text("\n".join(lines) + "\n"))


def run_provenance(config_text: str) -> tuple[str, str]:
    """(processes, start) as a run's config.ini records them: "unknown" and "none" where it does not."""
    processes = re.search(r"^#\s*(\d+) process", config_text, re.MULTILINE)
    start = re.search(r"^#\s*started from (.+)$", config_text, re.MULTILINE)
    return processes.group(1) if processes else "unknown", start.group(1).strip() if start else "none"


# What flock answers on a file system without locks (some network mounts): training goes on there,
# unlocked, since a user on NFS must still be able to train.
NO_LOCKS = {errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP}


def held_by_another_process(run_dir: Path) -> bool:
    """Whether a process holds the run directory's lock (lock_run_dir): it is training there. False
    where the file system has no locks: it cannot tell (lock_run_dir warns then)."""
    try:
        handle = (run_dir / ".lock").open("r")
    except FileNotFoundError:
        return False
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError as error:
            if error.errno in NO_LOCKS:
                return False
            raise
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False


def lock_run_dir(run_dir: Path):
    """An OS lock on the run directory while a process trains in it (released when the process
    ends, however it ends): a second process resuming the same run is refused."""
    return lock_directory(run_dir, "another process is training this run")


def lock_directory(directory: Path, busy: str):
    """An OS lock on directory/.lock, held until the returned handle closes or the process ends;
    where another process holds it, one line: `busy`, and what to do. Where the file system has no
    locks, one warning line, and the handle unlocked: nothing refuses a second process then."""
    handle = (directory / ".lock").open("a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise UserError(f"{directory}: {busy} (it holds {directory / '.lock'}); wait for it to end, "
                        f"or stop it") from None
    except OSError as error:
        if error.errno not in NO_LOCKS:
            handle.close()
            raise
        print(f"warning: {directory}: its file system has no file locks ({error.strerror or error}); going on "
              f"unlocked, so a second process started there is not refused", file=sys.stderr, flush=True)
    return handle


class EventFile:
    """TensorBoard scalars, written and flushed in the caller's thread: a full disk is one line naming
    the file, at once (SummaryWriter's writer thread prints a traceback of its own, and training goes on)."""

    def __init__(self, directory: Path):
        number = 0
        while True:  # a new file for each process and each run in it, as SummaryWriter names them
            self.path = directory / f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}." \
                                    f"{os.getpid()}.{number}"
            try:
                self.file = open(self.path, "xb")
                break
            except FileExistsError:
                number += 1
        self.write(Event(wall_time=time.time(), file_version="brain.Event:2"))

    def write(self, event: Event):
        with naming_a_full_disk(self.path):
            RecordWriter(self.file).write(event.SerializeToString())
            self.file.flush()

    def add_scalars(self, step: int, values: dict):
        summary = Summary(value=[Summary.Value(tag=name, simple_value=value) for name, value in values.items()])
        self.write(Event(wall_time=time.time(), step=step, summary=summary))

    def close(self):
        with naming_a_full_disk(self.path):
            self.file.close()


class RunLog:
    """Messages and scalars of one run, under the run directory's lock; silent off rank 0 (run_dir None).
    A full disk stops the run with one line naming the file; the files are then closed quietly."""

    def __init__(self, run_dir: Path | None, config: Config):
        self.file = self.board = self.wandb = self.lock = None
        self.failed = False  # a write failed: closing reports nothing more
        self.path = None  # log.txt
        if run_dir is None:
            return
        try:
            self.open(run_dir, config)
        except BaseException:
            self.failed = True
            self.close()
            raise

    def open(self, run_dir: Path, config: Config):
        self.lock = lock_run_dir(run_dir)
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.path = run_dir / "logs" / "log.txt"
        self.file = open(self.path, "a", encoding="utf-8")
        self.board = EventFile(run_dir / "logs")
        if config.wandb:
            try:
                import wandb  # optional: only runs with wandb = true need it
            except ImportError:
                raise UserError("wandb = true, but the wandb package is not installed (pip install wandb)") from None
            self.wandb = wandb.init(project="bert", name=run_dir.name, dir=str(run_dir),
                                    config=config.to_dict(), resume="allow")

    def __call__(self, message: str):
        if self.file is None:
            return
        tqdm.write(message)
        with self.failing(), naming_a_full_disk(self.path):
            self.file.write(message + "\n")
            self.file.flush()

    def scalars(self, step: int, values: dict):
        values = {name: value for name, value in values.items() if value is not None}  # UNDEFINED: no point
        with self.failing():
            if self.board is not None:
                self.board.add_scalars(step, values)
            if self.wandb is not None:
                with naming_a_full_disk(self.path.parent.parent / "wandb"):
                    self.wandb.log(values, step=step)

    @contextmanager
    def failing(self):
        """Remembers that a write failed: its error is the one the user sees."""
        try:
            yield
        except BaseException:
            self.failed = True
            raise

    def close(self):
        """Closes what is open; closing twice is harmless. After a failed write, closing adds no error
        of its own (everything is closed all the same)."""
        file, board, wandb_run, lock = self.file, self.board, self.wandb, self.lock
        self.file = self.board = self.wandb = self.lock = None
        errors = []
        for close in (file and file.close, board and board.close, wandb_run and wandb_run.finish, lock and lock.close):
            try:
                if close:
                    close()
            except Exception as error:
                errors.append(error)
        if errors and not self.failed:
            raise errors[0]
