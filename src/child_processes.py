"""Processes this program starts die with the process that started them, however it ends (kill -9
too): --ddp's ranks, the tokenizing workers, glue.py's training runs. Torch-free, as the tokenizing
workers are."""
import ctypes
import os
import signal
import threading
import time

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int):
    """Called in a child: it is killed when `parent` (its parent process's id, read in the parent)
    ends, so nothing this program started runs on, writes files or holds pipes with nobody to
    control it. Linux: the kernel's parent-death signal, which comes when the thread that started
    the child ends, so children are started from the main thread; elsewhere (macOS) a thread that
    watches the parent. A parent that died before the signal was asked for ends the child at once."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
            raise OSError(ctypes.get_errno(), "prctl")
    except (OSError, AttributeError):  # no prctl here
        threading.Thread(target=watch_parent, args=(parent,), daemon=True, name="watch parent").start()
    if os.getppid() != parent:  # it died before the signal was asked for
        os.kill(os.getpid(), signal.SIGKILL)


def watch_parent(parent: int, interval: float = 0.5):
    while os.getppid() == parent:
        time.sleep(interval)
    os.kill(os.getpid(), signal.SIGKILL)
