"""Writing a file so that readers see the old version or the new one, never half of one, and a
power loss after the rename does not leave an empty file under the new name."""
import os
from pathlib import Path

from errors import UserError, naming_a_full_disk


def atomic_write(path: Path, write, before_rename=None):
    """Call write(temp) on a temp file in the same directory, flush it to disk, call before_rename()
    if given (the old file is still in place then), rename the temp file onto path, flush the
    directory."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with naming_a_full_disk(path):
            write(temp)
            with open(temp, "rb+") as written:
                os.fsync(written.fileno())
        if before_rename is not None:
            before_rename()
        os.replace(temp, path)
        sync_directory(path.parent)
    finally:
        temp.unlink(missing_ok=True)


def check_output_file(path: Path, what: str):
    """Refuse -o naming a directory or a file in a missing folder in one line, before the slow part
    rather than at the rename after it."""
    if path.is_dir():
        raise UserError(f"-o {path}: a directory; -o takes the {what} to write")
    if not path.parent.is_dir():
        raise UserError(f"-o {path}: the folder {path.parent} does not exist")


def sync_directory(directory: Path):
    """Make a rename in the directory durable (POSIX; a no-op where directories cannot be opened)."""
    try:
        handle = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


def remove_stale_temps(directory: Path):
    """Temp files (.NAME.PID.tmp) of processes that are gone: a kill between write and rename."""
    for temp in directory.glob(".*.tmp"):
        pid = temp.name.rsplit(".", 2)[-2]
        if pid.isdigit() and not process_alive(int(pid)):
            temp.unlink(missing_ok=True)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True
