"""Writes into a destination whose elements share memory (an expanded view: a stride 0 over a dim of size
> 1), as CPU makes them.

CPU refuses most such writes (`overlap.py`); the ones it runs (`masked_fill_`, `index_fill_`,
`index_put_`/`x[i] = v`, `tril_`/`triu_`, fills, `out=` of `bmm`, `tril`, ...) store element by element,
so a memory location several view positions share ends with the last value written to it, and keeps its
value when none of its positions is written (`b.expand(3, 4).masked_fill_(m, 1)` sets `b[j]` when any row
of column j is masked). Here the op's functional result (the whole view) is stored through `write_kernel`
with an *order*: per view position, when the op writes it (-1: it does not); each memory location takes
the value of its last-written position (ties: the last in row-major order), and nothing else is touched.
An accumulating `index_put_` adds every position's contribution into memory instead (CPU reads back what
it just wrote). Only destinations with a 0 stride come here: the common paths are unchanged.

`write_plan` gives the order of the ops that write part of the view (`_PARTIAL`); every other write
(out=, fills, elementwise ops CPU allows) writes all positions in row-major order (CPU's for these).
"""

from __future__ import annotations

from functools import cache

import torch

from hf_tpu.runtime.buffers import platform

# how a repeating destination is written: every position in row-major order, positions in a given order,
# or contributions added up (accumulating index_put_)
ALL, ORDER, ADD = "all", "order", "add"
# a reduction's out= that repeats: CPU's TensorIterator reduces over the out's broadcast dims too, so a
# location gets the reduction of the results of all its positions (its old value is not used)
SUM, PROD, MAX, MIN = "sum", "prod", "max", "min"
_REDUCTIONS = {
    "aten::sum": SUM,
    "aten::nansum": SUM,
    "aten::prod": PROD,
    "aten::amax": MAX,
    "aten::amin": MIN,
    "aten::any": MAX,
    "aten::all": MIN,
}


def repeats(shape, stride) -> bool:
    """Whether view (shape, stride) repeats elements through a broadcast dim."""
    return any(st == 0 and n > 1 for n, st in zip(shape, stride))


def _flat_index(jnp, shape, stride, offset):
    idx = jnp.asarray(offset, dtype=jnp.int32)
    for dim, (size, st) in enumerate(zip(shape, stride)):
        ar = jnp.arange(size, dtype=jnp.int32) * st
        idx = idx + ar.reshape((1,) * dim + (size,) + (1,) * (len(shape) - dim - 1))
    return jnp.broadcast_to(idx, shape).reshape(-1)


@cache
def write_kernel(base_shape: tuple, shape: tuple, stride: tuple, how: str):
    """Jitted (base, value[, order], offset) -> base with view (shape, stride) at `offset` written as CPU
    would (see the module docstring); `order` only for ORDER."""
    jax = platform.jax()
    jnp = jax.numpy
    numel = 1
    for n in shape:
        numel *= n

    def put(base, value, *rest):
        *order, offset = rest
        flat = base.reshape(-1)
        size = flat.shape[0]
        idx = _flat_index(jnp, shape, stride, offset)
        v = value.reshape(-1).astype(flat.dtype)
        if how == ADD:  # `order` holds what each position receives (the value is the op's result)
            v = order[0].reshape(-1).astype(flat.dtype)
            if flat.dtype == jnp.bool_:  # accumulating bools is a logical or
                return (
                    flat.astype(jnp.int32)
                    .at[idx]
                    .max(v.astype(jnp.int32))
                    .astype(jnp.bool_)
                    .reshape(base.shape)
                )
            return flat.at[idx].add(v).reshape(base.shape)
        if how in (SUM, PROD, MAX, MIN):
            boolean = flat.dtype == jnp.bool_
            acc = flat.astype(jnp.int32) if boolean else flat
            v = v.astype(acc.dtype)
            start = {SUM: 0, PROD: 1, MAX: _lowest(jnp, acc.dtype), MIN: _highest(jnp, acc.dtype)}[how]
            acc = acc.at[idx].set(jnp.asarray(start, acc.dtype))
            ref = acc.at[idx]
            acc = {SUM: ref.add, PROD: ref.multiply, MAX: ref.max, MIN: ref.min}[how](v)
            return (acc.astype(jnp.bool_) if boolean else acc).reshape(base.shape)
        pos = jnp.arange(numel, dtype=jnp.int32)
        o = pos if how == ALL else order[0].reshape(-1).astype(jnp.int32)
        last = jnp.full((size,), -1, jnp.int32).at[idx].max(o)
        keep = (o >= 0) & (o == last[idx])
        if how == ORDER:  # ties (one write reaching several positions of a location): row-major last
            tie = jnp.full((size,), -1, jnp.int32).at[idx].max(jnp.where(keep, pos, -1))
            keep = keep & (pos == tie[idx])
        return flat.at[jnp.where(keep, idx, size)].set(v, mode="drop").reshape(base.shape)

    return jax.jit(put)


def _lowest(jnp, dtype):
    return -jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min


def _highest(jnp, dtype):
    return jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).max


# -- which positions an op writes, and in which order --------------------------------------------------
def _rowmajor(jnp, shape):
    n = 1
    for s in shape:
        n *= s
    return jnp.arange(n, dtype=jnp.int32).reshape(shape)


@cache
def _masked_fill_order(shape: tuple):
    jax = platform.jax()
    jnp = jax.numpy
    return jax.jit(lambda mask: jnp.where(jnp.broadcast_to(mask, shape), _rowmajor(jnp, shape), -1))


@cache
def _index_fill_order(shape: tuple, dim: int):
    jax = platform.jax()
    jnp = jax.numpy

    def order(index):
        size = shape[dim] if shape else 1
        index = index.reshape(-1)
        index = jnp.where(index < 0, index + size, index)
        hit = jnp.zeros((size,), jnp.bool_).at[index].set(True, mode="drop")
        hit = hit.reshape((size,) + (1,) * (len(shape) - dim - 1)) if shape else hit.reshape(())
        return jnp.where(jnp.broadcast_to(hit, shape), _rowmajor(jnp, shape), -1)

    return jax.jit(order)


@cache
def _triangle_order(shape: tuple, diagonal: int, upper: bool):
    """tril_/triu_ write only the zeros (positions outside the kept triangle)."""
    jax = platform.jax()
    jnp = jax.numpy
    rows, cols = shape[-2], shape[-1]
    i = jnp.arange(rows, dtype=jnp.int32)[:, None]
    j = jnp.arange(cols, dtype=jnp.int32)[None, :]

    def order():
        zeroed = (j - i < diagonal) if upper else (j - i > diagonal)
        return jnp.where(jnp.broadcast_to(zeroed, shape), _rowmajor(jnp, shape), -1)

    return jax.jit(order)


def _index_put_plan_fn(shape: tuple, jdt, accumulate: bool):
    from hf_tpu.runtime.lowerings import indexing

    jax = platform.jax()
    jnp = jax.numpy

    def plan(indices, values):
        values = indexing._as_array(values, jdt)
        if accumulate:  # what each view position receives
            return indexing.index_put(jnp.zeros(shape, jdt), indices, values, True)
        if indexing._single_mask_put(jnp.zeros(shape, jnp.bool_), indices, values, False) is not None:
            # x[mask] = v: the selection in row-major order, as CPU visits it
            hit = indexing._single_mask_put(
                jnp.zeros(shape, jnp.bool_), indices, jnp.ones((), jnp.bool_), False
            )
            return jnp.where(hit, _rowmajor(jnp, shape), -1)
        idx = indexing._put_indices(jnp.zeros(shape, jdt), indices, values)
        probe = jnp.zeros(shape, jnp.bool_)[idx]
        visits = _rowmajor(jnp, probe.shape)  # CPU visits the indexed block in row-major order
        return jnp.full(shape, -1, jnp.int32).at[idx].max(visits, mode="drop")

    return jax.jit(plan)


_index_put_plans: dict = {}


def _lazy_value(t):
    from hf_tpu.runtime.tensors.tensor import to_jax_lazy

    if isinstance(t, torch.Tensor):
        return to_jax_lazy(t)
    return t


def _call(fn, args):
    from hf_tpu.runtime.launch import lazy

    return lazy.maybe_call(fn, args)


def write_plan(functional, dest: torch.Tensor, full: list, inplace: bool = True):
    """(how, order) for the in-place or out= op computing `functional` (`full`: the op's arguments) and
    writing into repeating `dest`: (ALL, None) unless the op writes only part of the view or reduces."""
    name = functional._schema.name
    if name in _REDUCTIONS:
        return _REDUCTIONS[name], None
    if not inplace:  # an out= op writes its whole result
        return ALL, None
    shape = tuple(dest.shape)
    if name == "aten::masked_fill":
        return ORDER, _call(_masked_fill_order(shape), (_lazy_value(full[1]),))
    if name == "aten::index_fill":
        dim = full[1] % max(dest.dim(), 1)
        return ORDER, _call(_index_fill_order(shape, dim), (_lazy_value(full[2]),))
    if name in ("aten::tril", "aten::triu") and dest.dim() >= 2:
        return ORDER, _call(_triangle_order(shape, full[1], name == "aten::triu"), ())
    if name in ("aten::index_put", "aten::_index_put_impl"):
        from hf_tpu.runtime.buffers.dtypes import to_jax_dtype

        accumulate = bool(full[3])
        key = (shape, dest.dtype, accumulate)
        fn = _index_put_plans.get(key)
        if fn is None:
            fn = _index_put_plans[key] = _index_put_plan_fn(shape, to_jax_dtype(dest.dtype), accumulate)
        indices = [None if i is None else _lazy_value(i) for i in full[1]]
        values = _lazy_value(full[2])
        holes = tuple(i is None for i in indices)
        plan = _call(_flat_fn(fn, holes), (*[i for i in indices if i is not None], values))
        return (ADD if accumulate else ORDER), plan
    return ALL, None


@cache
def _flat_fn(fn, holes: tuple):
    """`fn(indices, values)` taking the index arrays as positional arguments (recordings take arrays, not
    lists), `holes` marking the None indices."""
    jax = platform.jax()

    def flat(*args):
        it = iter(args[:-1])
        indices = [None if h else next(it) for h in holes]
        return fn(indices, args[-1])

    return jax.jit(flat)
