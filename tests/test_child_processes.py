"""src/child_processes.py: a child dies with the process that started it: by the kernel's
parent-death signal when that process is killed (kill -9), at once where it had ended before the
child asked, and by a watching thread where there is no such signal. Whole --ddp ranks dying with
their launcher: test_distributed.py."""
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_distributed import ROOT, TIMEOUT, process_state

IMPORT = f"import os, sys, time; sys.path.insert(0, {str(ROOT / 'src')!r}); import child_processes\n"


def wait_until_gone(pid: int, what: str):
    """Within 10 seconds the process has ended (gone, or a zombie); else it is killed and the test fails."""
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and "Z" not in process_state(pid):
        if time.monotonic() > deadline:
            subprocess.run(["kill", "-KILL", str(pid)])
            raise AssertionError(what)
        time.sleep(0.1)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's parent-death signal is Linux's")
def test_a_child_dies_with_its_parent_killed_by_sigkill():
    child = IMPORT + "child_processes.die_with_parent(os.getppid()); print('asked', flush=True); time.sleep(60)"
    starter = (f"import subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', {child!r}], "
               "stdout=subprocess.PIPE, text=True); child.stdout.readline(); print(child.pid, flush=True); "
               "time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", starter], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(parent.stdout.readline())
    finally:
        parent.kill()  # kill -9: no handler of its own runs
        parent.wait(timeout=TIMEOUT)
        parent.stdout.close()
    wait_until_gone(pid, "the child outlived its parent")


def test_a_child_whose_parent_ended_before_it_asked_ends_at_once():
    """The parent gives its id, then ends before the child calls die_with_parent: nothing would send the
    signal any more, so the child ends itself and never goes on (it would print)."""
    child = IMPORT + ("parent, deadline = int(sys.argv[1]), time.monotonic() + 10\n"
                      "while os.getppid() == parent and time.monotonic() < deadline:\n"
                      "    time.sleep(0.01)\n"
                      "child_processes.die_with_parent(parent)\n"
                      "print('went on', flush=True)\n")
    starter = f"import os, subprocess, sys; subprocess.Popen([sys.executable, '-c', {child!r}, str(os.getpid())])"
    # The child writes to the starter's stdout: the output ends when the child has ended too.
    result = subprocess.run([sys.executable, "-c", starter], capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0 and result.stdout == "" and result.stderr == "", result


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="looks the process up in /proc")
def test_where_there_is_no_parent_death_signal_a_watching_thread_ends_the_rank():
    watcher = (f"import os, sys; sys.path.insert(0, {str(ROOT / 'src')!r}); import child_processes; "
               "parent = os.getppid(); print('watching', flush=True); child_processes.watch_parent(parent, 0.05)")
    starter = (f"import subprocess, sys; watcher = subprocess.Popen([sys.executable, '-c', {watcher!r}], "
               "stdout=subprocess.PIPE, text=True); watcher.stdout.readline(); print(watcher.pid)")
    pid = int(subprocess.run([sys.executable, "-c", starter], capture_output=True, text=True, timeout=TIMEOUT).stdout)
    deadline = time.monotonic() + 10  # its parent has ended
    while Path(f"/proc/{pid}").exists() and "Z" not in process_state(pid):
        if time.monotonic() > deadline:
            subprocess.run(["kill", "-KILL", str(pid)])
            raise AssertionError("the watcher outlived its parent")
        time.sleep(0.1)
