"""Parent side of a worker process: timeouts, the memory cap, crash detection, recycling.

One ``WorkerHandle`` owns one spawned worker and reuses it across models. When the worker hangs past the
model's timeout, grows past the RSS cap, or dies, the handle kills what is left, writes ``timeout`` /
``oom`` / ``crash`` for the modes that did not report, and starts a fresh worker for the next model.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import psutil

from compat.interrupt import TaskInterrupted
from compat.records import Record

OnRecord = Callable[[dict[str, Any]], None]
POLL_S = 0.05
STARTUP_TIMEOUT_S = 300.0


@dataclass
class WorkerConfig:
    """How workers are started; shared by the local pool and Ray actors."""

    tier: str = "offline"
    device: str | None = None
    threads: int = 1
    mem_limit_mb: int = 4096
    log_dir: str | None = None
    preload: tuple[str, ...] = ("transformers",)
    env: dict[str, str] = field(default_factory=dict)
    recycle_after: int = 50  # tasks; bounds slow leaks across many models
    recycle_rss_fraction: float = 0.6  # idle RSS above this fraction of the cap -> fresh worker


class WorkerHandle:
    """A reusable worker process with a watchdog."""

    def __init__(self, config: WorkerConfig, slot: int = 0, stop: threading.Event | None = None) -> None:
        self.config = config
        self.slot = slot
        self.stop_event = stop  # set: kill the worker and raise TaskInterrupted (a clean Ctrl-C)
        self.proc: Any = None
        self.conn: Any = None
        self.tasks_done = 0
        self.starts = 0
        self.log_path: str | None = None

    # ---------------------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start ``python -m compat.worker`` (a fresh interpreter: no fork state, no __main__ re-import)."""
        parent_sock, child_sock = socket.socketpair()
        self.starts += 1
        log = subprocess.DEVNULL
        if self.config.log_dir:
            Path(self.config.log_dir).mkdir(parents=True, exist_ok=True)
            self.log_path = str(
                Path(self.config.log_dir) / f"worker-{self.slot}-{os.getpid()}-{self.starts}.log"
            )
            log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
        cfg = {
            "parent_pid": os.getpid(),
            "fd": child_sock.fileno(),
            "tier": self.config.tier,
            "device": self.config.device,
            "threads": self.config.threads,
            "preload": list(self.config.preload),
            "env": self.config.env,
        }
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "compat.worker", json.dumps(cfg)],
                pass_fds=(child_sock.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                close_fds=True,
            )
        finally:
            child_sock.close()
            if log is not subprocess.DEVNULL:
                log.close()
        self.conn = Connection(parent_sock.detach())
        self.tasks_done = 0
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            self._check_stop()
            if self.conn.poll(POLL_S):
                try:
                    kind, _ = self.conn.recv()
                except (EOFError, OSError):
                    break
                if kind == "ready":
                    return
            if not self.alive():
                break
        tail = self.log_tail()
        self.kill()
        raise RuntimeError(f"compat worker {self.slot} failed to start{': ' + tail if tail else ''}")

    def _check_stop(self) -> None:
        if self.stop_event is not None and self.stop_event.is_set():
            self.kill()
            raise TaskInterrupted(f"worker {self.slot} stopped")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.alive():
            with contextlib.suppress(Exception):
                self.conn.send(("stop", None))
            with contextlib.suppress(Exception):
                self.proc.wait(timeout=5)
        self.kill()

    def kill(self) -> None:
        """SIGKILL the worker and anything it started (compile workers), then reap it."""
        if self.proc is None:
            return
        with contextlib.suppress(Exception):
            parent = psutil.Process(self.proc.pid)
            for child in parent.children(recursive=True):
                with contextlib.suppress(Exception):
                    child.kill()
        with contextlib.suppress(Exception):
            if self.proc.poll() is None:
                self.proc.kill()
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=10)
        with contextlib.suppress(Exception):
            self.conn.close()
        self.proc = None
        self.conn = None

    def rss(self) -> int:
        """Resident memory of the worker and its children."""
        if self.proc is None:
            return 0
        try:
            p = psutil.Process(self.proc.pid)
            total = p.memory_info().rss
            for c in p.children(recursive=True):
                with contextlib.suppress(Exception):
                    total += c.memory_info().rss
            return total
        except psutil.Error:
            return 0

    def log_tail(self, lines: int = 15) -> str:
        if not self.log_path or not os.path.exists(self.log_path):
            return ""
        with contextlib.suppress(Exception), open(self.log_path, errors="replace") as f:
            return " | ".join(x.rstrip() for x in f.readlines()[-lines:] if x.strip())
        return ""

    # ---------------------------------------------------------------------------------------------- run

    def run(self, task: dict[str, Any], timeout_s: float, on_record: OnRecord) -> list[dict[str, Any]]:
        """Run one task; every mode gets exactly one record, whatever happens to the worker."""
        if not self.alive():
            self.start()
        try:
            self.conn.send(("task", task))
        except OSError:  # the idle worker died since its last task: start a fresh one
            self.kill()
            self.start()
            self.conn.send(("task", task))
        reported: dict[str, dict[str, Any]] = {}
        out: list[dict[str, Any]] = []

        def deliver(rec: dict[str, Any]) -> None:
            if rec["mode"] in reported:
                return
            reported[rec["mode"]] = rec
            out.append(rec)
            on_record(rec)

        phase: dict[str, Any] = {"phase": "start", "mode": None}
        cap = self.config.mem_limit_mb * 1024 * 1024
        deadline = time.monotonic() + timeout_s
        next_rss = 0.0
        failure: tuple[str, str] | None = None
        while True:
            self._check_stop()
            try:
                ready = self.conn.poll(POLL_S)
            except (EOFError, OSError):
                ready = False
            if ready:
                try:
                    kind, payload = self.conn.recv()
                except (EOFError, OSError):
                    kind, payload = "eof", {}
                if kind == "phase":
                    phase = payload
                    # a phase with its own bound (attribution's CPU re-run) adds it to the model's time
                    deadline += float(payload.get("extend_s") or 0)
                elif kind == "record":
                    deliver(payload)
                elif kind == "error":
                    failure = ("harness_error", f"worker task loop failed: {payload.get('error')}")
                elif kind == "done":
                    self.tasks_done += 1
                    if self.tasks_done >= self.config.recycle_after or (
                        payload.get("rss", 0) > self.config.recycle_rss_fraction * cap
                    ):
                        self.stop()
                    break
                if kind != "eof":
                    continue
            if not self.alive() or (ready and kind == "eof"):
                code = None
                with contextlib.suppress(Exception):
                    code = self.proc.wait(timeout=2)
                failure = ("crash", f"worker process died ({_describe_exit(code)}) during {_where(phase)}")
                tail = self.log_tail()
                if tail:
                    failure = (failure[0], failure[1] + f"; log tail: {tail}")
                self.kill()
                break
            now = time.monotonic()
            if now >= next_rss:
                next_rss = now + 0.1
                rss = self.rss()
                if rss > cap:
                    self.kill()
                    failure = (
                        "oom",
                        f"worker RSS {rss / 2**20:.0f} MiB exceeded the {self.config.mem_limit_mb} MiB cap "
                        f"during {_where(phase)}",
                    )
                    break
            if now > deadline:
                self.kill()
                failure = ("timeout", f"no result within {timeout_s:g}s (last phase: {_where(phase)})")
                break
        if failure is not None or len(reported) < len(task["modes"]):
            status, message = failure or ("harness_error", "worker finished without a record for this mode")
            for mode in task["modes"]:
                if mode not in reported:
                    fields = dict(task["base"])
                    rec = Record(
                        mode=mode,
                        device=task["device"],
                        status=status,
                        phase=phase.get("phase") if phase.get("mode") in (None, mode) else "queued",
                        error_class=status,
                        error=message,
                        **fields,
                    ).to_dict()
                    deliver(rec)
        return out


def _where(phase: dict[str, Any]) -> str:
    p = phase.get("phase", "?")
    return f"{phase['mode']}/{p}" if phase.get("mode") else str(p)


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "no exit code"
    if code < 0:
        name = f"signal {-code}"
        with contextlib.suppress(ValueError):
            name = f"signal {signal.Signals(-code).name}"
        if -code == signal.SIGKILL:
            name += ", not sent by the harness: likely the kernel OOM killer"
        return name
    return f"exit code {code}"
