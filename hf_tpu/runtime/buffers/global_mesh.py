"""The global mesh (`HF_TPU_MESH=global`): in a multi-process job, one mesh over every process's chips.

By default each process of a `tpu_dist` job owns its local chips only (`hf_tpu.mesh()` is local). With
`HF_TPU_MESH=global` it is multi-controller SPMD, as JAX runs on a TPU slice: every process runs the same
program; the mesh lists the chips of all processes (`jax.devices()`), so a tensor placed on it is one global
`jax.Array` whose shards live in the processes owning their chips; every op is a program all processes run,
in the same order, and XLA inserts the cross-process collectives. Host values placed on the mesh must be
equal in every process (each process gives only its own chips' parts: nothing checks the others'), and
reading a split tensor back to the host gathers it in every process (a collective: every process reads).

Unsharded buffers stay where they were (uncommitted on the process's first chip): a program meeting them
and a global array treats them as that process's copy of the full value, which is why the values must agree.
"""

from __future__ import annotations

import os
from functools import cache

import numpy as np

from hf_tpu.runtime.buffers import platform

ENV = "HF_TPU_MESH"
SCOPES = ("local", "global")


class GlobalMeshError(RuntimeError):
    """`HF_TPU_MESH` names no scope, or asks for the global mesh where there is no job to span."""


def requested() -> bool:
    """Whether `HF_TPU_MESH=global` asks for one mesh over every process's chips (validated)."""
    value = os.environ.get(ENV, "").strip().lower()
    if value in ("", "local"):
        return False
    if value == "global":
        return True
    raise GlobalMeshError(
        f"{ENV}={value!r} is not a mesh scope: use 'global' (one mesh over every process of a tpu_dist job) "
        "or 'local' (the default: each process's own chips), or unset it"
    )


@cache
def active() -> bool:
    """Whether the mesh spans every process of the job: decided once, when the first mesh is built (the
    job is joined by then: torchrun's env joins when the device starts, mp.spawn in init_process_group)."""
    if not requested():
        return False
    jax = platform.jax()
    platform.devices()  # backends started: joined the job, when there is one
    if jax.process_count() > 1:
        platform.set_multi_chip(len(jax.devices()) > 1)
        return True
    if os.environ.get("WORLD_SIZE", "").strip() == "1":  # torchrun with one process: global is local
        return False
    raise GlobalMeshError(
        f"{ENV}=global asks for one mesh over every process of a job, but this process is not part of one "
        "(JAX lists one process). Launch every process with torchrun's env (WORLD_SIZE > 1, RANK, MASTER_ADDR, "
        "MASTER_PORT) and without HF_TPU_DISTRIBUTED=0, or call dist.init_process_group('tpu_dist', ...) before "
        f"the first tpu tensor; unset {ENV} for a single process."
    )


def enabled() -> bool:
    """Whether this process runs under the global mesh: asked for and part of a job."""
    return requested() and active()


def mesh_devices() -> tuple:
    """The chips a mesh is built from: every process's under the global mesh (process by process, so each
    process's chips are neighbours on the mesh axis), else this process's."""
    if not active():
        return platform.devices()
    jax = platform.jax()
    forced = platform.requested_platform()
    chips = jax.devices(backend=forced) if forced else jax.devices()
    return tuple(sorted(chips, key=lambda d: (d.process_index, d.id)))


def from_host(array: np.ndarray, sharding, copy: bool):
    """A global array laid out by `sharding` from host `array` (the same value in every process): this
    process gives its own chips' parts only (`jax.make_array_from_callback`), nothing crosses processes.
    `copy`: copy each part (JAX's CPU platform would alias the host memory)."""
    jax = platform.jax()

    def part(index):
        piece = array[index]
        return np.array(piece, copy=True) if copy else piece

    return jax.make_array_from_callback(tuple(array.shape), sharding, part)


def from_local(array, sharding):
    """A global array laid out by `sharding` from this process's full copy `array` (a device array on its
    own chips): each local chip takes its part from it. `jax.device_put` would ask for a cross-host transfer
    from a committed array (a tpu_dist collective's result), which JAX's CPU and TPU backends refuse."""
    jax = platform.jax()
    return jax.make_array_from_callback(tuple(array.shape), sharding, lambda index: array[index])


def crosses_processes(array, sharding) -> bool:
    """Whether placing device `array` by `sharding` goes from one process's chips to the global mesh."""
    return not sharding.is_fully_addressable and getattr(array, "is_fully_addressable", True)


def needs_gather(a) -> bool:
    """Whether reading `a` to the host needs the other processes' parts (split over their chips)."""
    return not getattr(a, "is_fully_addressable", True) and not a.is_fully_replicated


def host_value(a) -> np.ndarray:
    """`a`'s full value on the host: its own copy when this process holds one, else gathered from every
    process (`process_allgather`: a collective, so every process must read the same tensors in order)."""
    if not needs_gather(a):
        return np.asarray(a)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(a, tiled=True))
