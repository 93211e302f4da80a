"""src/atomic.py: a file is replaced whole or not at all, and the temp files of killed processes
are cleaned up while a live process's are kept."""
import errno
import os
import subprocess
import sys

import pytest

from atomic import atomic_write, process_alive, remove_stale_temps
from errors import UserError


def test_a_write_replaces_the_file_whole_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("old")
    seen_before_rename = []
    atomic_write(path, lambda temp: temp.write_text("new"), before_rename=lambda: seen_before_rename.append(
        path.read_text()))
    assert path.read_text() == "new" and seen_before_rename == ["old"]
    assert sorted(each.name for each in tmp_path.iterdir()) == ["notes.txt"]


def test_a_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("old")

    def half_then_fail(temp):
        temp.write_text("ne")
        raise RuntimeError("killed while writing")
    with pytest.raises(RuntimeError):
        atomic_write(path, half_then_fail)
    assert path.read_text() == "old" and sorted(each.name for each in tmp_path.iterdir()) == ["notes.txt"]


def test_a_full_disk_names_the_file_and_keeps_the_old_one(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("old")

    def full_disk(temp):
        temp.write_text("n")
        raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(UserError, match=f"^no space left on device writing {path}$"):
        atomic_write(path, full_disk)
    assert path.read_text() == "old" and len(list(tmp_path.iterdir())) == 1


def test_temp_files_of_dead_processes_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".checkpoint.pt.{dead.stdout.strip()}.tmp"
    ours = tmp_path / f".checkpoint.pt.{os.getpid()}.tmp"
    stale.write_bytes(b"half"), ours.write_bytes(b"being written")
    remove_stale_temps(tmp_path)
    assert not stale.exists() and ours.exists()


def test_a_process_is_alive_until_it_has_ended():
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    assert process_alive(os.getpid()) and process_alive(child.pid)
    child.communicate(b"")
    assert not process_alive(child.pid)
