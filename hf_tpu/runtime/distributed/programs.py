"""The JAX programs behind tpu_dist: one `jit(shard_map(...))` per collective over a group's global mesh.

A group of ranks is a 1-D mesh (axis "ranks") of one chip per process, in group-rank order; a compiled graph
whose collectives span several groups that are the lines of one grid of ranks (a 2-D DeviceMesh's rows and
columns) runs over that grid as an N-D mesh (`Grid`), each group's collectives over its own axis. Each
process contributes its value as its block of a global array (`jax.make_array_from_single_device_arrays`, no
copy) and gets its block of the result back. The collectives inside are JAX's (`psum`, `all_gather`,
`all_to_all`, `ppermute`): gloo between processes on JAX's CPU platform, ICI/DCN on TPU. Programs are
cached per (collective, group, shapes, dtype, op).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numpy as np

from hf_tpu.runtime.buffers import platform

AXIS = "ranks"


@cache
def process_chip(rank: int):
    """The chip that stands for global rank `rank` in collectives (its process's first chip)."""
    jax = platform.jax()
    return min((d for d in jax.devices() if d.process_index == rank), key=lambda d: d.id)


@dataclass(frozen=True)
class Grid:
    """Ranks laid out as an N-D grid, row-major (`ranks[i]` is the grid's i-th point), one mesh axis per
    dimension: where a graph's collectives run over several groups, each group is a line along one axis."""

    ranks: tuple
    shape: tuple
    axes: tuple

    def __len__(self) -> int:
        return len(self.ranks)


def _layout(ranks) -> tuple[tuple, tuple, tuple]:
    """(ranks, mesh shape, axis names) of a group (a tuple of ranks: a 1-D mesh) or a `Grid`."""
    if isinstance(ranks, Grid):
        return ranks.ranks, ranks.shape, ranks.axes
    return tuple(ranks), (len(ranks),), (AXIS,)


@cache
def group_mesh(ranks):
    """The mesh of the chips of `ranks` in that order: 1-D for a group (a direction of a pair is its own
    mesh), N-D for a `Grid`."""
    from jax.sharding import AxisType, Mesh

    flat, shape, axes = _layout(ranks)
    chips = np.array([process_chip(r) for r in flat], dtype=object).reshape(shape)
    return Mesh(chips, axes, axis_types=(AxisType.Auto,) * len(axes))


def _block_spec(ranks):
    """dim 0 split over every axis, row-major: block i is rank `ranks[i]`'s."""
    from jax.sharding import PartitionSpec

    axes = _layout(ranks)[2]
    return PartitionSpec(axes[0] if len(axes) == 1 else axes)


def block_sharding(ranks):
    from jax.sharding import NamedSharding

    return NamedSharding(group_mesh(ranks), _block_spec(ranks))


# eager collective programs run so far (a compiled graph's collectives do not add to it)
stats = {"runs": 0}


def flat_block(shape: tuple) -> tuple:
    """A rank's block in the flat layout: its value's own shape, or (1,) for a scalar. A global array is
    the ranks' blocks concatenated on dim 0, so building it and reading a rank's result back copy nothing
    (a leading axis of 1 would cost an eager reshape of the whole message on each side)."""
    return tuple(shape) if shape else (1,)


def global_struct(ranks, shape: tuple, dtype):
    """The abstract global array whose blocks are values of `shape` (for `lower`)."""
    jax = platform.jax()
    block = flat_block(shape)
    return jax.ShapeDtypeStruct((len(ranks) * block[0], *block[1:]), dtype, sharding=block_sharding(ranks))


def spmd(ranks, fn: Callable, shapes: tuple) -> tuple:
    """`fn` (one rank's values -> a tuple of that rank's results, collectives over `AXIS` inside, or over
    the axes of a `Grid`) as one jitted `shard_map` over the group's mesh in the flat layout; the reshapes between blocks and values
    happen inside the program. Returns (the program, a list that holds the results' shapes once it has
    been traced)."""
    jax = platform.jax()

    out_shapes: list = []

    def flat(*blocks):
        outs = fn(*(b.reshape(s) for b, s in zip(blocks, shapes)))
        out_shapes[:] = [tuple(o.shape) for o in outs]
        return tuple(o.reshape(flat_block(o.shape)) for o in outs)

    spec = _block_spec(ranks)
    mapped = jax.shard_map(flat, mesh=group_mesh(ranks), in_specs=(spec,) * len(shapes), out_specs=spec)
    return jax.jit(mapped), out_shapes


def flat_global(ranks, a):
    """This process's array `a` as its block of the group's global array (no copy on its own chip)."""
    jax = platform.jax()
    a = jax.device_put(a, process_chip(jax.process_index()))
    if a.ndim == 0:
        a = a.reshape(1)
    shape = (len(ranks) * a.shape[0],) + tuple(a.shape[1:])
    return jax.make_array_from_single_device_arrays(shape, block_sharding(ranks), [a])


def local_result(out, shape: tuple):
    """This process's result of shape `shape` from a global result in the flat layout."""
    local = out.addressable_shards[0].data
    return local if shape else local.reshape(())


@cache
def _values_fn(body: Callable) -> Callable:
    """A block body ((1, *shape) blocks in, one block out) as a function of values for `spmd`."""

    def fn(*values):
        return (body(*(v[None] for v in values))[0],)

    return fn


@cache
def block_program(ranks: tuple, body: Callable, shapes: tuple, dtypes: tuple):
    """`spmd` of a block body (see `run`), cached per group, body, shapes and dtypes."""
    return spmd(ranks, _values_fn(body), shapes)


def run(ranks: tuple, body: Callable, *local_arrays):
    """Run `body` (per-rank blocks of shape (1, *local shape) in, one block out) over the group's mesh;
    returns this process's result without the leading 1. Dispatch is asynchronous."""
    shapes = tuple(tuple(a.shape) for a in local_arrays)
    program, out_shapes = block_program(ranks, body, shapes, tuple(a.dtype for a in local_arrays))
    (out,) = program(*(flat_global(ranks, a) for a in local_arrays))
    stats["runs"] += 1
    return local_result(out, out_shapes[0])


# -- bodies: pure functions of the per-rank block, cached so equal collectives share one program ------
@cache
def reshaped(body: Callable, in_shape: tuple | None, out_shape: tuple) -> Callable:
    """`body` with its block reshaped to (1, *in_shape) before (unless None) and its result to
    (1, *out_shape) after, inside the program: an eager reshape would copy the whole message."""

    def wrapped(x):
        y = body(x if in_shape is None else x.reshape((1, *in_shape)))
        return y.reshape((1, *out_shape))

    return wrapped


@cache
def all_reduce_body(
    op: str, kind: str, group_size: int, factor: float | None = None, axis_name: str = AXIS
) -> Callable:
    """x -> the reduction of every rank's x over mesh axis `axis_name` (`op` one of
    sum/avg/max/min/product/premul_sum/band/bor/bxor; `kind` "bool", "int", "float" or "complex", validated
    by the caller)."""
    lax = platform.jax().lax
    jnp = platform.jax().numpy

    def gathered(x):
        return lax.all_gather(x, axis_name, axis=0, tiled=True)

    def body(x):
        if kind == "bool":
            xi = x.astype(jnp.int32)
            if op in ("sum", "max", "bor"):
                y = lax.pmax(xi, axis_name)
            elif op in ("min", "product", "band"):
                y = lax.pmin(xi, axis_name)
            else:  # bxor
                y = lax.psum(xi, axis_name) % 2
            return y != 0
        if op == "sum":
            return lax.psum(x, axis_name)
        if op == "avg":
            return (lax.psum(x, axis_name) / group_size).astype(x.dtype)
        if op == "premul_sum":
            return lax.psum(x * jnp.asarray(factor, x.dtype), axis_name)
        if op == "max":
            return lax.pmax(x, axis_name)
        if op == "min":
            return lax.pmin(x, axis_name)
        g = gathered(x)
        if op == "product":
            return jnp.prod(g, axis=0, keepdims=True).astype(x.dtype)
        fn = {"band": jnp.bitwise_and, "bor": jnp.bitwise_or, "bxor": jnp.bitwise_xor}[op]
        return functools.reduce(fn, [g[i : i + 1] for i in range(group_size)])

    return body


@cache
def reduce_scatter_body(
    op: str, kind: str, group_size: int, factor: float | None = None, axis_name: str = AXIS
) -> Callable:
    """x of shape (1, G*n, ...) -> this rank's n rows of the reduction."""
    lax = platform.jax().lax
    reduce = all_reduce_body(op, kind, group_size, factor, axis_name)

    def body(x):
        if op == "sum" and kind in ("int", "float", "complex"):
            return lax.psum_scatter(x, axis_name, scatter_dimension=1, tiled=True)
        y = reduce(x)
        n = x.shape[1] // group_size
        return lax.dynamic_slice_in_dim(y, lax.axis_index(axis_name) * n, n, axis=1)

    return body


@cache
def all_gather_body(axis_name: str = AXIS) -> Callable:
    """x of shape (1, ...) -> every rank's x stacked: (1, G, ...)."""
    lax = platform.jax().lax
    jnp = platform.jax().numpy

    def body(x):
        if x.dtype == jnp.bool_:
            return lax.all_gather(x.astype(jnp.uint8), axis_name, axis=1).astype(jnp.bool_)
        return lax.all_gather(x, axis_name, axis=1)

    return body


@cache
def pick_body(src: int, axis_name: str = AXIS) -> Callable:
    """x of shape (1, ...) -> group rank `src`'s x (broadcast)."""
    gather = all_gather_body(axis_name)

    def body(x):
        return gather(x)[:, src]

    return body


@cache
def all_to_all_body(axis_name: str = AXIS) -> Callable:
    """x of shape (1, G, ...) -> (1, G, ...) whose row j is rank j's row for this rank."""
    lax = platform.jax().lax
    jnp = platform.jax().numpy

    def body(x):
        y = x[0]
        if y.dtype == jnp.bool_:
            return lax.all_to_all(y.astype(jnp.uint8), axis_name, 0, 0, tiled=True).astype(jnp.bool_)[None]
        return lax.all_to_all(y, axis_name, 0, 0, tiled=True)[None]

    return body


@cache
def scatter_body(src: int) -> Callable:
    """x of shape (1, G, ...) (meaningful on `src` only) -> (1, ...): row `src` sent to this rank."""
    exchange = all_to_all_body()

    def body(x):
        return exchange(x)[:, src]

    return body


@cache
def send_body() -> Callable:
    """On a (sender, receiver) mesh: the sender's block moves to the receiver."""
    lax = platform.jax().lax
    jnp = platform.jax().numpy

    def body(x):
        if x.dtype == jnp.bool_:
            return lax.ppermute(x.astype(jnp.uint8), AXIS, [(0, 1)]).astype(jnp.bool_)
        return lax.ppermute(x, AXIS, [(0, 1)])

    return body


@cache
def max_body() -> Callable:
    lax = platform.jax().lax

    def body(x):
        return lax.pmax(x, AXIS)

    return body
