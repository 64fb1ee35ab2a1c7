"""Spawning a tpu_dist job for a test: N processes of a worker script on 127.0.0.1, torchrun's env, free
ports, a bounded wall time (children are killed on timeout), every rank's output kept for the report."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

WORKERS = Path(__file__).parent / "workers"
REPO = Path(__file__).resolve().parents[2]


@dataclass
class RankResult:
    rank: int
    returncode: int | None
    output: str


def free_port_pair() -> int:
    """A port p with p and p + 1 both free (c10d's store on p, JAX's coordinator on p + 1)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port >= 65535:
            continue
        try:
            with socket.socket() as s2:
                s2.bind(("127.0.0.1", port + 1))
        except OSError:
            continue
        return port
    raise RuntimeError("no pair of free ports")


def child_env(
    rank: int, world_size: int, port: int, extra: dict | None = None, torchrun: bool = True
) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PYTEST_CURRENT_TEST")}
    env.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
        PYTHONUNBUFFERED="1",
        HF_TPU_DIST_INIT_TIMEOUT="60",
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    if torchrun:
        env.update(
            RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size)
        )
    else:
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            env.pop(k, None)
    env.update(extra or {})
    return env


def run_job(
    worker: str,
    world_size: int,
    args: tuple = (),
    timeout: float = 120.0,
    extra_env: dict | None = None,
    torchrun: bool = True,
    ranks: list[int] | None = None,
) -> list[RankResult]:
    """Start `ranks` (default: all) of a `world_size` job running workers/<worker>.py; wait at most
    `timeout` s for all of them, killing every child still running after it."""
    port = free_port_pair()
    procs = []
    for rank in ranks if ranks is not None else range(world_size):
        env = child_env(rank, world_size, port, extra_env, torchrun)
        cmd = [sys.executable, str(WORKERS / f"{worker}.py"), str(rank), str(world_size), *map(str, args)]
        procs.append(
            (
                rank,
                subprocess.Popen(
                    cmd,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    text=True,
                ),
            )
        )
    deadline = time.monotonic() + timeout
    results = []
    for rank, p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            out = (out or "") + f"\n[launcher] rank {rank} killed after {timeout} s"
        results.append(RankResult(rank, p.returncode, out or ""))
    return results


def report(results: list[RankResult]) -> str:
    return "\n".join(f"--- rank {r.rank} (exit {r.returncode}) ---\n{r.output[-6000:]}" for r in results)


def assert_ok(results: list[RankResult]) -> None:
    assert all(r.returncode == 0 for r in results), report(results)
