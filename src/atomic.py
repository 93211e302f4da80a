"""Writing a file so that readers see the old version or the new one, never half of one."""
import os
from pathlib import Path


def atomic_write(path: Path, write):
    """Call write(temp) on a temp file in the same directory, then rename it onto path."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(temp)
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)
