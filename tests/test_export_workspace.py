"""export_hf.py's hidden workspace beside the output: SIGTERM in the middle of an export leaves nothing,
as Ctrl-C does; a workspace a killed export left (kill -9) the next export to the same place removes,
and never a running export's (its process alive, or its lock held: an export on another machine)."""
import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import export_hf
from conftest import one_error_line
from test_onnx_export import LAYOUTS, random_checkpoint

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "export_hf.py"


@pytest.fixture
def checkpoint(vocab, tmp_path) -> Path:
    return random_checkpoint(tmp_path / "model.pt", vocab, "sst2", LAYOUTS["bert"])


def workspaces(out_dir: Path) -> list[Path]:
    return [entry for entry in out_dir.parent.iterdir() if entry.name.startswith(f".{out_dir.name}.")]


def export_under_way(checkpoint: Path, out_dir: Path) -> subprocess.Popen:
    """export_hf.py --onnx, returned once its workspace holds onnx/: the graph is being exported."""
    process = subprocess.Popen([sys.executable, str(SCRIPT), "--cp", str(checkpoint), "-o", str(out_dir), "--onnx"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any((entry / "onnx").is_dir() for entry in workspaces(out_dir)):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the export never reached its graph"
        time.sleep(0.02)
    return process


def dead_pid() -> int:
    """The id of a process that has ended."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_sigterm_in_the_middle_of_an_export_leaves_nothing(checkpoint, tmp_path):
    process = export_under_way(checkpoint, tmp_path / "hf")
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130 and stderr.splitlines()[-1] == "interrupted"
    assert [path.name for path in tmp_path.iterdir()] == ["model.pt"]


def test_a_workspace_kill_9_left_is_removed_by_the_next_export_to_that_place(checkpoint, tmp_path):
    process = export_under_way(checkpoint, tmp_path / "hf")
    process.kill()
    process.wait()
    [left] = workspaces(tmp_path / "hf")
    assert left.name.startswith(f".hf.{process.pid}.")
    export_hf.export(checkpoint, tmp_path / "hf")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["hf", "model.pt"]


def plant(parent: Path, name: str) -> Path:
    (parent / name / "onnx").mkdir(parents=True)
    (parent / name / "model.safetensors").write_bytes(b"half written")
    return parent / name


def test_only_workspaces_of_ended_exports_are_removed(checkpoint, tmp_path):
    ended = plant(tmp_path, f".hf.{dead_pid()}.abc_1234")
    ended_aside = plant(tmp_path, f".hf.old.{dead_pid()}.abc_1234")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        running = plant(tmp_path, f".hf.{live.pid}.abc_1234")
        elsewhere = plant(tmp_path, f".hf.{dead_pid()}.xyz_9876")  # its process on another machine: its lock held
        unnamed = plant(tmp_path, ".hf.abcdefgh")  # an earlier version's, of no process we can tell
        other = plant(tmp_path, f".hf2.{dead_pid()}.abc_1234")  # beside another output
        lock = os.open(elsewhere, os.O_RDONLY)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            export_hf.export(checkpoint, tmp_path / "hf")
        finally:
            os.close(lock)
    finally:
        live.kill()
        live.wait()
    assert not ended.exists() and not ended_aside.exists()
    assert all(path.is_dir() for path in (running, elsewhere, unnamed, other))
    assert (tmp_path / "hf" / "config.json").is_file()


def test_an_earlier_export_a_killed_swap_held_aside_goes_back_into_place(checkpoint, tmp_path, capsys):
    export_hf.export(checkpoint, tmp_path / "hf")
    earlier = sorted(path.name for path in (tmp_path / "hf").iterdir())
    aside = tmp_path / f".hf.old.{dead_pid()}.abc_1234"
    aside.mkdir()
    (tmp_path / "hf").rename(aside / "hf")  # killed between moving it aside and putting the new one in place
    plant(tmp_path, f".hf.{dead_pid()}.abc_1234")  # the new one, never put in place
    line = one_error_line(capsys, lambda: export_hf.main(["--cp", str(checkpoint), "-o", str(tmp_path / "hf")]))
    assert line == f"error: {tmp_path / 'hf'}: exists and is not empty; add --force to replace it"
    assert sorted(path.name for path in (tmp_path / "hf").iterdir()) == earlier
    assert sorted(path.name for path in tmp_path.iterdir()) == ["hf", "model.pt"]
