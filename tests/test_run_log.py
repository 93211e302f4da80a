"""The run directory and its writers: a full disk while training (log.txt, TensorBoard) is one line
naming the file, at once, and leaves the last checkpoint intact; a run-id that exists is explained."""
import errno
import io
import os
from pathlib import Path

import pytest
import torch

import main
import hardware
import run_log
from tasks.mlm_task import MaskedLMTask


def test_an_undefined_metric_is_said_so_in_words_never_as_a_number():
    assert run_log.metric_text(None) == "undefined (constant predictions or labels)"
    assert run_log.metric_text(0.123456) == "0.1235" and run_log.metric_text(60) == "60"


class FillingFile(io.FileIO):
    """A file of run_log's on a disk that is full once `full` is set (for the files `names` start)."""
    full = False
    names = ("log.txt", "events.")

    def write(self, data):
        if FillingFile.full and Path(self.name).name.startswith(FillingFile.names):
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(data)


def filling_open(path, mode="r", encoding=None):
    buffered = io.BufferedWriter(FillingFile(path, mode.replace("b", "")))
    return buffered if "b" in mode else io.TextIOWrapper(buffered, encoding=encoding)


@pytest.fixture
def full_disk(monkeypatch):
    """Training files opened through run_log fill the disk when told: full_disk(names) from then on."""
    monkeypatch.setattr(hardware, "measure_matmul_flops", lambda device, dtype: 1e12)
    monkeypatch.setattr(run_log, "open", filling_open, raising=False)
    monkeypatch.setattr(FillingFile, "full", False)

    def fill(names):
        monkeypatch.setattr(FillingFile, "names", names)
        monkeypatch.setattr(FillingFile, "full", True)
    return fill


def error_lines(capsys) -> list[str]:
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Exception in thread" not in err, err
    return [line for line in err.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("names, filled", [(("log.txt",), "logs/log.txt"), (("events.",), "logs/events.out")])
def test_a_disk_that_fills_while_training_stops_at_once_naming_the_file(mlm_workdir, monkeypatch, capsys, full_disk,
                                                                         names, filled):
    original, steps = MaskedLMTask.loss, []

    def loss_then_full(self, model, batch, progress=None):
        if torch.is_grad_enabled():
            steps.append(1)
            if len(steps) == 7:
                full_disk(names)  # the log line and scalars of step 7 find the disk full
        return original(self, model, batch, progress)
    monkeypatch.setattr(MaskedLMTask, "loss", loss_then_full)
    with pytest.raises(SystemExit) as exit_info:
        main.main(["--val-interval", "5"])
    assert exit_info.value.code == 2
    lines = error_lines(capsys)
    run_dir = mlm_workdir / "runs" / "run0"
    assert len(lines) == 1 and lines[0].startswith(f"error: no space left on device writing {run_dir / filled}"), lines
    assert len(steps) == 7  # at once, not some steps later
    assert torch.load(run_dir / "checkpoints" / "checkpoint.pt", weights_only=True)["step"] == 5


def test_a_disk_full_at_the_start_is_one_line_and_leaves_no_run(mlm_workdir, capsys, full_disk):
    full_disk(("log.txt", "events."))
    with pytest.raises(SystemExit) as exit_info:
        main.main([])
    assert exit_info.value.code == 2
    lines = error_lines(capsys)
    assert len(lines) == 1 and lines[0].startswith("error: no space left on device writing "), lines
    assert not any((mlm_workdir / "runs").iterdir())


def test_a_run_id_whose_run_saved_no_checkpoint_is_not_offered_for_resuming(tmp_path):
    (tmp_path / "runs" / "first-try" / "logs").mkdir(parents=True)  # killed before its first checkpoint
    with pytest.raises(run_log.UserError) as error:
        run_log.create_run_dir(tmp_path / "runs", "first-try")
    assert str(error.value) == (f"run-id = first-try: {tmp_path / 'runs' / 'first-try'} exists but holds no "
                                "checkpoint to resume; remove it, or choose another run-id")


def test_a_run_id_another_process_is_training_in_is_named_as_such(tmp_path):
    """Two runs started at once with one run-id: the second is not told to remove the first's directory."""
    run_dir = tmp_path / "runs" / "busy"
    run_dir.mkdir(parents=True)
    lock = run_log.lock_run_dir(run_dir)  # another open file: flock refuses it as it would another process
    with pytest.raises(run_log.UserError, match=f"^run-id = busy: another process is training in {run_dir}; wait"):
        run_log.create_run_dir(tmp_path / "runs", "busy")
    lock.close()
    with pytest.raises(run_log.UserError, match="exists but holds no checkpoint to resume; remove it"):
        run_log.create_run_dir(tmp_path / "runs", "busy")


def test_runs_on_a_read_only_place_is_one_line(mlm_workdir, make_read_only, capsys):
    (mlm_workdir / "runs").mkdir()
    make_read_only(mlm_workdir / "runs")
    with pytest.raises(SystemExit) as exit_info:
        main.main([])
    assert exit_info.value.code == 2
    assert error_lines(capsys) == [f"error: {mlm_workdir / 'runs' / 'run0'}: read-only file system"
                                   if os.geteuid() == 0 else
                                   f"error: {mlm_workdir / 'runs' / 'run0'}: permission denied"]


def test_a_resume_whose_run_directory_is_read_only_is_one_line(mlm_trained_run, make_read_only, capsys, monkeypatch):
    monkeypatch.chdir(mlm_trained_run)
    make_read_only(mlm_trained_run / "runs" / "run0")
    with pytest.raises(SystemExit) as exit_info:
        main.main(["--cp", "runs/run0/checkpoints/checkpoint.pt", "--max-iters", "45", "--lr-decay-iters", "45"])
    assert exit_info.value.code == 2
    [line] = error_lines(capsys)
    assert line.startswith(f"error: {mlm_trained_run / 'runs' / 'run0'}") and line.endswith(
        ("read-only file system", "permission denied"))


def flock_answering(code: int):
    """fcntl.flock as on a file system without locks (some network mounts): every call fails with `code`."""
    def flock(handle, operation):
        raise OSError(code, os.strerror(code))
    return flock


@pytest.mark.parametrize("code", [errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP])
def test_a_file_system_without_locks_goes_on_with_one_warning_naming_the_directory(tmp_path, monkeypatch, capsys,
                                                                                     code):
    run_dir = tmp_path / "runs" / "run0"
    run_dir.mkdir(parents=True)
    monkeypatch.setattr(run_log.fcntl, "flock", flock_answering(code))
    assert not run_log.held_by_another_process(run_dir)  # it cannot tell: a resume is offered
    lock = run_log.lock_run_dir(run_dir)
    assert not lock.closed
    lock.close()
    out, err = capsys.readouterr()
    assert "Traceback" not in err and not out
    assert err.splitlines() == [f"warning: {run_dir}: its file system has no file locks ({os.strerror(code)}); "
                                f"going on unlocked, so a second process started there is not refused"]


def test_a_run_on_a_file_system_without_locks_trains_and_warns_once(mlm_workdir, monkeypatch, capsys):
    monkeypatch.setattr(hardware, "measure_matmul_flops", lambda device, dtype: 1e12)
    monkeypatch.setattr(run_log.fcntl, "flock", flock_answering(errno.ENOLCK))
    main.main(["--max-iters", "5"])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    run_dir = mlm_workdir / "runs" / "run0"
    assert [line for line in err.splitlines() if line.startswith("warning:")] == [
        f"warning: {run_dir}: its file system has no file locks ({os.strerror(errno.ENOLCK)}); going on unlocked, "
        f"so a second process started there is not refused"]
    assert (run_dir / "checkpoints" / "checkpoint.pt").is_file()


def test_a_lock_that_fails_for_another_reason_is_not_passed_over(tmp_path, monkeypatch):
    monkeypatch.setattr(run_log.fcntl, "flock", flock_answering(errno.EIO))
    with pytest.raises(OSError) as error:
        run_log.lock_run_dir(tmp_path)
    assert error.value.errno == errno.EIO
    (tmp_path / ".lock").touch()
    with pytest.raises(OSError):
        run_log.held_by_another_process(tmp_path)
