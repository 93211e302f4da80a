"""Stopping a run cleanly: a signal or a file asks, the training loop finishes its step and saves."""
import signal
from pathlib import Path


class StopRequest:
    """SIGINT, SIGTERM or a file named `stop` in the working directory: finish the step, save, exit.

    A context manager: the handlers it installs are replaced by the previous ones on exit.
    """
    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.reason = None
        self.previous = {}

    def __enter__(self):
        for signum in self.SIGNALS:
            self.previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc_info):
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def _on_signal(self, signum, frame):
        self.reason = signal.Signals(signum).name

    def requested(self) -> bool:
        stop_file = Path("stop")
        if self.reason is None and stop_file.exists():
            stop_file.unlink(missing_ok=True)  # consumed, so the next run is not stopped too
            self.reason = "the file ./stop"
        return self.reason is not None
