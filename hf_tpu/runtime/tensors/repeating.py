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

`execution/write_plans.py` gives the order of the ops that write part of the view (op knowledge, above
this layer); every other write (out=, fills, elementwise ops CPU allows) writes all positions in
row-major order (CPU's for these).
"""

from __future__ import annotations

from functools import cache

from hf_tpu.runtime.buffers import platform

# how a repeating destination is written: every position in row-major order, positions in a given order,
# or contributions added up (accumulating index_put_)
ALL, ORDER, ADD = "all", "order", "add"
# a reduction's out= that repeats: CPU's TensorIterator reduces over the out's broadcast dims too, so a
# location gets the reduction of the results of all its positions (its old value is not used)
SUM, PROD, MAX, MIN = "sum", "prod", "max", "min"


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
