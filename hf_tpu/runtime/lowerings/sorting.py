"""Sorting, selection, searching and histograms; ops whose output size depends on the data.

PyTorch conventions kept here: sorts are stable, NaN sorts as the largest value (last ascending, first
descending) and -0.0 equals 0.0; topk/kthvalue/median/mode follow the CPU kernels' value semantics.

Data-dependent shapes (nonzero, masked_select, unique*, bincount) are `kind="host"`: each computes a
padded result plus its true length in one jitted call on the device, reads back only the length (one
scalar sync, as on CUDA), then slices. Inputs never make a round trip through host memory.
"""

from __future__ import annotations

import math
from functools import cache

import jax
import jax.numpy as jnp
import torch

from hf_tpu.runtime.lowerings.table import lowers
from hf_tpu.runtime.tensors.tensor import to_jax, wrap


# -- sort ---------------------------------------------------------------------------------------
def _sort_last(x, descending: bool):
    """Stable sort along the last axis -> (values, int64 indices).

    Descending = reverse, stable ascending sort, reverse back: equal elements keep their original
    order and NaN (sorted last by XLA) comes first, exactly PyTorch's order.
    """
    n = x.shape[-1]
    iota = jax.lax.broadcasted_iota(jnp.int64, x.shape, x.ndim - 1)
    if not descending:
        return tuple(jax.lax.sort((x, iota), dimension=x.ndim - 1, num_keys=1, is_stable=True))
    values, idx = jax.lax.sort((jnp.flip(x, -1), iota), dimension=x.ndim - 1, num_keys=1, is_stable=True)
    return jnp.flip(values, -1), jnp.flip(n - 1 - idx, -1)


def _along(x, dim: int, fn):
    """Apply `fn` (working on the last axis, returning arrays) along `dim` of x."""
    if x.ndim == 0:
        out = fn(x.reshape(1))
        return tuple(o.reshape(()) for o in out)
    axis = dim % x.ndim
    out = fn(jnp.moveaxis(x, axis, -1))
    return tuple(jnp.moveaxis(o, -1, axis) for o in out)


@lowers("aten::sort.default")
def sort(x, dim=-1, descending=False):
    return _along(x, dim, lambda v: _sort_last(v, descending))


@lowers("aten::sort.stable")
def sort_stable(x, stable=None, dim=-1, descending=False):
    return sort(x, dim, descending)


@lowers("aten::topk")
def topk(x, k, dim=-1, largest=True, sorted=True):  # noqa: A002 - schema name
    """The k largest (smallest) along dim, always returned sorted; ties keep the lower index first."""

    def pick(v):
        if largest and v.dtype != jnp.bool_:
            values, idx = jax.lax.top_k(v, k)  # NaN first, ties lower index first, like a stable sort
            return values, idx.astype(jnp.int64)
        values, idx = _sort_last(v, descending=largest)
        return values[..., :k], idx[..., :k]

    return _along(x, dim, pick)


def _keep(out, x, dim, keepdim):
    if keepdim or x.ndim == 0:
        return out
    return tuple(jnp.squeeze(o, axis=dim % x.ndim) for o in out)


@lowers("aten::kthvalue")
def kthvalue(x, k, dim=-1, keepdim=False):
    out = _along(x, dim, lambda v: tuple(o[..., k - 1 : k] for o in _sort_last(v, False)))
    return _keep(out, x, dim, keepdim)


# -- median / mode ------------------------------------------------------------------------------
def _median_last(v, ignore_nan: bool):
    """Lower median along the last axis (keeps it, size 1), with PyTorch's NaN rules.

    median: any NaN makes the result NaN, indexed at the first NaN. nanmedian: NaNs are skipped;
    an all-NaN slice gives NaN at index 0.
    """
    values, idx = _sort_last(v, False)
    n = v.shape[-1]
    nan_count = jnp.sum(jnp.isnan(v), axis=-1, keepdims=True) if jnp.issubdtype(v.dtype, jnp.floating) else 0
    valid = n - nan_count
    if ignore_nan:
        pos = jnp.maximum((valid - 1) // 2, 0)
    else:
        pos = jnp.where(nan_count > 0, valid, (n - 1) // 2)
    pos = jnp.broadcast_to(jnp.asarray(pos, jnp.int64), v.shape[:-1] + (1,))
    return jnp.take_along_axis(values, pos, -1), jnp.take_along_axis(idx, pos, -1)


@lowers("aten::median.dim")
def median_dim(x, dim, keepdim=False):
    return _keep(_along(x, dim, lambda v: _median_last(v, False)), x, dim, keepdim)


@lowers("aten::nanmedian.dim")
def nanmedian_dim(x, dim, keepdim=False):
    return _keep(_along(x, dim, lambda v: _median_last(v, True)), x, dim, keepdim)


@lowers("aten::median.default")
def median(x):
    if x.size == 0:
        return jnp.full((), jnp.nan, x.dtype)
    return _median_last(x.reshape(-1), False)[0].reshape(())


@lowers("aten::nanmedian.default")
def nanmedian(x):
    if x.size == 0:
        return jnp.full((), jnp.nan, x.dtype)
    return _median_last(x.reshape(-1), True)[0].reshape(())


def _mode_last(v):
    """Most frequent value along the last axis; ties go to the smallest value, index = its last occurrence."""
    values, idx = _sort_last(v, False)
    n = v.shape[-1]
    pos = jax.lax.broadcasted_iota(jnp.int64, v.shape, v.ndim - 1)
    starts = jnp.concatenate(
        [jnp.ones(v.shape[:-1] + (1,), jnp.bool_), values[..., 1:] != values[..., :-1]], axis=-1
    )
    run_start = jax.lax.cummax(jnp.where(starts, pos, 0), axis=v.ndim - 1)
    run_length = pos - run_start + 1  # grows along a run; its max is reached first at the smallest value
    best = jnp.argmax(run_length, axis=-1, keepdims=True) if n else jnp.zeros(v.shape[:-1] + (1,), jnp.int64)
    return jnp.take_along_axis(values, best, -1), jnp.take_along_axis(idx, best, -1)


@lowers("aten::mode")
def mode(x, dim=-1, keepdim=False):
    return _keep(_along(x, dim, _mode_last), x, dim, keepdim)


# -- searching ----------------------------------------------------------------------------------
def _searchsorted(seq, values, side: str, sorter=None):
    if sorter is not None:
        seq = jnp.take_along_axis(seq, sorter.astype(jnp.int64), -1)
    values = jnp.asarray(values)
    if seq.ndim <= 1:
        return jnp.searchsorted(seq.reshape(-1), values, side=side)
    lead = seq.shape[:-1]
    flat_seq = seq.reshape((math.prod(lead), seq.shape[-1]))
    flat_values = values.reshape((math.prod(lead), values.shape[-1]))
    out = jax.vmap(lambda s, v: jnp.searchsorted(s, v, side=side))(flat_seq, flat_values)
    return out.reshape(lead + values.shape[-1:])


@lowers("aten::searchsorted.Tensor", "aten::searchsorted.Scalar")
def searchsorted(sorted_sequence, x, out_int32=False, right=False, side=None, sorter=None):
    side = side or ("right" if right else "left")
    return _searchsorted(sorted_sequence, x, side, sorter)


@lowers("aten::bucketize.Tensor")
def bucketize(x, boundaries, out_int32=False, right=False):
    # right=False: boundaries[i-1] < x <= boundaries[i], i.e. searchsorted's left side
    return _searchsorted(boundaries, x, "right" if right else "left")


@lowers("aten::bucketize.Scalar")
def bucketize_scalar(x, boundaries, out_int32=False, right=False):
    return bucketize(x, boundaries, out_int32, right)


# -- histograms ---------------------------------------------------------------------------------
def _rounded_like(dtype):
    """Round a float32 result to `dtype`'s precision: emulates one bf16/f16 arithmetic op of CPU's
    kernel while computing in float32 (reduce_precision is not undone by XLA's excess-precision rules)."""
    if dtype not in (jnp.bfloat16, jnp.float16):
        return lambda v: v
    info = jnp.finfo(dtype)
    return lambda v: jax.lax.reduce_precision(v, exponent_bits=info.nexp, mantissa_bits=info.nmant)


@lowers("aten::histc")
def histc(x, bins=100, min=0, max=0):  # noqa: A002 - schema names
    """Equal-width histogram over [min, max] (the data's range when min == max), any dtype.

    Bin choice follows PyTorch's CPU kernel (linear interpolation, no correction against the edges):
    bin = trunc((v - min) * bins / (max - min)), each step rounded in the input dtype (bf16 included);
    the top edge belongs to the last bin; values outside and NaN are dropped. Integer inputs (MoE
    expert counts, which CUDA accepts) are binned the same way in float32.
    """
    ct = x.dtype if x.dtype in (jnp.float32, jnp.float64) else jnp.float32
    rnd = _rounded_like(x.dtype)
    v = x.reshape(-1).astype(ct)
    lo = rnd(jnp.asarray(min, ct))
    hi = rnd(jnp.asarray(max, ct))
    if v.size:
        same = lo == hi
        lo = jnp.where(same, jnp.min(v), lo)
        hi = jnp.where(same, jnp.max(v), hi)
    same = lo == hi
    lo = rnd(jnp.where(same, lo - 1, lo))
    hi = rnd(jnp.where(same, hi + 1, hi))
    # XLA turns `a / broadcast(b)` into `a * (1 / b)`, one ulp off: enough to move a value across an
    # edge once truncated; the barrier keeps a true division, as CPU does
    width = jax.lax.optimization_barrier(jnp.broadcast_to(rnd(hi - lo), v.shape))
    pos = rnd(rnd(rnd(v - lo) * bins) / width).astype(jnp.int64)
    pos = jnp.where(pos == bins, bins - 1, pos)
    inside = (v >= lo) & (v <= hi)
    counts = jnp.zeros((bins,), jnp.int64).at[jnp.where(inside, pos, bins)].add(1, mode="drop")
    return counts


@lowers("aten::nonzero_static")
def nonzero_static(x, size, fill_value=-1):
    """nonzero padded (or truncated) to a static `size` rows: jittable, no sync."""
    if x.ndim == 0:
        return jnp.zeros((size, 0), jnp.int64)
    (idx,) = jnp.nonzero(x.reshape(-1), size=size, fill_value=0)
    coords = jnp.stack(jnp.unravel_index(idx, x.shape), axis=-1).astype(jnp.int64)
    valid = jnp.arange(size) < jnp.count_nonzero(x)
    return jnp.where(valid[:, None], coords, fill_value)


# -- data-dependent output sizes (host kernels: padded on the device, then sliced) ---------------
def _jit(fn):
    return cache(lambda *static: jax.jit(lambda *a: fn(*a, *static)))


def _nonzero_padded(x):
    n = x.size
    (idx,) = jnp.nonzero(x.reshape(-1), size=n, fill_value=0)
    coords = jnp.stack(jnp.unravel_index(idx, x.shape), axis=-1).astype(jnp.int64)
    return coords, jnp.count_nonzero(x)


_nonzero_jit = _jit(_nonzero_padded)


@lowers("aten::nonzero", kind="host")
def nonzero(self: torch.Tensor) -> torch.Tensor:
    x = to_jax(self)
    if x.ndim == 0:
        return wrap(jnp.zeros((int(x != 0), 0), jnp.int64), torch.int64)
    coords, count = _nonzero_jit()(x)
    return wrap(coords[: int(count)], torch.int64)


def _into(out: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    """out= for host ops (not derived automatically): resize `out`, then copy into it."""
    if out.dtype != result.dtype:
        raise RuntimeError(f"expected out= dtype {result.dtype}, got {out.dtype}")
    out.resize_(result.shape)
    return out.copy_(result)


@lowers("aten::nonzero.out", kind="host")
def nonzero_out(self: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    return _into(out, nonzero(self))


def _masked_select_padded(x, mask):
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    flat = jnp.broadcast_to(x, shape).reshape(-1)
    m = jnp.broadcast_to(mask, shape).reshape(-1)
    (idx,) = jnp.nonzero(m, size=flat.size, fill_value=0)
    return flat[idx], jnp.count_nonzero(m)


_masked_select_jit = _jit(_masked_select_padded)


@lowers("aten::masked_select", kind="host")
def masked_select(self: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    values, count = _masked_select_jit()(to_jax(self), to_jax(mask))
    return wrap(values[: int(count)], self.dtype)


@lowers("aten::masked_select.out", kind="host")
def masked_select_out(self: torch.Tensor, mask: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    return _into(out, masked_select(self, mask))


def _bincount_range(x):
    return jnp.stack([jnp.min(x), jnp.max(x)])


def _bincount_fixed(x, weights, length):
    w = jnp.ones(x.shape, jnp.int64) if weights is None else weights
    return jnp.zeros((length,), w.dtype).at[x].add(w, mode="drop")


_bincount_range_jit = _jit(_bincount_range)
_bincount_jit = _jit(_bincount_fixed)


@lowers("aten::bincount", kind="host")
def bincount(self: torch.Tensor, weights: torch.Tensor | None = None, minlength: int = 0) -> torch.Tensor:
    """Counts of each value in a 1-d non-negative integer tensor; the length is max(x) + 1 (a sync)."""
    if self.dim() != 1 or self.dtype.is_floating_point or self.dtype.is_complex or self.dtype == torch.bool:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if weights is not None and weights.shape != self.shape:
        raise RuntimeError("weights should be 1-d and have the same length as input")
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    # PyTorch: float32 weights keep their dtype, any other weights count in float64
    out_dtype = (
        torch.int64
        if weights is None
        else (torch.float32 if weights.dtype == torch.float32 else torch.float64)
    )
    x = to_jax(self)
    length = minlength
    if self.numel():
        lo, hi = (int(v) for v in _bincount_range_jit()(x))
        if lo < 0:
            raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
        length = max(length, hi + 1)
    w = None
    if weights is not None:
        w = to_jax(weights).astype(jnp.float32 if out_dtype == torch.float32 else jnp.float64)
    return wrap(_bincount_jit(length)(x, w), out_dtype)


def _runs(sorted_keys_differ, n):
    """Run ids of consecutive equal elements given `differ[i]` = element i differs from i-1."""
    starts = jnp.concatenate([jnp.ones((min(n, 1),), jnp.bool_), sorted_keys_differ])
    run = jnp.cumsum(starts.astype(jnp.int64)) - 1
    return run, (run[-1] + 1 if n else jnp.zeros((), jnp.int64))


def _unique_rows(rows, sort_first: bool):
    """Unique rows of a 2-d (n, m) array: (padded unique rows, inverse, padded counts, number unique).

    With `sort_first`, rows are sorted lexicographically (stable) first, so the result is sorted.
    """
    n, m = rows.shape
    order = jnp.arange(n, dtype=jnp.int64)
    if sort_first and n and m:
        keys = tuple(rows[:, j] for j in range(m))
        *_, order = jax.lax.sort((*keys, order), num_keys=m, is_stable=True)
    s = rows[order]
    differ = jnp.any(s[1:] != s[:-1], axis=1) if m else jnp.zeros((max(n - 1, 0),), jnp.bool_)
    run, count = _runs(differ, n)
    uniq = jnp.zeros_like(rows).at[run].set(s)
    counts = jnp.zeros((n,), jnp.int64).at[run].add(1)
    inverse = jnp.zeros((n,), jnp.int64).at[order].set(run)
    return uniq, inverse, counts, count


def _unique_flat(x, sort_first):
    uniq, inverse, counts, count = _unique_rows(x.reshape(-1, 1), sort_first)
    return uniq[:, 0], inverse.reshape(x.shape), counts, count


def _unique_along(x, dim, sort_first):
    moved = jnp.moveaxis(x, dim, 0)
    rows = moved.reshape(moved.shape[0], math.prod(moved.shape[1:]))
    uniq, inverse, counts, count = _unique_rows(rows, sort_first)
    return jnp.moveaxis(uniq.reshape(moved.shape), 0, dim), inverse, counts, count


_unique_flat_jit = _jit(_unique_flat)
_unique_along_jit = _jit(_unique_along)


def _empty_long():
    return wrap(jnp.zeros((0,), jnp.int64), torch.int64)


def _unique(self, sort_first, return_inverse, return_counts, dim=None, always=False):
    """Shared host body of the unique family; unrequested outputs are empty like on CPU."""
    x = to_jax(self)
    if dim is None:
        uniq, inverse, counts, count = _unique_flat_jit(sort_first)(x)
        count = int(count)
        values = wrap(uniq[:count], self.dtype)
    else:
        dim = dim % max(x.ndim, 1)
        uniq, inverse, counts, count = _unique_along_jit(dim, sort_first)(x)
        count = int(count)
        values = wrap(jax.lax.slice_in_dim(uniq, 0, count, axis=dim), self.dtype)
    inv = wrap(inverse, torch.int64) if (return_inverse or always) else _empty_long()
    cnt = wrap(counts[:count], torch.int64) if (return_counts or always) else _empty_long()
    return values, inv, cnt


@lowers("aten::_unique2", kind="host")
def unique2(self, sorted=True, return_inverse=False, return_counts=False):  # noqa: A002
    # sorted=False may return any order; sorting is what CPU PyTorch does too
    return _unique(self, True, return_inverse, return_counts)


@lowers("aten::_unique", kind="host")
def unique(self, sorted=True, return_inverse=False):  # noqa: A002
    values, inv, _ = _unique(self, True, return_inverse, False)
    return values, inv


@lowers("aten::unique_consecutive", kind="host")
def unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
    return _unique(self, False, return_inverse, return_counts, dim)


@lowers("aten::unique_dim", kind="host")
def unique_dim(self, dim, sorted=True, return_inverse=False, return_counts=False):  # noqa: A002
    return _unique(self, True, return_inverse, return_counts, dim, always=True)


@lowers("aten::unique_dim_consecutive", kind="host")
def unique_dim_consecutive(self, dim, return_inverse=False, return_counts=False):
    return _unique(self, False, return_inverse, return_counts, dim, always=True)
