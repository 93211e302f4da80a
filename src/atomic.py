"""Writing a file so that readers see the old version or the new one, never half of one, and a
power loss after the rename does not leave an empty file under the new name."""
import os
import socket
from pathlib import Path
from urllib.parse import quote

from errors import UserError, naming_a_full_disk


def atomic_write(path: Path, write, before_rename=None):
    """Call write(temp) on a temp file in the same directory, flush it to disk, call before_rename()
    if given (the old file is still in place then), rename the temp file onto path, flush the
    directory."""
    temp = temp_path(path)
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


# A hostname never holds an "@" (this_host quotes one), so the last ".@" of a temp name starts its host.
TEMP_HOST_MARK = ".@"


def temp_path(target: Path, distinct: str = "") -> Path:
    """The temp file this process writes beside target before renaming it onto target:
    .NAME[DISTINCT].@HOST.PID.tmp, hidden so that `*` globs skip it, naming its host and process so
    that remove_stale_temps removes it once that process is gone, and only on that host (a
    directory shared by --part K/N on several machines holds other machines' temps)."""
    return target.with_name(f".{target.name}{distinct}{TEMP_HOST_MARK}{this_host()}.{os.getpid()}.tmp")


def this_host() -> str:
    """This machine's name as temp names carry it: dots and hyphens kept, anything that could break a
    file name or the name's parsing (a "/", an "@") %-quoted, so that two hosts never share one."""
    return quote(socket.gethostname(), safe="") or "unknown-host"


def temp_writer(name: str) -> tuple[str, int] | None:
    """(host, pid) of the process a temp file's name says is writing it; None for a name without both,
    the old form .NAME.PID.tmp among them."""
    if not name.endswith(".tmp"):
        return None
    _, mark, writer = name.removesuffix(".tmp").rpartition(TEMP_HOST_MARK)
    host, _, pid = writer.rpartition(".")
    return (host, int(pid)) if mark and host and pid.isdigit() else None


def remove_stale_temps(directory: Path):
    """Temp files of this host's processes that are gone: a kill between write and rename. Another
    host's are kept, whatever their pid says here: that machine may be writing them now. So are
    temps of the old form (.NAME.PID.tmp, no host): they cannot be told from another machine's
    still being written by an older version, and a leftover one costs disk space, not work."""
    here = this_host()
    for temp in directory.glob(".*.tmp"):
        writer = temp_writer(temp.name)
        if writer is not None and writer[0] == here and not process_alive(writer[1]):
            temp.unlink(missing_ok=True)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True
