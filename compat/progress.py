"""Live progress of a run: configs done, ETA, and the pass rate per mode so far.

On a terminal it is a rich progress bar; elsewhere (CI logs, a redirected run) plain lines at most every
``interval`` seconds, so a 5,000-model log stays readable. The pass rate is over results that reached the
backend, as the report counts it, so the live number and the night's headline agree.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from compat.records import NOT_BACKEND_STATUSES


def _duration(s: float) -> str:
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{sec:02d}s" if m else f"{sec}s"


class RunProgress:
    """Counts records and finished configs; renders them as a bar or as plain lines."""

    def __init__(
        self,
        modes: Sequence[str],
        enabled: bool = True,
        stream: TextIO | None = None,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.modes = list(modes)
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.interval = interval
        self.clock = clock
        self.lock = threading.Lock()
        self.total = 0
        self.done = 0
        self.started = clock()
        self.passed = dict.fromkeys(self.modes, 0)
        self.reached = dict.fromkeys(self.modes, 0)
        self._last_line = float("-inf")
        self._bar: Any = None

    # ------------------------------------------------------------------------------------------ counting

    def planning(self, n_entries: int) -> None:
        """One line before planning, which reads every config (about 100 s for a 5,000 sample)."""
        if self.enabled and n_entries:
            print(f"compat: planning {n_entries} entries", file=self.stream, flush=True)

    def start(self, total_configs: int) -> None:
        """Planning is over: ``total_configs`` configs go to the workers now."""
        with self.lock:
            self.total, self.done, self.started = total_configs, 0, self.clock()
        if self.enabled and total_configs and getattr(self.stream, "isatty", lambda: False)():
            self._start_bar()

    def record(self, rec: dict[str, Any]) -> None:
        mode = rec.get("mode")
        with self.lock:
            if mode not in self.passed:
                self.modes.append(mode)
                self.passed[mode] = self.reached[mode] = 0
            if rec.get("status") not in NOT_BACKEND_STATUSES:
                self.reached[mode] += 1
                self.passed[mode] += rec.get("status") == "pass"
        self._refresh()

    def config_done(self) -> None:
        with self.lock:
            self.done += 1
        self._refresh(advance=1)

    # --------------------------------------------------------------------------------------- rendering

    def rates(self) -> str:
        """'eager 92% (11/12) · compiled –' : pass over reached, per mode."""
        parts = []
        for m in self.modes:
            n, p = self.reached[m], self.passed[m]
            parts.append(f"{m} {100 * p / n:.0f}% ({p}/{n})" if n else f"{m} –")
        return " · ".join(parts)

    def eta(self) -> float | None:
        if not self.done or self.done >= self.total:
            return None if self.done < self.total else 0.0
        return (self.clock() - self.started) / self.done * (self.total - self.done)

    def line(self) -> str:
        eta = self.eta()
        return (
            f"compat: {self.done}/{self.total} configs · {_duration(self.clock() - self.started)} elapsed · "
            f"ETA {_duration(eta) if eta is not None else '?'} · pass {self.rates()}"
        )

    def _start_bar(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._bar = Progress(
            TextColumn("[bold]compat[/bold]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("configs"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            TextColumn("pass {task.fields[rates]}"),
            console=Console(file=self.stream),
            transient=False,
        )
        self._task = self._bar.add_task("run", total=self.total, rates=self.rates())
        self._bar.start()

    def _refresh(self, advance: int = 0) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(self._task, advance=advance, rates=self.rates())
            return
        now = self.clock()
        if advance and self.total and (now - self._last_line >= self.interval or self.done >= self.total):
            self._last_line = now
            print(self.line(), file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
