"""Registering `tpu_dist` with torch.distributed and the hooks the device's lazy init consults.

Runs at `import torch` (through the device's autoload): no JAX here, only names and callbacks.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch.distributed as dist

from hf_tpu.runtime.buffers import platform
from hf_tpu.runtime.distributed import bootstrap, launch_env
from hf_tpu.runtime.distributed.launch_env import BACKEND_NAME

_registered = [False]


def _create(backend_opts, pg_options=None):
    """torch's extended backend factory: the tpu_dist process group of a new (sub)group."""
    from hf_tpu.runtime.distributed.process_group import ProcessGroupTPU

    rank, size = backend_opts.group_rank, backend_opts.group_size
    ranks = tuple(backend_opts.global_ranks_in_group or ())
    if bootstrap.joined() is None or not ranks:  # the default group: join the JAX job as this rank
        joined = bootstrap.join_for_process_group(rank, size, backend_opts.store)
        if not ranks:
            ranks = tuple(range(joined.world_size))
    return ProcessGroupTPU(rank, ranks, backend_opts.store, backend_opts.timeout)


def local_index_ok(index: int) -> bool:
    """In a multi-process job, `tpu:i` for i below the host's process count names this process's device
    (the CUDA idiom `tpu:local_rank`); tensors still report `tpu:0`."""
    return 0 <= index < local_device_names()


def local_device_names() -> int:
    """How many `tpu:i` indices name this process's device (0 outside a multi-process job): what
    `torch.accelerator.device_count()` reports there, so `init_process_group(device_id=tpu:local_rank)`
    passes torch's range check. Reads the env only (no JAX)."""
    joined = bootstrap.joined()
    env = launch_env.read()
    if joined is not None and joined.world_size > 1:
        limit = env.local_world_size if env is not None else joined.world_size
        return max(limit, joined.local_rank + 1)
    if env is not None and env.world_size > 1:
        return env.local_world_size
    return 0


# the `world_size` of the init_process_group call under way in this thread/task (0: none, or not given)
_world_size_initializing: contextvars.ContextVar[int] = contextvars.ContextVar(
    "tpu_dist_world_size_initializing", default=0
)


def world_size_being_initialized() -> int:
    """The `world_size` argument of an `init_process_group` that is running right now (else 0).

    Under `mp.spawn` nothing in the env says how many processes there are before the group exists, yet
    torch checks `device_id=tpu:rank` against `torch.accelerator.device_count()` inside that call; for
    tpu_dist that index names the process's own device, so the job's size is the right bound.
    """
    return _world_size_initializing.get()


@contextlib.contextmanager
def world_size_initializing(size) -> Iterator[None]:
    """Publish the `world_size` of the `init_process_group` call under way (`world_size_being_initialized`);
    hf_tpu.integrations.torch_distributed wraps `init_process_group` in it (the runtime patches nothing)."""
    token = _world_size_initializing.set(size if isinstance(size, int) and size > 0 else 0)
    try:
        yield
    finally:
        _world_size_initializing.reset(token)


def register() -> None:
    """Register the backend (idempotent) and the platform hooks."""
    if _registered[0]:
        return
    if BACKEND_NAME not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["tpu"])
    platform.BEFORE_BACKEND_INIT.append(bootstrap.before_backend_init)
    platform.LOCAL_INDEX_OK[0] = local_index_ok
    _registered[0] = True
