"""The placement layer's seam: every device array is created here, and here it is decided where it lives.

`tpu:0` is every local chip at once (single-controller SPMD, as in JAX). An array is either
*unsharded* — uncommitted on the first chip, as JAX places any array nobody placed, so it follows the
arrays it meets — or *placed* on the current mesh with a `NamedSharding`: split over chips along some
dims (`shard`) or a full copy on every chip (`replicate`). XLA's GSPMD propagates placements through
every op, fused program and compiled graph, and inserts the collectives; a result lands where XLA put
it. One chip: everything is unsharded, exactly as before there were meshes. In a multi-process job with
`HF_TPU_MESH=global` the mesh spans every process's chips and placed arrays are global (global_mesh.py).

Host -> device copies (`host_to_jax`, `numpy_to_jax`), placement on the mesh (`place`), device -> host
reads (`jax_to_host`) and per-chip byte counts (`chip_bytes`) all live here: nothing else in hf_tpu
calls `jax.device_put`, picks a chip or builds a sharding.

Meshes are built with `AxisType.Auto` (JAX 0.10's `jax.make_mesh` defaults to Explicit axes, under
which eager sharded reshapes fail).
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator, Sequence
from functools import cache

import numpy as np
import torch

from hf_tpu.runtime.buffers import file_pages, global_mesh, host_copies, platform
from hf_tpu.runtime.buffers.dtypes import (
    check_platform_dtype,
    numpy_from_torch,
    to_jax_dtype,
    torch_from_numpy,
)

DEFAULT_AXIS = "model"
# one entry per dim of a tensor: None (not split), an axis name, or a tuple of axis names
Spec = tuple

_lock = threading.Lock()
_mesh: list = [None]  # the current jax.sharding.Mesh (built on first use)
MULTI_CHIP = platform.MULTI_CHIP  # more than one local chip (set when the chips are first listed)


class PlacementError(ValueError):
    """A mesh or a sharding spec that cannot be honoured (names the argument and what to do)."""


# -- host <-> device ----------------------------------------------------------------------------------
def host_to_jax(t: torch.Tensor, spec: Spec | None = None):
    """A device buffer holding a copy of CPU tensor `t`: unsharded, or laid out by `spec` on the mesh
    (each chip receives only its part; no chip holds the whole tensor unless the spec replicates it).

    On JAX's CPU platform `device_put` of a numpy view of a torch tensor aliases its memory (even with
    `may_alias=False`, JAX 0.10.2), so a later in-place write to the CPU tensor would show through on the
    device: copy explicitly there (into a fresh numpy array only the device buffer then holds; ~5x
    cheaper than `jnp.array(..., copy=True)`). Other platforms copy to device memory anyway.
    """
    jax = platform.jax()
    to_jax_dtype(t.dtype)  # clear error for unsupported dtypes
    check_platform_dtype(t.dtype)
    if t.numel() == 0 and spec is None:  # transformers' caches start from `torch.tensor([])` every forward
        return empty_array(tuple(t.shape), t.dtype)
    host_copies.complete_into(t)  # a non-blocking copy from tpu into it lands first (stream order)
    array = numpy_from_torch(t.contiguous() if not t.is_contiguous() else t)
    if spec is not None:
        sharding = named_sharding(spec, tuple(t.shape))
        if not sharding.is_fully_addressable:  # the global mesh: this process gives its chips' parts
            out = global_mesh.from_host(array, sharding, copy=_host_platform())
        else:  # device_put slices the host array per chip; on CPU the slices are copied (never aliased)
            out = jax.device_put(np.array(array, copy=True) if _host_platform() else array, sharding)
    else:
        out = jax.device_put(np.array(array, copy=True) if _host_platform() else array)
    file_pages.release(t)  # a checkpoint's mapped pages, once copied (clean file pages only)
    return out


def numpy_to_jax(array: np.ndarray):
    """A device buffer holding numpy `array` (a constant made on the host), unsharded."""
    return platform.jax().device_put(array)


@cache
def empty_array(shape: tuple, dtype: torch.dtype):
    """One device array per empty (shape, dtype): it holds no data, and arrays are immutable."""
    return numpy_to_jax(np.zeros(shape, dtype=to_jax_dtype(dtype)))


def jax_to_host(a) -> torch.Tensor:
    """A CPU tensor holding device array `a`'s values (gathered from every chip that holds a part; under
    the global mesh from every process, which must all read it: see `global_mesh.host_value`)."""
    return torch_from_numpy(global_mesh.host_value(a))


@cache
def _host_platform() -> bool:
    return platform.default_device().platform == "cpu"


# -- the mesh -----------------------------------------------------------------------------------------
def chips() -> tuple:
    """The chips a mesh spans, in JAX's order: this process's (every process's under `HF_TPU_MESH=global`,
    see global_mesh.py)."""
    return global_mesh.mesh_devices()


def several_chips() -> bool:
    """Whether a mesh has more than one chip to spread weights over (`chips()`)."""
    return len(chips()) > 1


def mesh():
    """The current mesh (default: every chip, local or under HF_TPU_MESH=global the job's, on one axis
    named "model")."""
    current = _mesh[0]
    if current is None:
        with _lock:
            if _mesh[0] is None:
                _mesh[0] = build_mesh((len(chips()),), (DEFAULT_AXIS,))
            current = _mesh[0]
    return current


def build_mesh(shape: Sequence[int], axis_names: Sequence[str]):
    """A mesh of the first prod(shape) chips, axes named `axis_names` (Auto axes), validated."""
    jax = platform.jax()
    from jax.sharding import AxisType, Mesh

    if isinstance(shape, int):
        shape = (shape,)
    if isinstance(axis_names, str):
        axis_names = (axis_names,)
    shape, axis_names = tuple(shape), tuple(axis_names)
    if not shape or any(not isinstance(s, int) or isinstance(s, bool) or s < 1 for s in shape):
        raise PlacementError(f"mesh shape {shape!r}: give positive ints, one per axis, e.g. (2, 4)")
    if len(axis_names) != len(shape) or not all(isinstance(n, str) and n for n in axis_names):
        raise PlacementError(
            f"axis_names {axis_names!r}: give one name (a non-empty string) per mesh dim of shape {shape}"
        )
    if len(set(axis_names)) != len(axis_names):
        raise PlacementError(f"axis_names {axis_names!r}: each axis needs its own name")
    devices = chips()
    n = math.prod(shape)
    if n > len(devices):
        where = "the job (HF_TPU_MESH=global)" if global_mesh.active() else "this host"
        raise PlacementError(
            f"mesh shape {shape} needs {n} chips but {where} has {len(devices)}: use a shape whose "
            f"product is at most {len(devices)}"
        )
    if n < len(devices) and global_mesh.active():  # a smaller mesh would leave some processes without chips
        raise PlacementError(
            f"mesh shape {shape} uses {n} of the job's {len(devices)} chips: under HF_TPU_MESH=global every "
            f"process runs every program, so a mesh spans all the chips; use a shape whose product is {len(devices)}"
        )
    del jax
    grid = np.array(devices[:n], dtype=object).reshape(shape)
    return Mesh(grid, axis_names, axis_types=(AxisType.Auto,) * len(shape))


def set_mesh(shape: Sequence[int], axis_names: Sequence[str]):
    """Make a mesh of `shape` with `axis_names` the current one; returns it. Tensors placed on an earlier
    mesh keep their placement (XLA reshards them where they meet tensors of this one, when both meshes
    span the same chips)."""
    new = build_mesh(shape, axis_names)
    _mesh[0] = new
    return new


@contextlib.contextmanager
def use_mesh(shape: Sequence[int], axis_names: Sequence[str]) -> Iterator:
    """`set_mesh` for the duration of a block (the previous mesh comes back after it)."""
    previous = _mesh[0]
    new = set_mesh(shape, axis_names)
    try:
        yield new
    finally:
        _mesh[0] = previous


# -- shardings ----------------------------------------------------------------------------------------
def normalize_spec(spec, shape: tuple, what: str = "tensor") -> tuple:
    """`spec` checked against the current mesh and `shape`: one entry per dim (missing trailing dims
    are None), each None, an axis name or a tuple of axis names."""
    if spec is None:
        return (None,) * len(shape)
    if isinstance(spec, str):
        spec = (spec,)
    try:
        spec = tuple(spec)
    except TypeError:
        raise PlacementError(
            f"sharding spec {spec!r} for {what}: give a tuple with one entry per dim (None, an axis name "
            "or a tuple of names)"
        ) from None
    if len(spec) > len(shape):
        raise PlacementError(
            f"sharding spec {spec!r} has {len(spec)} entries but {what} of shape {tuple(shape)} has "
            f"{len(shape)} dims: give at most one entry per dim"
        )
    current = mesh()
    sizes = dict(current.shape)
    used: dict[str, int] = {}
    out = []
    for dim, entry in enumerate(spec):
        names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        for name in names:
            if not isinstance(name, str) or name not in sizes:
                raise PlacementError(
                    f"sharding spec {spec!r} for {what} of shape {tuple(shape)}: dim {dim} names axis {name!r}, which the mesh "
                    f"{dict(sizes)} lacks; use one of {tuple(sizes)} (or hf_tpu.set_mesh(...) a mesh with it)"
                )
            if name in used:
                raise PlacementError(
                    f"sharding spec {spec!r} for {what}: axis {name!r} splits both dim {used[name]} and dim "
                    f"{dim}; an axis can split one dim only"
                )
            used[name] = dim
        ways = math.prod(sizes[n] for n in names)
        if ways > 1 and shape[dim] % ways:
            raise PlacementError(
                f"sharding spec {spec!r} for {what} of shape {tuple(shape)}: dim {dim} (size {shape[dim]}) "
                f"does not divide into {ways} parts over axis {'x'.join(names)}; shard another dim or "
                "replicate it"
            )
        out.append(None if not names else names[0] if len(names) == 1 else names)
    return tuple(out) + (None,) * (len(shape) - len(spec))


def named_sharding(spec, shape: tuple, what: str = "tensor"):
    """The NamedSharding of `spec` on the current mesh (validated against `shape`)."""
    from jax.sharding import NamedSharding, PartitionSpec

    return NamedSharding(mesh(), PartitionSpec(*normalize_spec(spec, shape, what)))


def place(array, spec, what: str = "tensor"):
    """Device `array` laid out by `spec` on the current mesh (a copy; XLA moves only what must move)."""
    jax = platform.jax()
    sharding = named_sharding(spec, tuple(array.shape), what)
    if getattr(array, "sharding", None) == sharding:
        return array
    if global_mesh.crosses_processes(array, sharding):
        return global_mesh.from_local(array, sharding)
    return jax.device_put(array, sharding)


def spec_of(array) -> tuple:
    """How `array` is split: one entry per dim (None: not split); all None when unsharded/replicated."""
    sharding = getattr(array, "sharding", None)
    spec = getattr(sharding, "spec", None)
    if spec is None:
        return (None,) * array.ndim
    entries = tuple(spec) + (None,) * (array.ndim - len(spec))
    return tuple(
        None if e is None or e == () else e if isinstance(e, str) else e[0] if len(e) == 1 else tuple(e)
        for e in entries
    )


def is_sharded(array) -> bool:
    """Whether `array` is split over chips (not unsharded, not a full copy on each chip)."""
    sharding = getattr(array, "sharding", None)
    return sharding is not None and not sharding.is_fully_replicated


def on_mesh(array) -> bool:
    """Whether `array` is placed on a mesh (sharded or replicated), not an unsharded buffer."""
    return type(getattr(array, "sharding", None)).__name__ == "NamedSharding"


def chip_bytes(array, itemsize: int) -> Iterator[tuple[int, int]]:
    """(chip position in this process's chips, bytes) for every local chip holding a part of `array`
    (under the global mesh the other processes' chips are theirs to count)."""
    sharding = array.sharding
    per_chip = math.prod(sharding.shard_shape(tuple(array.shape))) * itemsize
    index = _chip_index()
    for device in sharding.device_set:
        if device in index:
            yield index[device], per_chip


@cache
def _chip_index() -> dict:
    return {d: i for i, d in enumerate(platform.devices())}


def describe_devices(array) -> str:
    """Which chips `array` lives on, for error messages."""
    ids = sorted(d.id for d in array.sharding.device_set)
    return f"chips {ids}" if len(ids) > 1 else f"chip {ids[0]}"


def zeros_like_placed(array, dtype: torch.dtype):
    """Zeros of `array`'s shape in `dtype`, placed as `array` is (made on the chips, no host copy)."""
    return _zeros_placed(tuple(array.shape), to_jax_dtype(dtype), array.sharding)()


@cache
def _zeros_placed(shape: tuple, jdt, sharding):
    jax = platform.jax()
    return jax.jit(lambda: jax.numpy.zeros(shape, jdt), out_shardings=sharding)


def keep_placement(old, new):
    """`new` (the next value of a buffer that held `old`) placed as `old` was, when `old` was on the
    mesh: in-place ops and writes never move a tensor between placements."""
    sharding = getattr(old, "sharding", None)
    if sharding is None or type(sharding).__name__ != "NamedSharding" or not hasattr(new, "sharding"):
        return new
    if new.sharding == sharding:
        return new
    if global_mesh.crosses_processes(new, sharding):
        return global_mesh.from_local(new, sharding)
    return platform.jax().device_put(new, sharding)


class MeshMismatchError(PlacementError):
    """An op met tensors placed on different sets of chips (placed under different meshes)."""


def mesh_mismatch(exc: BaseException, what: str) -> MeshMismatchError | None:
    """The clear error for JAX's "incompatible devices" (tensors placed under meshes of other chips), or None."""
    text = str(exc)
    if "incompatible devices" not in text:
        return None
    if global_mesh.active():
        return MeshMismatchError(
            f"hf_tpu: {what} got a tensor that lives on this process's chips only (a tpu_dist collective's "
            "result, or one placed before the global mesh) with one placed on the global mesh "
            f"(HF_TPU_MESH=global, {dict(mesh().shape)}). Place the process-local one on the global mesh first "
            f"(hf_tpu.replicate(t) or hf_tpu.shard(t, spec)). ({text.splitlines()[0][:300]})"
        )
    return MeshMismatchError(
        f"hf_tpu: {what} got tensors placed on different sets of chips: a tensor placed under an earlier mesh "
        f"(hf_tpu.set_mesh / use_mesh) met one placed under the current mesh {dict(mesh().shape)}. Re-place the "
        "older tensors under the current mesh (hf_tpu.shard(t, spec) or hf_tpu.replicate(t)), or go back to "
        f"the mesh they were placed on. ({text.splitlines()[0][:300]})"
    )
