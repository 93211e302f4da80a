"""A run's directory and what is written there as it trains: runs/runN, log.txt, the console
above the progress bar, TensorBoard scalars and optionally Weights & Biases."""
import fcntl
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from config import Config
from errors import UserError


def create_run_dir(runs_dir: Path, run_id: str = "") -> Path:
    """runs/RUN-ID, which must not exist yet, or runs/runN for the next free N; mkdir is the
    lock, so two runs never share one."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    if run_id:
        run_dir = runs_dir / run_id
        try:
            run_dir.mkdir()
        except FileExistsError:
            raise UserError(f"run-id = {run_id}: {run_dir} exists; resume it with --cp "
                            f"{run_dir / 'checkpoints' / 'checkpoint.pt'}, or choose another run-id") from None
        return run_dir
    number = 0
    while True:
        run_dir = runs_dir / f"run{number}"
        try:
            run_dir.mkdir()
            return run_dir
        except FileExistsError:
            number += 1


def lock_run_dir(run_dir: Path):
    """An OS lock on the run directory while a process trains in it (released when the process
    ends, however it ends): a second process resuming the same run is refused."""
    handle = (run_dir / ".lock").open("a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise UserError(f"{run_dir}: another process is training this run (it holds {run_dir / '.lock'}); "
                        f"wait for it to end, or stop it") from None
    return handle


class RunLog:
    """Messages and scalars of one run, under the run directory's lock; silent off rank 0 (run_dir None)."""

    def __init__(self, run_dir: Path | None, config: Config):
        self.file = self.board = self.wandb = self.lock = None
        if run_dir is None:
            return
        self.lock = lock_run_dir(run_dir)
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.file = (run_dir / "logs" / "log.txt").open("a", encoding="utf-8")
        self.board = SummaryWriter(str(run_dir / "logs"))
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
        self.file.write(message + "\n")
        self.file.flush()

    def scalars(self, step: int, values: dict):
        if self.board is not None:
            for name, value in values.items():
                self.board.add_scalar(name, value, step)
        if self.wandb is not None:
            self.wandb.log(values, step=step)

    def close(self):
        """Closes what is open; closing twice is harmless."""
        if self.board is not None:
            self.board.close()
            self.file.close()
        if self.wandb is not None:
            self.wandb.finish()
        if self.lock is not None:
            self.lock.close()
        self.file = self.board = self.wandb = self.lock = None
