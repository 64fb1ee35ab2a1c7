"""Ctrl-C (SIGINT) and SIGTERM stop a run cleanly instead of killing it mid-write.

The handler only sets an event (and says so on stderr with one ``write``): the executors see it, kill
their workers, and the runner closes the results file and raises ``RunInterrupted``; the CLI then prints
how to resume. Nothing is recorded for the models in flight, so ``--resume`` reruns exactly those. A second
Ctrl-C raises ``KeyboardInterrupt`` at once, for a stop that itself hangs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by a signal after flushing its results; ``remaining`` (model, mode) pairs are left."""

    def __init__(self, records: list[dict[str, Any]], remaining: int, results_path: str) -> None:
        super().__init__(f"run interrupted: {remaining} model/mode pairs left; resume to finish them")
        self.records = records
        self.remaining = remaining
        self.results_path = results_path


class TaskInterrupted(Exception):
    """Raised inside an executor when the stop event cut a task short (its models stay unrecorded)."""


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[threading.Event]:
    """Set ``stop`` on SIGINT/SIGTERM for the duration (main thread only; elsewhere a no-op).

    Installed whatever the inherited disposition: a run started in the background by a shell inherits
    SIGINT ignored, which is how Ctrl-C/``kill -INT`` used to do nothing at all.
    """
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        name = signal.Signals(signum).name
        with contextlib.suppress(OSError):
            os.write(
                2, f"\ncompat: {name}: stopping workers and flushing results (again to abort)\n".encode()
            )

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield stop
    finally:
        for s, h in previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
