"""src/atomic.py: a file is replaced whole or not at all, and the temp files of killed processes
are cleaned up while a live process's are kept."""
import errno
import os
import subprocess
import sys

import pytest

import atomic
from atomic import atomic_write, process_alive, remove_stale_temps, temp_path
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


def dead_pid() -> int:
    """The id of a process that has ended."""
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)


def temp_of(directory, name: str, host: str, pid: int):
    """A temp file as process `pid` on `host` names it (built the way temp_path builds ours)."""
    temp = directory / temp_path(directory / name).name.replace(
        f"{atomic.TEMP_HOST_MARK}{atomic.this_host()}.{os.getpid()}.", f"{atomic.TEMP_HOST_MARK}{host}.{pid}.")
    temp.write_bytes(b"half")
    return temp


def test_temp_files_of_this_hosts_dead_processes_are_removed_and_no_others(tmp_path):
    here, dead = atomic.this_host(), dead_pid()
    stale = temp_of(tmp_path, "checkpoint.pt", here, dead)
    ours = temp_of(tmp_path, "checkpoint.pt", here, os.getpid())
    elsewhere = [temp_of(tmp_path, "checkpoint.pt", host, dead)  # a --part on another machine, same directory
                 for host in ("other-machine", f"gpu.{here}", f"{here}.example.com", "node7.cluster.example.org")]
    old_form = tmp_path / f".checkpoint.pt.{dead}.tmp"  # no host: whose it is cannot be told
    old_form.write_bytes(b"half")
    remove_stale_temps(tmp_path)
    assert not stale.exists() and ours.exists() and old_form.exists() and all(each.exists() for each in elsewhere)


def test_a_temp_name_says_its_host_and_process_however_many_dots_they_hold(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic.socket, "gethostname", lambda: "node7.cluster.example.org")
    temp = temp_path(tmp_path / "shard.v2.msgpack.gz", ".0123.body")
    assert temp.parent == tmp_path and temp.name.startswith(".shard.v2.msgpack.gz.0123.body")
    assert atomic.temp_writer(temp.name) == ("node7.cluster.example.org", os.getpid())
    monkeypatch.setattr(atomic.socket, "gethostname", lambda: "odd/name@host")  # never a path or a second mark
    assert atomic.temp_writer(temp_path(tmp_path / "x").name) == (atomic.this_host(), os.getpid())
    assert "/" not in atomic.this_host() and "@" not in atomic.this_host()
    assert atomic.temp_writer(".checkpoint.pt.123.tmp") is None


def test_every_temp_name_of_ours_is_one_remove_stale_temps_can_judge(tmp_path):
    """Whatever writes a temp file beside its target names it through temp_path."""
    from packed_files import HeaderFirstFile
    writer = HeaderFirstFile(tmp_path / "data.msgpack.gz")
    seen = []
    atomic_write(tmp_path / "notes.txt", lambda temp: seen.append(temp.name) or temp.write_text("new"))
    for name in (writer.body_path.name, *seen):
        assert atomic.temp_writer(name) == (atomic.this_host(), os.getpid()), name
    writer.abort()


def test_a_process_is_alive_until_it_has_ended():
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    assert process_alive(os.getpid()) and process_alive(child.pid)
    child.communicate(b"")
    assert not process_alive(child.pid)
