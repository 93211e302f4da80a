"""A rank's process in a run of several (started by --ddp's launcher.py or by torchrun): it dies with
what started it, and reports its errors and its completion to launcher.py. Imported where a process
is a rank, so a run in one process never reads it.
"""
import os
import sys
import traceback
from pathlib import Path

import torch.distributed as dist

from child_processes import die_with_parent
from distributed import leave
from errors import UserError
from launcher import ERROR_FILE_VARIABLE, LAUNCHER_VARIABLE, finished_file


def rank_main(run):
    """Call run() in a rank, which dies with what started it (launch(), or torchrun's agent on this
    machine): a UserError goes to the launcher's error file (printed there once) when launch()
    started us, else it is raised; the process group is left either way."""
    die_with_parent(int(os.environ.get(LAUNCHER_VARIABLE, os.getppid())))
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
