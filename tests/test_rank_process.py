"""src/rank_process.py: a rank started by launch() tells the launcher how it ended, beside its error
file: a UserError's one line (exit code 2), any other error's traceback (exit code 1), or that it
finished; under torchrun (no error file) an error is raised as it is; and a backend's message about a
lost peer comes down to its first sentence. Whole --ddp runs: test_distributed.py, test_launcher.py."""
import os
import subprocess
import sys

import pytest

import rank_process
from test_distributed import ROOT, TIMEOUT

RUNS = {"finished": "pass", "a user error": "raise UserError('batch-size = 0: expected at least 1')",
        "a crash": "raise ValueError('a bug')"}


def rank(run: str, error_file) -> subprocess.CompletedProcess:
    """python -c: rank_main(run) in a process of its own (it dies with its parent, it exits), started as
    launch() starts one (with BERT_DDP_ERROR_FILE) or as torchrun does (error_file None)."""
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'src')!r}); import rank_process\n"
            f"from errors import UserError\n"
            f"def run():\n    {RUNS[run]}\n"
            f"rank_process.rank_main(run)\n")
    env = {name: value for name, value in os.environ.items()
           if name not in (rank_process.ERROR_FILE_VARIABLE, rank_process.LAUNCHER_VARIABLE)}
    if error_file is not None:
        env[rank_process.ERROR_FILE_VARIABLE] = str(error_file)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=TIMEOUT)


@pytest.mark.parametrize("run", RUNS)
def test_a_rank_of_launch_says_how_it_ended_beside_its_error_file(tmp_path, run):
    error_file = tmp_path / "rank1.txt"
    result = rank(run, error_file)
    written = sorted(path.name for path in tmp_path.iterdir())
    if run == "finished":
        assert result.returncode == 0 and written == ["rank1.finished"], (result, written)
        assert rank_process.finished_file(error_file) == tmp_path / "rank1.finished"
    elif run == "a user error":  # the launcher prints the line, once for all ranks
        assert result.returncode == 2 and written == ["rank1.txt"] and result.stderr == "", (result, written)
        assert error_file.read_text(encoding="utf-8") == "batch-size = 0: expected at least 1"
    else:  # a bug: its traceback kept in a file, the console left one line by the launcher
        assert result.returncode == 1 and written == ["rank1.traceback"] and result.stderr == "", (result, written)
        traceback = (tmp_path / "rank1.traceback").read_text(encoding="utf-8")
        assert traceback.startswith("Traceback") and traceback.endswith("ValueError: a bug\n")


def test_a_rank_under_torchrun_raises_its_error_for_the_agent_to_report(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = rank("a user error", None)
    assert result.returncode == 1 and not list(tmp_path.iterdir())
    assert result.stderr.splitlines()[-1] == "errors.UserError: batch-size = 0: expected at least 1", result.stderr


def test_a_lost_peers_message_comes_down_to_its_first_sentence():
    gloo = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                        "[127.0.0.1]:40321. The job may be lost\nat a second line")
    assert rank_process.first_line(gloo) == "Connection closed by peer [127.0.0.1]:40321"
    nccl = RuntimeError("NCCL communicator was aborted on rank 1. Original reason for failure was: timeout")
    assert rank_process.first_line(nccl) == "NCCL communicator was aborted on rank 1"
    assert not rank_process.lost_a_peer(gloo)  # no process group here: a process of its own has no peer to lose
