"""src/launcher.py: --ddp's launcher names the rank that failed (not one gloo aborted after it),
tolerates a rank that dies after the run finished, and shares the cores among the ranks. Whole
--ddp runs are in test_distributed.py."""
import os
import signal
import subprocess
import sys

import pytest

import rank_process
import launcher
from test_distributed import ROOT, TIMEOUT, free_port


class FinishedProcess:
    """A stand-in for a subprocess.Popen that has already exited with `code`."""

    def __init__(self, code: int):
        self.code = code

    def poll(self):
        return self.code

    def wait(self):
        return self.code

    def kill(self):
        raise AssertionError("a finished process is not killed")


def test_the_launcher_names_the_rank_that_died_not_the_one_gloo_aborted_after_it(tmp_path):
    aborted, killed = FinishedProcess(-signal.SIGABRT), FinishedProcess(-signal.SIGKILL)
    unfinished = [tmp_path / "rank0.finished", tmp_path / "rank1.finished"]
    assert launcher.wait_for_first_failure([aborted, killed], unfinished) == (1, -signal.SIGKILL)
    assert launcher.wait_for_first_failure([FinishedProcess(0), aborted], unfinished) == (1, -signal.SIGABRT)
    assert launcher.wait_for_first_failure([FinishedProcess(0), FinishedProcess(0)], unfinished) is None


def test_a_rank_that_dies_in_teardown_after_the_run_finished_fails_nothing(tmp_path, capsys):
    """rank_main marks a rank finished once every rank has passed the last barrier; a rank that
    then dies (gloo can abort one in torch.distributed's teardown) leaves a complete run: the
    launcher warns and waits for the others, and a rank that dies before its mark still fails."""
    error_file = tmp_path / "rank1.txt"
    rank = subprocess.Popen([sys.executable, "-c", f"import os, sys; sys.path.insert(0, {str(ROOT / 'src')!r}); "
                             "import rank_process; rank_process.rank_main(lambda: None); os.abort()"],
                            env={**os.environ, rank_process.ERROR_FILE_VARIABLE: str(error_file)})
    rank.wait(timeout=TIMEOUT)
    assert rank.returncode == -signal.SIGABRT
    finished = [tmp_path / "rank0.finished", rank_process.finished_file(error_file)]
    assert launcher.wait_for_first_failure([FinishedProcess(0), rank], finished) is None
    assert capsys.readouterr().err.count("warning: rank 1 was killed by SIGABRT after the run had finished") == 1
    assert launcher.wait_for_first_failure([rank, FinishedProcess(0)], finished) == (0, -signal.SIGABRT)


@pytest.mark.parametrize("cores, nproc, user_setting, expected", [
    (8, 4, None, "2"), (2, 2, None, "1"), (1, 2, None, "1"), (8, 4, "3", "3")])
def test_the_ranks_share_the_cores_unless_omp_num_threads_is_set(monkeypatch, tmp_path, cores, nproc, user_setting,
                                                                 expected):
    """Each rank's torch takes a thread per core: N ranks on the same cores get cores // N each."""
    environments = []

    class Started:
        pid = 0

        def __init__(self, command, env):
            environments.append(env)

    monkeypatch.setattr(launcher.subprocess, "Popen", Started)
    monkeypatch.setattr(launcher, "wait_for_first_failure", lambda processes, finished: None)
    monkeypatch.setattr(launcher, "available_cores", lambda: cores)
    if user_setting is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", user_setting)
    launcher.run_ranks([], nproc, "127.0.0.1", free_port(), tmp_path)
    assert [env["OMP_NUM_THREADS"] for env in environments] == [expected] * nproc
