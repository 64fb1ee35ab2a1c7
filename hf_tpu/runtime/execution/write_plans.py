"""Which positions of a repeating destination (an expanded view) an in-place or out= op writes, and in
what order, as CPU writes them: the plan `tensors.repeating.write_kernel` stores with (see its docstring).
Op knowledge, so it lives with the kernels that call it: masked_fill_/index_fill_ write the selected
positions, tril_/triu_ only the zeros, index_put_ in its index order (or adds, accumulating), a
reduction's out= reduces over the out's broadcast dims; every other write is every position in
row-major order.
"""

from __future__ import annotations

from functools import cache

import torch

from hf_tpu.runtime.buffers import platform
from hf_tpu.runtime.tensors.repeating import ADD, ALL, MAX, MIN, ORDER, PROD, SUM

_REDUCTIONS = {
    "aten::sum": SUM,
    "aten::nansum": SUM,
    "aten::prod": PROD,
    "aten::amax": MAX,
    "aten::amin": MIN,
    "aten::any": MAX,
    "aten::all": MIN,
}


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
    from hf_tpu.runtime.lowerings import indexing  # imports jax: only when a plan is built

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
