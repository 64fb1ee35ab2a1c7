"""Histograms with bin edges: `torch.histogram` (aten::histogram.bin_ct / .bins_tensor) and
`torch.histogramdd` (aten::_histogramdd_bin_edges, _histogramdd_from_bin_cts,
_histogramdd_from_bin_tensors). `torch.histc` lives in sorting.py.

Semantics follow ATen's CPU kernels (Histogram.cpp, HistogramKernel.cpp):
- With a bin count, the outer edges are `range` or the data's min/max per dim (0 and 1 for empty
  input); equal edges widen by 0.5 each side; the edges are `linspace(lo, hi, bins + 1)` in the input
  dtype (the `linspace` lowering, which reproduces CPU's values). An element's bin comes from linear
  interpolation, then a search among the neighbouring edges, so bins agree with the returned edges.
- With edge tensors, the bin is a binary search (upper bound - 1) in the edges.
- Bins are half-open [e_i, e_i+1) except the last, which includes its right edge; elements outside
  [first, last] edge and NaN are dropped; `weight` (same dtype) replaces the count of 1.
- `density=True` divides by the total, then by each bin's width in every dim (0/0 = NaN when nothing
  was counted, as on CPU).
All of it has static shapes, so it is jitted. What needs values on the host is only PyTorch's error
for a non-finite data range (`range=None` with inf/NaN data): in eager mode the bin-count ops read the
per-dim min/max back (one small sync, as CPU does), check them, and pass them to the jitted body.
Compiled graphs take the min/max inside the graph instead (no check). Half-precision counts
accumulate in float32 (CPU adds in the half type, which stops counting at 256 in bf16).
"""

from __future__ import annotations

import math
from functools import cache

import jax
import jax.numpy as jnp
import numpy as np
import torch

from hf_tpu.runtime.buffers import platform
from hf_tpu.runtime.buffers.dtypes import to_torch_dtype
from hf_tpu.runtime.lowerings.factories import linspace
from hf_tpu.runtime.lowerings.table import lowers
from hf_tpu.runtime.tensors.tensor import to_jax, wrap

_HALF = (jnp.bfloat16, jnp.float16)


# -- checks (ATen's messages) ---------------------------------------------------------------------------
def _check_input(x, what: str = "torch.histogram") -> None:
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise RuntimeError(f"{what}: input must be a floating-point tensor, got {x.dtype}")


def _check_bin_cts(bins) -> None:
    for dim, n in enumerate(bins):
        if n <= 0:
            raise RuntimeError(f"torch.histogram(): bins must be > 0, but got {n} for dimension {dim}")


def _check_weight(x, weight) -> None:
    """`weight` must have x's dtype and shape without x's innermost dim (histogram: x is (numel, 1))."""
    if weight is None:
        return
    if weight.dtype != x.dtype:
        raise RuntimeError(
            "torch.histogramdd: if weight tensor is provided, input tensor and weight tensor should have the "
            f"same dtype, but got input({x.dtype}), and weight({weight.dtype})"
        )
    if tuple(weight.shape or (1,)) != tuple(x.shape[:-1]):
        raise RuntimeError(
            "torch.histogramdd: if weight tensor is provided it should have the same shape as the input "
            f"tensor excluding its innermost dimension, but got input with shape {list(x.shape)} and weight "
            f"with shape {list(weight.shape)}"
        )


def _check_bin_count_per_dim(bins, n: int) -> None:
    if len(bins) != n:
        raise RuntimeError(
            f"torch.histogramdd: expected {n} sequences of bin edges for a {n}-dimensional histogram but got "
            f"{len(bins)}"
        )


def _check_edges(x2d, edges) -> None:
    _check_bin_count_per_dim(edges, x2d.shape[-1])
    for dim, e in enumerate(edges):
        if e.dtype != x2d.dtype:
            raise RuntimeError(
                "torch.histogramdd: input tensor and bins tensors should have the same dtype, but got input "
                f"with dtype {x2d.dtype} and bins for dimension {dim} with dtype {e.dtype}"
            )
        if e.ndim != 1:
            raise RuntimeError(
                "torch.histogramdd: bins tensor should have one dimension, but got "
                f"{e.ndim} dimensions in the bins tensor for dimension {dim}"
            )
        if e.shape[0] == 0:
            raise RuntimeError(
                "torch.histogramdd: bins tensor should have at least 1 element, but got 0 elements in the bins "
                f"tensor for dimension {dim}"
            )
        if e.shape[0] < 2:
            raise RuntimeError(
                f"torch.histogram(): bins must be > 0, but got {e.shape[0] - 1} for dimension {dim}"
            )


def _as_2d(x, what: str):
    """histogramdd's (M, N) view of the input: N = the innermost dim."""
    if x.ndim < 2:
        raise RuntimeError(f"{what}: input tensor should have at least 2 dimensions, but got {x.ndim}")
    return x.reshape(math.prod(x.shape[:-1]), x.shape[-1])


def _ranges_from_argument(rng, n: int) -> list[tuple[float, float]] | None:
    if rng is None:
        return None
    if len(rng) != 2 * n:
        raise RuntimeError(
            f"torch.histogramdd: for a {n}-dimensional histogram range should have {2 * n} elements, but got "
            f"{len(rng)}"
        )
    return [(float(rng[2 * d]), float(rng[2 * d + 1])) for d in range(n)]


def _outer_edges(bounds: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """ATen's select_outer_bin_edges on host values: finite, ordered, widened when equal."""
    lows, highs = [], []
    for dim, (lo, hi) in enumerate(bounds):
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise RuntimeError(
                f"torch.histogramdd: dimension {dim}'s range [{_fmt(lo)}, {_fmt(hi)}] is not finite"
            )
        if lo > hi:
            raise RuntimeError(
                "torch.histogramdd: min should not exceed max, but got "
                f"min {_fmt(lo)} max {_fmt(hi)} for dimension {dim}"
            )
        if lo == hi:
            lo, hi = lo - 0.5, hi + 0.5
        lows.append(lo)
        highs.append(hi)
    return lows, highs


def _fmt(v: float) -> str:
    return f"{v:g}"


# -- the jitted body ------------------------------------------------------------------------------------
def _edges(lows, highs, bins, dtype):
    """linspace(lo_d, hi_d, bins_d + 1) per dim, in the input dtype, as CPU computes it."""
    tdt = to_torch_dtype(dtype)
    return [linspace(lows[d], highs[d], bins[d] + 1, dtype=tdt).astype(dtype) for d in range(len(bins))]


def _bin_linear(v, e):
    """Linear interpolation, then upper bound among the (at most 3) neighbouring edges."""
    n_edges = e.shape[0]
    lo, hi = e[0], e[-1]
    ct = jnp.float32 if e.dtype in _HALF else e.dtype
    guess = jnp.trunc((v.astype(ct) - lo.astype(ct)) * (n_edges - 1) / (hi - lo).astype(ct))
    guess = jnp.clip(jnp.nan_to_num(guess), 0, n_edges - 1).astype(jnp.int64)
    pos_min = jnp.maximum(guess - 1, 0)
    pos_max = jnp.minimum(guess + 2, n_edges)
    count = jnp.zeros_like(guess)
    for k in range(3):
        at = pos_min + k
        count = count + ((at < pos_max) & (e[jnp.minimum(at, n_edges - 1)] <= v))
    return pos_min + count - 1


def _bin_search(v, e):
    return jnp.searchsorted(e, v, side="right").astype(jnp.int64) - 1


def _histogramdd(x2d, weight, edges, linear: bool, density: bool):
    """(M, N) input -> N-dim histogram over `edges` (one 1-d array of bins + 1 edges per dim)."""
    bins = tuple(e.shape[0] - 1 for e in edges)
    acc = jnp.float32 if x2d.dtype in _HALF else x2d.dtype
    valid = jnp.ones(x2d.shape[:1], bool)
    flat = jnp.zeros(x2d.shape[:1], jnp.int64)
    for d, e in enumerate(edges):
        v = x2d[:, d]
        valid = valid & (v >= e[0]) & (v <= e[-1])  # NaN compares false: dropped
        pos = (_bin_linear if linear else _bin_search)(v, e)
        pos = jnp.clip(jnp.where(pos == bins[d], bins[d] - 1, pos), 0, max(bins[d] - 1, 0))
        flat = flat * bins[d] + pos
    size = math.prod(bins)
    w = jnp.ones(x2d.shape[:1], acc) if weight is None else weight.reshape(-1).astype(acc)
    hist = jnp.zeros((size,), acc).at[jnp.where(valid, flat, size)].add(w, mode="drop").reshape(bins)
    if density:
        hist = _normalize(hist.astype(x2d.dtype).astype(acc), edges, acc)
    return hist.astype(x2d.dtype)


def _true_div(a, b):
    """a / b rounded as one IEEE division, as CPU does: XLA's simplifier would otherwise rewrite
    a / broadcast(b) into a * (1 / b) and (a / b) / c into a / (b * c), each one ulp off CPU."""
    barrier = jax.lax.optimization_barrier
    return barrier(a / barrier(jnp.broadcast_to(b, a.shape)))


def _normalize(hist, edges, acc):
    """Divide by the total, then by each bin's width along every dim."""
    hist = _true_div(hist, jnp.sum(hist))
    for d, e in enumerate(edges):
        shape = [1] * len(edges)
        shape[d] = e.shape[0] - 1
        hist = _true_div(hist, jnp.diff(e).astype(acc).reshape(shape))
    return hist


@cache
def _from_bounds_jit(bins: tuple, density: bool):
    def run(x2d, weight, lows, highs):
        edges = _edges(lows, highs, bins, x2d.dtype)
        return _histogramdd(x2d, weight, edges, True, density), edges

    return jax.jit(run)


def _graph_bounds(x2d, rng):
    """The outer edges inside a traced graph: `range`, or the data's min/max (no finiteness check)."""
    n = x2d.shape[-1]
    ranges = _ranges_from_argument(rng, n)
    if ranges is not None:
        lows, highs = _outer_edges(ranges)
        return jnp.asarray(lows), jnp.asarray(highs)
    if x2d.shape[0] == 0:
        return jnp.zeros((n,)), jnp.ones((n,))
    lo = jnp.min(x2d, axis=0).astype(jnp.float32 if x2d.dtype in _HALF else x2d.dtype)
    hi = jnp.max(x2d, axis=0).astype(lo.dtype)
    same = lo == hi
    return jnp.where(same, lo - 0.5, lo), jnp.where(same, hi + 0.5, hi)


# -- eager (host) entry points: bounds read back and checked, then the jitted body ---------------------
def _host_bounds(x2d, rng) -> tuple[list[float], list[float]]:
    n = x2d.shape[-1]
    ranges = _ranges_from_argument(rng, n)
    if ranges is None:
        if x2d.shape[0] == 0:
            ranges = [(0.0, 1.0)] * n
        else:
            lo, hi = np.asarray(_extrema(x2d)).astype(np.float64)
            ranges = list(zip(lo.tolist(), hi.tolist()))
    return _outer_edges(ranges)


@jax.jit
def _extrema(x2d):
    return jnp.stack([jnp.min(x2d, axis=0), jnp.max(x2d, axis=0)])


def _bounds_arrays(lows, highs):
    """Host edges as device arrays (float64 where the platform has it; linspace casts to the dtype)."""
    wide = np.float64 if platform.supports_float64() else np.float32
    return jnp.asarray(np.asarray(lows, wide)), jnp.asarray(np.asarray(highs, wide))


def _bin_ct_eager(self: torch.Tensor, bins: tuple, rng, weight, density, what: str):
    """(hist, edges) jax arrays for an int-bins histogram of tpu tensor `self`.

    `what` is "torch.histogram" (any shape, flattened to (numel, 1), weight of numel elements) or
    "torch.histogramdd" (the innermost dim is N, weight of the other dims' shape)."""
    x = to_jax(self)
    _check_input(x, what)
    flat = what == "torch.histogram"
    x2d = x.reshape(x.size, 1) if flat else _as_2d(x, what)
    _check_bin_count_per_dim(bins, x2d.shape[-1])
    bins = tuple(int(b) for b in bins)
    _check_bin_cts(bins)
    lows, highs = _host_bounds(x2d, rng)
    w = None
    if weight is not None:
        w = to_jax(weight)
        _check_weight(x2d if flat else x, w.reshape(w.size) if flat else w)
    return _from_bounds_jit(bins, bool(density))(x2d, w, *_bounds_arrays(lows, highs))


@lowers("aten::histogram.bin_ct", kind="host")
def histogram_bin_ct(self, bins=100, *, range=None, weight=None, density=False):  # noqa: A002
    hist, edges = _bin_ct_eager(self, (bins,), range, weight, density, "torch.histogram")
    return wrap(hist, self.dtype), wrap(edges[0], self.dtype)


@lowers("aten::histogram.bin_ct_out", kind="host")
def histogram_bin_ct_out(self, bins=100, *, range=None, weight=None, density=False, hist, bin_edges):  # noqa: A002
    h, e = histogram_bin_ct(self, bins, range=range, weight=weight, density=density)
    return _into(hist, h), _into(bin_edges, e)


def _into(out: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    if out.dtype != result.dtype:
        raise RuntimeError(
            f"torch.histogram: input tensor and output tensor should have the same dtype, but got input "
            f"{result.dtype} and output {out.dtype}"
        )
    if tuple(out.shape) != tuple(result.shape):
        out.resize_(result.shape)
    return out.copy_(result)


@lowers("aten::_histogramdd_bin_edges", kind="host")
def histogramdd_bin_edges(self, bins, *, range=None, weight=None, density=False):  # noqa: A002
    x = to_jax(self)
    _check_input(x, "torch.histogramdd")
    x2d = _as_2d(x, "torch.histogramdd")
    _check_bin_count_per_dim(bins, x2d.shape[-1])
    _check_bin_cts(bins)
    lows, highs = _host_bounds(x2d, range)
    edges = _edges_jit(tuple(int(b) for b in bins), x.dtype)(*_bounds_arrays(lows, highs))
    return [wrap(e, self.dtype) for e in edges]


@cache
def _edges_jit(bins: tuple, dtype):
    return jax.jit(lambda lows, highs: _edges(lows, highs, bins, dtype))


@lowers("aten::_histogramdd_from_bin_cts", kind="host")
def histogramdd_from_bin_cts(self, bins, *, range=None, weight=None, density=False):  # noqa: A002
    hist, _ = _bin_ct_eager(self, tuple(bins), range, weight, density, "torch.histogramdd")
    return wrap(hist, self.dtype)


# -- edge tensors: nothing to check by value, plain jitted lowerings -----------------------------------
@lowers("aten::histogram.bins_tensor")
def histogram_bins_tensor(x, bins, weight=None, density=False):
    _check_input(x)
    x2d = x.reshape(x.size, 1)
    _check_edges(x2d, [bins])
    if weight is not None:
        _check_weight(x2d, weight.reshape(weight.size))
    return _histogramdd(x2d, weight, [bins], False, density), bins


@lowers("aten::_histogramdd_from_bin_tensors")
def histogramdd_from_bin_tensors(x, bins, weight=None, density=False):
    _check_input(x, "torch.histogramdd")
    x2d = _as_2d(x, "torch.histogramdd")
    _check_edges(x2d, bins)
    _check_weight(x, weight)
    return _histogramdd(x2d, weight, list(bins), False, density)


# -- the bin-count ops inside compiled graphs ------------------------------------------------------------
def _bin_ct_graph(x2d, bins, rng, weight, density):
    lows, highs = _graph_bounds(x2d, rng)
    edges = _edges(lows, highs, bins, x2d.dtype)
    return _histogramdd(x2d, weight, edges, True, density), edges


@lowers("aten::histogram.bin_ct", graph=True)
def histogram_bin_ct_graph(x, bins=100, range=None, weight=None, density=False):  # noqa: A002
    _check_input(x)
    _check_bin_cts((bins,))
    x2d = x.reshape(x.size, 1)
    if weight is not None:
        _check_weight(x2d, weight.reshape(weight.size))
    hist, edges = _bin_ct_graph(x2d, (bins,), range, weight, density)
    return hist, edges[0]


@lowers("aten::_histogramdd_bin_edges", graph=True)
def histogramdd_bin_edges_graph(x, bins, range=None, weight=None, density=False):  # noqa: A002
    x2d = _as_2d(x, "torch.histogramdd")
    _check_bin_count_per_dim(bins, x2d.shape[-1])
    _check_bin_cts(bins)
    lows, highs = _graph_bounds(x2d, range)
    return _edges(lows, highs, tuple(bins), x.dtype)


@lowers("aten::_histogramdd_from_bin_cts", graph=True)
def histogramdd_from_bin_cts_graph(x, bins, range=None, weight=None, density=False):  # noqa: A002
    x2d = _as_2d(x, "torch.histogramdd")
    _check_bin_count_per_dim(bins, x2d.shape[-1])
    _check_bin_cts(bins)
    _check_weight(x, weight)
    return _bin_ct_graph(x2d, tuple(bins), range, weight, density)[0]
