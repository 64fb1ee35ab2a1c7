"""Segment reductions (`torch.segment_reduce`, aten::segment_reduce) and their backward.

`data` is cut along `axis` into consecutive segments given by `lengths` (..., S) or `offsets`
(..., S + 1), whose leading dims are data's batch dims before `axis`; each segment reduces to one
value (sum, prod, mean, max/amax, min/amin). Semantics follow ATen's CPU kernel: `initial` (default
0 for sum/mean, 1 for prod, -inf/+inf for max/min) enters every segment, an empty mean segment
without `initial` is NaN (with it, `initial`), a NaN anywhere in a max/min segment wins. Elements
outside every segment (offsets not covering the axis) are ignored. Half types reduce in float32.

The segment id of each element comes from a searchsorted of its position in the offsets, so the
whole op is one jitted scatter-reduce with static shapes. PyTorch checks `lengths` by value when
`unsafe=False` (no negative length, every row sums to data.size(axis)); in eager mode the kernel
reads those two facts back (one small sync, as CPU and CUDA do) to raise the same errors. Compiled
graphs use the jitted body without the value checks.

Backward (`_segment_reduce_backward`) mirrors the CPU kernel too, quirks included: max/min split a
segment's gradient evenly over its tied (or NaN) elements, but only where the gradient is positive;
prod uses output / x, or the product of the other elements where x is 0 or NaN.
"""

from __future__ import annotations

import math
from functools import cache

import jax
import jax.numpy as jnp
import torch

from hf_tpu.runtime.lowerings.table import lowers
from hf_tpu.runtime.tensors.tensor import to_jax, wrap

_REDUCTIONS = {
    "sum": "sum",
    "prod": "prod",
    "mean": "mean",
    "max": "max",
    "amax": "max",
    "min": "min",
    "amin": "min",
}
_HALF = (jnp.bfloat16, jnp.float16)


def _reduction(reduce: str) -> str:
    if reduce not in _REDUCTIONS:
        raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}")
    return _REDUCTIONS[reduce]


def _compute_dtype(dtype):
    return jnp.float32 if dtype in _HALF else dtype


def _check(data_shape, data_dtype, lengths, indices, offsets, axis: int, name: str = "segment_reduce") -> int:
    """Static checks shared by forward and backward; returns the wrapped axis."""
    ndim = len(data_shape)
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise IndexError(f"{name}(): axis {axis} is out of range for data with {ndim} dimensions")
    axis %= max(ndim, 1)
    if indices is not None:
        raise RuntimeError("segment_reduce(): indices based reduction is not supported yet.")
    if lengths is None and offsets is None:
        raise RuntimeError("segment_reduce(): Either lengths or offsets must be defined.")
    if not jnp.issubdtype(data_dtype, jnp.floating):
        raise RuntimeError(f"{name}(): expected floating-point data, got {data_dtype}")
    which, idx = ("offsets", offsets) if offsets is not None else ("lengths", lengths)
    if idx.dtype not in (jnp.int32, jnp.int64):
        raise RuntimeError(f"{name}(): {which} must be int32 or int64, got {idx.dtype}")
    if axis != idx.ndim - 1:
        raise RuntimeError(
            f"segment_reduce(): Expected axis to be the last dimension of {which} but got {axis}."
        )
    if tuple(idx.shape[:axis]) != tuple(data_shape[:axis]):
        raise RuntimeError(
            f"{name}(): {which} of shape {tuple(idx.shape)} must have data's leading dims {tuple(data_shape[:axis])}"
        )
    if offsets is not None and lengths is None and offsets.shape[-1] < 1:
        raise RuntimeError(f"{name}(): offsets must have at least one element along axis {axis}")
    return axis


def _segments(data_shape, lengths, offsets, axis: int):
    """(segment id per (batch, position): (B, L) with S for 'no segment', segment lengths (B, S))."""
    batch = math.prod(data_shape[:axis])
    size = data_shape[axis]
    if offsets is not None:
        off = offsets.astype(jnp.int64).reshape(batch, -1)
    else:
        cum = jnp.cumsum(lengths.astype(jnp.int64).reshape(batch, -1), axis=-1)
        off = jnp.concatenate([jnp.zeros((batch, 1), jnp.int64), cum], axis=-1)
    n_seg = off.shape[-1] - 1
    pos = jnp.arange(size, dtype=jnp.int64)
    seg = jax.vmap(lambda o: jnp.searchsorted(o, pos, side="right"))(off) - 1
    seg = jnp.where((seg >= 0) & (seg < n_seg), seg, n_seg)
    return seg, off[:, 1:] - off[:, :-1]


def _as_bli(x, axis: int):
    """x viewed as (batch, length along axis, inner)."""
    return x.reshape(math.prod(x.shape[:axis]), x.shape[axis], math.prod(x.shape[axis + 1 :]))


def _scatter(values, seg, n_seg: int, how: str, identity):
    """Per (batch, segment, inner) reduction of `values` (B, L, I) by segment ids `seg` (B, L)."""
    b, _, inner = values.shape
    rows = jnp.arange(b)[:, None]
    start = jnp.full((b, n_seg + 1, inner), identity, values.dtype)
    return getattr(start.at[rows, seg], how)(values)[:, :n_seg]


def _forward(data, lengths, offsets, reduce: str, axis: int, initial):
    ct = _compute_dtype(data.dtype)
    seg, seg_len = _segments(data.shape, lengths, offsets, axis)
    n_seg = seg_len.shape[-1]
    x = _as_bli(data, axis).astype(ct)
    counts = seg_len[..., None]
    if reduce in ("sum", "mean"):
        total = _scatter(x, seg, n_seg, "add", 0) + (0 if initial is None else initial)
        if reduce == "sum":
            out = total
        else:
            empty = jnp.asarray(jnp.nan if initial is None else initial, ct)
            out = jnp.where(counts > 0, total / jnp.maximum(counts, 1).astype(ct), empty)
    elif reduce == "prod":
        out = _scatter(x, seg, n_seg, "multiply", 1) * (1 if initial is None else initial)
    else:
        top = reduce == "max"
        bound = -jnp.inf if top else jnp.inf
        ext = _scatter(x, seg, n_seg, "max" if top else "min", bound)
        if initial is not None:
            ext = jnp.maximum(ext, initial) if top else jnp.minimum(ext, initial)
        has_nan = _scatter(jnp.isnan(x).astype(jnp.int32), seg, n_seg, "max", 0)
        out = jnp.where(has_nan > 0, jnp.nan, ext)
    shape = data.shape[:axis] + (n_seg,) + data.shape[axis + 1 :]
    return out.reshape(shape).astype(data.dtype)


@cache
def _forward_jit(reduce: str, axis: int, initial):
    return jax.jit(lambda data, lengths, offsets: _forward(data, lengths, offsets, reduce, axis, initial))


@jax.jit
def _lengths_facts(lengths, size):
    """(min length, every row sums to `size`) for the !unsafe checks."""
    sums = jnp.sum(lengths.astype(jnp.int64), axis=-1)
    low = jnp.min(lengths) if lengths.size else jnp.zeros((), lengths.dtype)
    return low, jnp.all(sums == size)


def _initial(initial):
    return None if initial is None else float(initial)


@lowers("aten::segment_reduce", kind="host")
def segment_reduce(
    data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None
) -> torch.Tensor:
    d = to_jax(data)
    lj = None if lengths is None else to_jax(lengths)
    oj = None if offsets is None else to_jax(offsets)
    axis = _check(d.shape, d.dtype, lj, indices, oj, axis)
    how = _reduction(reduce)
    if oj is None and not unsafe:
        low, sums_ok = _lengths_facts(lj, d.shape[axis])
        if int(low) < 0:
            raise RuntimeError("lengths contains negative value!")
        if not bool(sums_ok):
            raise RuntimeError(
                "segment_reduce(): Expected all rows of lengths along axis to sum to "
                "data.size(lengths.dim()-1) when !unsafe."
            )
    out = _forward_jit(how, axis, _initial(initial))(d, lj, oj)
    return wrap(out, data.dtype)


@lowers("aten::segment_reduce", graph=True)
def segment_reduce_graph(
    data, reduce, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None
):
    """Inside compiled graphs: the same body, without the value checks of `lengths`."""
    axis = _check(data.shape, data.dtype, lengths, indices, offsets, axis)
    return _forward(data, lengths, offsets, _reduction(reduce), axis, _initial(initial))


@lowers("aten::_segment_reduce_backward", static_scalars=True)
def segment_reduce_backward(grad, output, data, reduce, lengths=None, offsets=None, axis=0, initial=None):
    """d segment_reduce / d data, as ATen's CPU kernel computes it."""
    axis = _check(data.shape, data.dtype, lengths, None, offsets, axis, "_segment_reduce_backward")
    how = _reduction(reduce)
    ct = _compute_dtype(grad.dtype)
    seg, seg_len = _segments(data.shape, lengths, offsets, axis)
    n_seg = seg_len.shape[-1]
    x = _as_bli(data, axis).astype(ct)
    if n_seg == 0:
        return jnp.zeros(data.shape, grad.dtype)
    rows = jnp.arange(x.shape[0])[:, None]
    safe_seg = jnp.minimum(seg, n_seg - 1)
    inside = (seg < n_seg)[..., None]

    def per_element(v):  # (B, S, I) -> the value of each element's segment, (B, L, I)
        return _as_bli(v, axis).astype(ct)[rows, safe_seg]

    g = per_element(grad)
    count = jnp.take_along_axis(seg_len, safe_seg, axis=1)[..., None].astype(ct)
    if how == "sum":
        gi = g
    elif how == "mean":
        gi = g / jnp.maximum(count, 1)
    elif how in ("max", "min"):
        hit = jnp.isnan(x) | (x == per_element(output))
        ties = _scatter(hit.astype(ct), seg, n_seg, "add", 0)[rows, safe_seg]
        gi = jnp.where(hit, g, 0)
        gi = jnp.where((ties >= 2) & (gi > 0), gi / jnp.maximum(ties, 1), gi)
    else:  # prod
        gi = _prod_backward(x, g, per_element(output), seg, n_seg, rows, safe_seg, initial)
    return jnp.where(inside, gi, 0).reshape(data.shape).astype(grad.dtype)


def _prod_backward(x, g, out, seg, n_seg, rows, safe_seg, initial):
    """grad * output / x, or grad * (product of the segment's other elements) where x is 0 or NaN."""
    zero_or_nan = jnp.isnan(x) | (x == 0)
    safe_prod = _scatter(jnp.where(zero_or_nan, 1, x), seg, n_seg, "multiply", 1)[rows, safe_seg]
    n_special = _scatter(zero_or_nan.astype(jnp.int32), seg, n_seg, "add", 0)[rows, safe_seg]
    n_nan = _scatter(jnp.isnan(x).astype(jnp.int32), seg, n_seg, "add", 0)[rows, safe_seg]
    # the other zero/NaN elements of the segment: NaN if one of them is NaN, else 0 (none: 1)
    other_nan = n_nan - jnp.isnan(x) > 0
    others = jnp.where(n_special > 1, jnp.where(other_nan, jnp.nan, 0), 1).astype(x.dtype)
    exclusive = (1 if initial is None else float(initial)) * safe_prod * others
    return jnp.where(zero_or_nan, g * exclusive, (g * out) / jnp.where(zero_or_nan, 1, x))
