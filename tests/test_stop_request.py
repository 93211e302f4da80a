"""trainer.StopRequest: SIGINT, SIGTERM or a file named stop ask for a stop; the file is used up,
and the signal handlers before it are back once it ends."""
import signal
from pathlib import Path

import pytest

from trainer import StopRequest
from test_trainer import run_to


@pytest.mark.parametrize("signum, reason", [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "SIGINT")])
def test_a_signal_asks_for_a_stop_instead_of_ending_the_process(tmp_path, monkeypatch, keep_signal_handlers,
                                                                signum, reason):
    monkeypatch.chdir(tmp_path)
    with StopRequest() as stop:
        assert not stop.requested() and stop.reason is None
        signal.raise_signal(signum)
        assert stop.requested() and stop.reason == reason


def test_a_stop_file_asks_once_and_is_used_up(tmp_path, monkeypatch, keep_signal_handlers):
    monkeypatch.chdir(tmp_path)
    Path("stop").touch()
    with StopRequest() as stop:
        assert stop.requested() and stop.reason == "the file ./stop"
    assert not Path("stop").exists()
    with StopRequest() as next_run:
        assert not next_run.requested()


def test_the_previous_handlers_are_back_afterwards(keep_signal_handlers):
    def mine(signum, frame):
        pass
    signal.signal(signal.SIGTERM, mine)
    before = signal.getsignal(signal.SIGINT)
    with StopRequest():
        assert signal.getsignal(signal.SIGTERM) is not mine
    assert signal.getsignal(signal.SIGTERM) is mine and signal.getsignal(signal.SIGINT) is before


def test_fit_gives_back_the_previous_signal_handlers(mlm_workdir, skip_flops_measurement):
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    run_to(1)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
