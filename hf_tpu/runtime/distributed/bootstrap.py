"""Joining JAX's multi-controller runtime (`jax.distributed`) so the global device list spans processes.

`jax.distributed.initialize` must run before JAX starts its backends, while hf_tpu starts them lazily on
the first tpu tensor. Two orders therefore meet here:
- the launcher's env says this is one process of many (torchrun: WORLD_SIZE > 1 with RANK): the device's
  lazy init joins the job itself (`before_backend_init`, a hook the platform calls), so tensors may be
  made before `init_process_group`;
- `init_process_group("tpu_dist", rank=..., world_size=...)` without that env (mp.spawn): the backend joins
  (`join_for_process_group`), which works while no tpu tensor exists yet and raises a clear error after.

On JAX's CPU platform the cross-process collectives are JAX's own (gloo), so everything is testable here.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass

from hf_tpu.runtime.distributed import launch_env
from hf_tpu.runtime.distributed.launch_env import DistributedInitError

_OFF = ("0", "off", "false", "no")
_lock = threading.Lock()


@dataclass(frozen=True)
class Joined:
    rank: int
    world_size: int
    local_rank: int
    coordinator: str


_joined: list[Joined | None] = [None]


def joined() -> Joined | None:
    """This process's place in the job, once it joined (None: a single-process run)."""
    return _joined[0]


def auto_join_enabled() -> bool:
    return os.environ.get("HF_TPU_DISTRIBUTED", "1").strip().lower() not in _OFF


def before_backend_init(jax) -> None:
    """The platform's hook (JAX imported, backends not started): join the job the launcher's env names."""
    env = launch_env.read()
    if env is None or env.world_size <= 1 or not auto_join_enabled():
        return
    if env.rank < 0:
        raise DistributedInitError(
            f"tpu_dist: WORLD_SIZE={env.world_size} is set but RANK is not: launch with torchrun, set RANK, "
            "or unset WORLD_SIZE (HF_TPU_DISTRIBUTED=0 keeps this process single-controller)"
        )
    _join(jax, env.rank, env.world_size, env.local_rank, launch_env.coordinator_from_env(env))


def backends_started(jax) -> bool:
    """Whether JAX already started its backends (too late to join a job)."""
    try:
        from jax._src import xla_bridge

        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):  # pragma: no cover - other JAX versions
        return False


def join_for_process_group(rank: int, world_size: int, store) -> Joined:
    """Called by the tpu_dist backend of the default group: make sure this process is in the JAX job
    of `world_size` processes as process `rank` (joining now when the device did not already)."""
    from hf_tpu.runtime.buffers import platform

    jax = platform.jax()  # runs before_backend_init: under torchrun this joins already
    current = _joined[0]
    if current is None and world_size > 1:
        if backends_started(jax):
            raise DistributedInitError(
                f"tpu_dist: init_process_group(rank={rank}, world_size={world_size}) came after this process "
                "already used the tpu device, and its environment did not say it is part of a job (WORLD_SIZE, "
                "RANK, MASTER_ADDR, MASTER_PORT), so JAX started single-process. Call "
                "dist.init_process_group('tpu_dist', ...) before the first tpu tensor, or set those variables "
                "(torchrun does) before the process starts."
            )
        env = launch_env.read()
        local_rank = env.local_rank if env is not None and env.rank == rank else rank
        current = _join(jax, rank, world_size, local_rank, _coordinator(store))
    if current is None:
        current = Joined(rank=0, world_size=1, local_rank=0, coordinator="")
    if (current.rank, current.world_size) != (rank, world_size):
        raise DistributedInitError(
            f"tpu_dist: init_process_group(rank={rank}, world_size={world_size}) does not match the job this "
            f"process joined when the tpu device started (rank {current.rank} of {current.world_size}, from "
            "RANK/WORLD_SIZE): pass the same rank and world size, or leave them to the env"
        )
    platform.devices()
    return current


def _coordinator(store) -> str:
    """JAX's coordinator for a job whose env may lack MASTER_ADDR (init_method="tcp://..."): the c10d
    store's host, port + 1."""
    env = launch_env.read()
    if os.environ.get("HF_TPU_COORDINATOR_ADDRESS") or (
        env is not None and env.master_addr and env.master_port
    ):
        return launch_env.coordinator_from_env(env or launch_env.LaunchEnv(0, 1, 0, 1, None, None))
    while store is not None and not hasattr(store, "port") and hasattr(store, "underlying_store"):
        store = store.underlying_store
    host, port = getattr(store, "host", None), getattr(store, "port", None)
    if not host or not port:
        raise DistributedInitError(
            "tpu_dist: cannot tell where JAX's coordinator should listen: set MASTER_ADDR and MASTER_PORT "
            "(JAX's coordinator listens on MASTER_PORT + 1) or HF_TPU_COORDINATOR_ADDRESS=host:port"
        )
    return f"{host}:{int(port) + 1}"


def _join(jax, rank: int, world_size: int, local_rank: int, coordinator: str) -> Joined:
    with _lock:
        if _joined[0] is not None:
            return _joined[0]
        if not 0 <= rank < world_size:
            raise DistributedInitError(f"tpu_dist: RANK={rank} is outside WORLD_SIZE={world_size}")
        timeout = launch_env.init_timeout_s()
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        if rank != 0:  # JAX aborts the process when the coordinator never answers: ask first, raise clearly
            _wait_for(coordinator, timeout)
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=world_size,
            process_id=rank,
            initialization_timeout=max(1, int(timeout)),
            # at exit JAX waits for every process: bounded, so a rank outliving a dead peer still exits
            shutdown_timeout_seconds=max(1, int(launch_env.collective_timeout_s() or 300)),
        )
        _joined[0] = Joined(rank, world_size, local_rank, coordinator)
        return _joined[0]


def _wait_for(coordinator: str, timeout: float) -> None:
    """Wait until something listens at `coordinator` (host:port), else a clear DistributedInitError."""
    host, _, port = coordinator.rpartition(":")
    host = host.strip("[]")
    try:
        port_number = int(port)
    except ValueError:
        raise DistributedInitError(
            f"tpu_dist: coordinator address {coordinator!r} is not host:port (from MASTER_ADDR/MASTER_PORT or "
            "HF_TPU_COORDINATOR_ADDRESS)"
        ) from None
    deadline = time.monotonic() + timeout
    last: OSError | None = None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port_number), timeout=min(2.0, timeout)):
                return
        except OSError as exc:
            last = exc
            time.sleep(0.2)
    raise DistributedInitError(
        f"tpu_dist: JAX's coordinator at {coordinator} (MASTER_ADDR, MASTER_PORT + 1, or "
        f"HF_TPU_COORDINATOR_ADDRESS) did not answer within {timeout:g} s ({last}). Is rank 0 running and "
        "reachable at that address? HF_TPU_DIST_INIT_TIMEOUT sets the wait."
    )
