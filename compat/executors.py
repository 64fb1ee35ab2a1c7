"""Where tasks run: a local pool of worker processes (default) or a Ray cluster; plus sharding for CI.

Both executors run each task through the same ``WorkerHandle`` (timeout, memory cap, crash recycling), so
a model gets the same statuses whether it ran on this machine or on a Ray node.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from compat.interrupt import TaskInterrupted
from compat.records import Record
from compat.supervise import OnRecord, WorkerConfig, WorkerHandle

OnTaskDone = Callable[[dict[str, Any]], None]


def parse_shard(spec: str | tuple[int, int] | None) -> tuple[int, int] | None:
    """``"i/N"`` (0 <= i < N) or a tuple -> (i, N); a clear ValueError otherwise."""
    if spec is None or spec == "":
        return None
    if isinstance(spec, str):
        try:
            i_s, n_s = spec.split("/")
            spec = (int(i_s), int(n_s))
        except ValueError:
            raise ValueError(f"shard {spec!r}: expected 'i/N' with integers, e.g. '0/4'") from None
    i, n = spec
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"shard {i}/{n}: need N >= 1 and 0 <= i < N")
    return i, n


def shard_of(model_id: str, n: int) -> int:
    """Stable across machines and Python runs (not ``hash()``, which is salted per process)."""
    return int(hashlib.sha256(model_id.encode()).hexdigest()[:16], 16) % n


def select_shard(
    entries: Sequence[dict[str, Any]], shard: tuple[int, int] | str | None
) -> list[dict[str, Any]]:
    """The entries whose id hashes into shard i of N (all entries when shard is None)."""
    spec = parse_shard(shard)
    if spec is None:
        return list(entries)
    i, n = spec
    return [e for e in entries if shard_of(str(e.get("id")), n) == i]


def failure_records(task: dict[str, Any], status: str, message: str) -> list[dict[str, Any]]:
    """Records for a task the executor itself could not run (worker would not start, actor lost)."""
    return [
        Record(
            mode=m, device=task["device"], status=status, phase="executor", error=message, **task["base"]
        ).to_dict()
        for m in task["modes"]
    ]


class LocalExecutor:
    """``jobs`` worker processes on this machine, each fed by a thread from a shared queue."""

    def __init__(self, jobs: int, config: WorkerConfig, timeout_s: float) -> None:
        if jobs < 1:
            raise ValueError(f"jobs must be >= 1, got {jobs}")
        self.jobs, self.config, self.timeout_s = jobs, config, timeout_s
        self._handles: list[WorkerHandle] = []

    def run(
        self,
        tasks: list[dict[str, Any]],
        on_record: OnRecord,
        on_task_done: OnTaskDone,
        stop: threading.Event | None = None,
    ) -> None:
        """Run every task; when ``stop`` is set, kill the workers and return with the rest unrun."""
        stop = stop or threading.Event()
        q: queue.Queue[dict[str, Any]] = queue.Queue()
        for t in tasks:
            q.put(t)
        errors: list[BaseException] = []

        def slot(i: int) -> None:
            handle = WorkerHandle(self.config, slot=i, stop=stop)
            self._handles.append(handle)
            try:
                while not stop.is_set():
                    try:
                        task = q.get_nowait()
                    except queue.Empty:
                        return
                    try:
                        handle.run(task, self.timeout_s, on_record)
                    except TaskInterrupted:
                        return  # the task's unreported modes stay unrecorded: --resume reruns them
                    except Exception as exc:  # e.g. the worker could not start: record it, go on
                        for rec in failure_records(task, "harness_error", f"{type(exc).__name__}: {exc}"):
                            on_record(rec)
                        handle.kill()
                    on_task_done(task)
            except BaseException as exc:  # pragma: no cover - surfaced to the caller below
                errors.append(exc)
            finally:
                handle.stop()

        threads = [
            threading.Thread(target=slot, args=(i,), daemon=True, name=f"compat-slot-{i}")
            for i in range(min(self.jobs, max(1, len(tasks))))
        ]
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(timeout=0.5)
        except BaseException:
            for h in self._handles:
                h.kill()
            raise
        if errors:
            raise errors[0]


class _RayWorker:
    """A Ray actor owning one reusable worker process (the same watchdog as the local pool)."""

    def __init__(self, config: WorkerConfig, slot: int) -> None:
        self.handle = WorkerHandle(config, slot=slot)

    def run(self, task: dict[str, Any], timeout_s: float) -> list[dict[str, Any]]:
        try:
            return self.handle.run(task, timeout_s, lambda rec: None)
        except Exception as exc:
            self.handle.kill()
            return failure_records(task, "harness_error", f"{type(exc).__name__}: {exc}")

    def stop(self) -> None:
        self.handle.stop()


def _project_pythonpath() -> str:
    root = str(Path(__file__).resolve().parent.parent)
    parts = [root] + [
        p for p in sys.path if p and p != root and os.path.isdir(p) and "site-packages" not in p
    ]
    existing = os.environ.get("PYTHONPATH")
    if existing:
        parts.append(existing)
    return os.pathsep.join(dict.fromkeys(parts))


class ExecutorUnavailable(RuntimeError):
    """The executor cannot start: its package is missing or its cluster does not answer."""


def probe_cluster(address: str, timeout_s: float = 10.0) -> None:
    """Fail fast when nothing listens at a HOST:PORT (or ray://HOST:PORT) cluster address: Ray's own
    connect retries for minutes. "auto" and addresses without a port are left to Ray."""
    import socket

    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise ExecutorUnavailable(
            f"executor 'ray': no Ray cluster answers at {address!r} ({type(exc).__name__}: {exc}); start one "
            "with `ray start --head` or fix --address / RAY_ADDRESS"
        ) from None


class RayExecutor:
    """Tasks on a Ray cluster: RAY_ADDRESS when set, an already-initialised Ray, or a local cluster we start."""

    def __init__(self, jobs: int, config: WorkerConfig, timeout_s: float, address: str | None = None) -> None:
        self.jobs, self.config, self.timeout_s = jobs, config, timeout_s
        self.address = address or os.environ.get("RAY_ADDRESS")

    def run(
        self,
        tasks: list[dict[str, Any]],
        on_record: OnRecord,
        on_task_done: OnTaskDone,
        stop: threading.Event | None = None,
    ) -> None:
        """Run every task on the cluster; when ``stop`` is set, stop waiting and kill the actors."""
        stop = stop or threading.Event()
        try:
            import ray
        except ImportError:
            raise ExecutorUnavailable(
                "executor 'ray' needs the ray package (pip install 'ray[default]')"
            ) from None
        runtime_env = {"env_vars": {"PYTHONPATH": _project_pythonpath()}}
        started = False
        if not ray.is_initialized():
            if self.address:  # a running cluster: this driver connects, and disconnects at the end
                probe_cluster(self.address)
                try:
                    ray.init(address=self.address, runtime_env=runtime_env, log_to_driver=False)
                except (ConnectionError, RuntimeError, ValueError) as exc:
                    raise ExecutorUnavailable(
                        f"executor 'ray': no Ray cluster answers at {self.address!r} ({type(exc).__name__}: "
                        f"{exc}); start one with `ray start --head` or fix --address / RAY_ADDRESS"
                    ) from None
                started = True
            else:
                ray.init(
                    num_cpus=self.jobs, include_dashboard=False, log_to_driver=False, runtime_env=runtime_env
                )
                started = True
        actor_cls = ray.remote(num_cpus=1, max_restarts=0)(_RayWorker)
        cpus = int(ray.cluster_resources().get("CPU", self.jobs)) or 1
        n = max(1, min(self.jobs, cpus, len(tasks) or 1))
        actors = [actor_cls.options(runtime_env=runtime_env).remote(self.config, i) for i in range(n)]
        pending: dict[Any, tuple[Any, dict[str, Any]]] = {}
        todo = list(tasks)
        free = list(actors)
        try:
            while (todo or pending) and not stop.is_set():
                while free and todo:
                    actor, task = free.pop(), todo.pop(0)
                    pending[actor.run.remote(task, self.timeout_s)] = (actor, task)
                done, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
                for ref in done:
                    actor, task = pending.pop(ref)
                    try:
                        records = ray.get(ref)
                    except Exception as exc:  # the actor (node) died: record, replace the actor
                        records = failure_records(
                            task, "crash", f"ray task failed: {type(exc).__name__}: {exc}"
                        )
                        with contextlib.suppress(Exception):
                            ray.kill(actor)
                        actor = actor_cls.options(runtime_env=runtime_env).remote(self.config, len(actors))
                        actors.append(actor)
                    for rec in records:
                        on_record(rec)
                    on_task_done(task)
                    free.append(actor)
        finally:
            for a in actors:
                if not stop.is_set():  # a stopped run does not wait for busy actors to finish
                    with contextlib.suppress(Exception):
                        ray.get(a.stop.remote(), timeout=10)
                with contextlib.suppress(Exception):
                    ray.kill(a)
            if started:
                ray.shutdown()


def make_executor(
    name: str, jobs: int, config: WorkerConfig, timeout_s: float, address: str | None = None
) -> LocalExecutor | RayExecutor:
    """``local`` (default) or ``ray`` (on the cluster at ``address``, else RAY_ADDRESS, else a local one)."""
    if name == "local":
        if address:
            raise ValueError("--address names a Ray cluster: it needs --executor ray")
        return LocalExecutor(jobs, config, timeout_s)
    if name == "ray":
        return RayExecutor(jobs, config, timeout_s, address)
    raise ValueError(f"unknown executor {name!r}; expected 'local' or 'ray'")
