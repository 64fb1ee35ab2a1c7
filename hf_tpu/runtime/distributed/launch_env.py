"""What the launcher (torchrun, mp.spawn, accelerate) told this process: rank, world size, coordinator.

Pure environment parsing (no JAX, no torch.distributed), so the device's lazy init can ask "is this one
process of a multi-process job?" cheaply.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

BACKEND_NAME = "tpu_dist"


class DistributedInitError(RuntimeError):
    """tpu_dist could not join the job: names the variable or address and what to do."""


@dataclass(frozen=True)
class LaunchEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str | None
    master_port: int | None


def _int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise DistributedInitError(
            f"tpu_dist: environment variable {name}={value!r} is not an integer"
        ) from None


def read() -> LaunchEnv | None:
    """The launcher's env (torchrun's RANK/WORLD_SIZE/LOCAL_RANK/...), or None when WORLD_SIZE is unset."""
    world = _int("WORLD_SIZE")
    if world is None:
        return None
    rank = _int("RANK")
    local_rank = _int("LOCAL_RANK")
    local_world = _int("LOCAL_WORLD_SIZE")
    return LaunchEnv(
        rank=rank if rank is not None else -1,
        world_size=world,
        local_rank=local_rank if local_rank is not None else (rank if rank is not None else 0),
        local_world_size=local_world if local_world is not None else world,
        master_addr=os.environ.get("MASTER_ADDR") or None,
        master_port=_int("MASTER_PORT"),
    )


def is_multi_process_launch() -> bool:
    """torchrun-style env naming a job of more than one process (WORLD_SIZE > 1)."""
    env = read()
    return env is not None and env.world_size > 1


def coordinator_from_env(env: LaunchEnv) -> str:
    """`host:port` of JAX's coordinator: HF_TPU_COORDINATOR_ADDRESS, else MASTER_ADDR and MASTER_PORT + 1
    (the c10d store keeps MASTER_PORT itself)."""
    explicit = os.environ.get("HF_TPU_COORDINATOR_ADDRESS", "").strip()
    if explicit:
        return explicit
    missing = [
        n for n, v in (("MASTER_ADDR", env.master_addr), ("MASTER_PORT", env.master_port)) if v is None
    ]
    if missing:
        raise DistributedInitError(
            f"tpu_dist: WORLD_SIZE={env.world_size} but {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set: launch with torchrun, or set MASTER_ADDR and "
            "MASTER_PORT (JAX's coordinator listens on MASTER_PORT + 1 of MASTER_ADDR), or set "
            "HF_TPU_COORDINATOR_ADDRESS=host:port"
        )
    return f"{env.master_addr}:{env.master_port + 1}"


def init_timeout_s() -> float:
    """How long joining the job may take before a clear error (HF_TPU_DIST_INIT_TIMEOUT, default 120 s)."""
    value = os.environ.get("HF_TPU_DIST_INIT_TIMEOUT", "").strip()
    try:
        return float(value) if value else 120.0
    except ValueError:
        raise DistributedInitError(
            f"tpu_dist: HF_TPU_DIST_INIT_TIMEOUT={value!r} is not a number of seconds"
        ) from None


COLLECTIVE_TIMEOUT_ENV = "HF_TPU_DIST_TIMEOUT"


def collective_timeout_s() -> float | None:
    """HF_TPU_DIST_TIMEOUT: how long a rank waits for the others at a collective (and JAX's shutdown
    waits for them at exit) before a clear error; None when unset."""
    value = os.environ.get(COLLECTIVE_TIMEOUT_ENV, "").strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if seconds <= 0:
        raise DistributedInitError(
            f"tpu_dist: {COLLECTIVE_TIMEOUT_ENV}={value!r} is not a positive number of seconds"
        )
    return seconds
