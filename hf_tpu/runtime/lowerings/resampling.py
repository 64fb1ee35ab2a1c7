"""Resampling: upsample/interpolate (nearest, linear family, bicubic, area) and grid sampling.

Same conventions as `nn.py`: bf16/fp16 compute in float32; everything that depends only on shapes
(source indices, interpolation weights) is computed with numpy while tracing; backward passes are
the VJPs of the forward functions.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np

from hf_tpu.runtime.lowerings.nn import _apply_per_axis, _compute_dtype, _pullback, _upcast
from hf_tpu.runtime.lowerings.table import lowers


# -- resampling (upsample / interpolate) ------------------------------------------------------------
def _scale(in_size, out_size, align_corners, scale, dtype):
    """PyTorch's area_pixel_compute_scale: the source step per output pixel."""
    if align_corners:
        return dtype((in_size - 1) / (out_size - 1)) if out_size > 1 else dtype(0)
    if scale is not None and scale > 0:
        return dtype(1.0 / scale)
    return dtype(in_size / out_size)


def _nearest_index(in_size, out_size, scale, exact):
    """Source index per output pixel, computed in float32 like PyTorch's nearest kernels."""
    s = _scale(in_size, out_size, False, scale, np.float32)
    dst = np.arange(out_size, dtype=np.float32)
    src = np.floor((dst + np.float32(0.5)) * s) if exact else np.floor(dst * s)
    return np.minimum(src.astype(np.int64), in_size - 1)


def _linear_matrix(in_size, out_size, align_corners, scale, dtype):
    """(out, in) interpolation weights of PyTorch's (bi/tri)linear upsampling along one axis."""
    m = np.zeros((out_size, in_size), np.float64)
    rows = np.arange(out_size)
    if in_size == out_size:
        m[rows, rows] = 1
        return m
    s = _scale(in_size, out_size, align_corners, scale, dtype)
    dst = np.arange(out_size).astype(dtype)
    src = s * dst if align_corners else np.maximum(s * (dst + dtype(0.5)) - dtype(0.5), 0)
    i0 = np.minimum(np.floor(src).astype(np.int64), in_size - 1)
    lam = np.clip(src - i0, 0, 1)
    i1 = np.where(i0 < in_size - 1, i0 + 1, i0)
    np.add.at(m, (rows, i0), 1 - lam)
    np.add.at(m, (rows, i1), lam)
    return m


def _cubic(x, a):
    """Keys' cubic convolution kernel."""
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x <= 1, near, np.where(x < 2, far, 0))


def _cubic_matrix(in_size, out_size, align_corners, scale, dtype):
    """(out, in) weights of PyTorch's bicubic upsampling (A = -0.75, borders clamped)."""
    m = np.zeros((out_size, in_size), np.float64)
    s = _scale(in_size, out_size, align_corners, scale, dtype)
    dst = np.arange(out_size).astype(dtype)
    src = s * dst if align_corners else s * (dst + dtype(0.5)) - dtype(0.5)
    base = np.floor(src)
    t = (src - base).astype(np.float64)
    rows = np.arange(out_size)
    for k in range(-1, 3):
        idx = np.clip(base.astype(np.int64) + k, 0, in_size - 1)
        np.add.at(m, (rows, idx), _cubic(t - k, -0.75))
    return m


def _aa_matrix(in_size, out_size, align_corners, scale, dtype, bicubic):
    """Anti-aliased (PIL-style) resampling weights: the filter widens with the downscale factor."""
    s = float(_scale(in_size, out_size, align_corners, scale, dtype))
    interp = 4 if bicubic else 2
    support = interp * 0.5 * s if s >= 1 else interp * 0.5
    invscale = 1 / s if s >= 1 else 1.0
    m = np.zeros((out_size, in_size), np.float64)
    for i in range(out_size):
        center = s * (i + 0.5)
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), in_size)
        x = (np.arange(lo, hi) - center + 0.5) * invscale
        w = _cubic(x, -0.5) if bicubic else np.maximum(0, 1 - np.abs(x))
        total = w.sum()
        m[i, lo:hi] = w / total if total != 0 else w
    return m


def _opmath(x):
    return np.float64 if x.dtype == jnp.float64 else np.float32


def _resample(x, output_size, scales, matrix_fn):
    n = len(output_size)
    dtype = _opmath(x)
    mats = [matrix_fn(sz, o, sc, dtype) for sz, o, sc in zip(x.shape[-n:], output_size, _scales(scales, n))]
    return _apply_per_axis(_upcast(x), mats)


def _scales(scales, n):
    return list(scales) if scales is not None else [None] * n


def _nearest(x, output_size, scales, exact):
    n = len(output_size)
    for i, (sz, o, sc) in enumerate(zip(x.shape[-n:], output_size, _scales(scales, n))):
        x = jnp.take(x, _nearest_index(sz, o, sc, exact), axis=x.ndim - n + i)
    return x


def _register_nearest(n, exact):
    name = f"aten::_upsample_nearest_exact{n}d" if exact else f"aten::upsample_nearest{n}d"

    @lowers(name)
    def forward(x, output_size, *scales):
        return _nearest(x, tuple(output_size), scales, exact)

    @lowers(name + "_backward")
    def backward(grad_output, output_size, input_size, *scales):
        x = jnp.zeros(tuple(input_size), _compute_dtype(grad_output.dtype))
        return _pullback(lambda v: _nearest(v, tuple(output_size), scales, exact), x, grad_output)

    return forward, backward


for _n in (1, 2, 3):
    for _exact in (False, True):
        _register_nearest(_n, _exact)


def _register_interp(name, matrix_fn):
    """Lowerings of one interpolation mode (forward + backward), all with an align_corners flag."""

    @lowers(name)
    def forward(x, output_size, align_corners, *scales):
        fn = lambda i, o, s, dt: matrix_fn(i, o, align_corners, s, dt)
        return _resample(x, tuple(output_size), scales, fn)

    @lowers(name + "_backward")
    def backward(grad_output, output_size, input_size, align_corners, *scales):
        fn = lambda i, o, s, dt: matrix_fn(i, o, align_corners, s, dt)
        x = jnp.zeros(tuple(input_size), _compute_dtype(grad_output.dtype))
        return _pullback(lambda v: _resample(v, tuple(output_size), scales, fn), x, grad_output)

    return forward, backward


for _name, _fn in (
    ("aten::upsample_linear1d", _linear_matrix),
    ("aten::upsample_bilinear2d", _linear_matrix),
    ("aten::upsample_trilinear3d", _linear_matrix),
    ("aten::upsample_bicubic2d", _cubic_matrix),
    ("aten::_upsample_bilinear2d_aa", lambda i, o, ac, s, dt: _aa_matrix(i, o, ac, s, dt, False)),
    ("aten::_upsample_bicubic2d_aa", lambda i, o, ac, s, dt: _aa_matrix(i, o, ac, s, dt, True)),
):
    _register_interp(_name, _fn)


# -- grid sampling (F.grid_sample, spatial transformers) --------------------------------------------
# PyTorch's GridSampler: grid values in [-1, 1] map to input pixels (align_corners: to their centers of
# the corner pixels, else to the image edges); out-of-range points read zeros, the border or a
# reflection. Modes: 0 bilinear, 1 nearest (round half to even), 2 bicubic (2-d only, A = -0.75).
# Padding modes: 0 zeros, 1 border, 2 reflection. The backward passes are the VJPs of these forwards;
# clipping and reflection are written with `where` so their gradients at the edges are CPU's.
_BILINEAR, _NEAREST, _BICUBIC = 0, 1, 2
_ZEROS, _BORDER, _REFLECTION = 0, 1, 2


def _unnormalize(coord, size: int, align_corners: bool):
    if align_corners:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


def _clip(coord, size: int):
    """Clamp to [0, size - 1]; the borders count as outside for the gradient (0 there), as on CPU."""
    return jnp.where(coord <= 0, 0, jnp.where(coord >= size - 1, size - 1, coord))


def _reflect(coord, twice_low: int, twice_high: int):
    """Fold `coord` back into [low, high] as a mirror would (PyTorch's reflect_coordinates)."""
    if twice_low == twice_high:
        return jnp.zeros_like(coord)
    low = twice_low / 2
    span = (twice_high - twice_low) / 2
    rel = coord - low
    rel = jnp.where(rel < 0, -rel, rel)
    extra = jnp.fmod(rel, span)
    flips = jnp.floor(rel / span)
    return jnp.where(jnp.fmod(flips, 2) == 0, extra + low, span - extra + low)


def _pad_coordinate(coord, size: int, padding_mode: int, align_corners: bool):
    if padding_mode == _BORDER:
        return _clip(coord, size)
    if padding_mode == _REFLECTION:
        twice = (0, 2 * (size - 1)) if align_corners else (-1, 2 * size - 1)
        return _clip(_reflect(coord, *twice), size)
    return coord


def _gather_points(x, idx, sizes):
    """x (N, C, *sizes) at integer points idx (list per spatial axis, each (N, *out)); 0 outside."""
    n, c = x.shape[:2]
    inside = jnp.ones(idx[0].shape, bool)
    flat = jnp.zeros(idx[0].shape, jnp.int32)
    for i, size in zip(idx, sizes):
        inside = inside & (i >= 0) & (i < size)
        flat = flat * size + jnp.clip(i, 0, size - 1).astype(jnp.int32)
    values = jnp.take_along_axis(x.reshape(n, c, -1), flat.reshape(n, 1, -1), axis=2)
    values = values.reshape((n, c) + idx[0].shape[1:])
    return jnp.where(inside[:, None], values, jnp.zeros((), x.dtype))


def _cubic_weights(t):
    """Keys' cubic convolution weights (A = -0.75) of the 4 taps around a point at fraction t."""
    a = -0.75

    def near(v):
        return ((a + 2) * v - (a + 3)) * v * v + 1

    def far(v):
        return ((a * v - 5 * a) * v + 8 * a) * v - 4 * a

    return (far(t + 1), near(t), near(1 - t), far(2 - t))


def _grid_sample(x, grid, mode: int, padding_mode: int, align_corners: bool):
    """Sample x (N, C, *spatial) at grid (N, *out, ndim) (last axis x, y[, z]): (N, C, *out)."""
    sizes = x.shape[2:]
    nd = len(sizes)
    xf = _upcast(x)
    grid = _upcast(grid).astype(xf.dtype)
    # grid's last axis lists x (width) first: reverse it into the spatial order (depth, height, width)
    coords = [_unnormalize(grid[..., nd - 1 - k], sizes[k], align_corners) for k in range(nd)]
    if mode == _BICUBIC:
        base = [jnp.floor(c) for c in coords]
        weights = [_cubic_weights(c - b) for c, b in zip(coords, base)]
        out = 0
        for taps in itertools.product(range(4), repeat=nd):
            idx = []
            for k, t in enumerate(taps):
                tap = _pad_coordinate(base[k] - 1 + t, sizes[k], padding_mode, align_corners)
                idx.append(tap.astype(jnp.int32))  # C++ int cast: toward zero
            w = math.prod(weights[k][t] for k, t in enumerate(taps))
            out = out + _gather_points(xf, idx, sizes) * w[:, None]
        return out
    coords = [_pad_coordinate(c, s, padding_mode, align_corners) for c, s in zip(coords, sizes)]
    if mode == _NEAREST:
        idx = [jnp.round(c).astype(jnp.int32) for c in coords]
        return _gather_points(xf, idx, sizes)
    base = [jnp.floor(c) for c in coords]
    out = 0
    for corner in itertools.product((0, 1), repeat=nd):
        # weight of the corner: (base + 1 - c) on its low side, (c - base) on its high side
        w = math.prod((c - b) if o else (b + 1 - c) for c, b, o in zip(coords, base, corner))
        idx = [(b + o).astype(jnp.int32) for b, o in zip(base, corner)]
        out = out + _gather_points(xf, idx, sizes) * w[:, None]
    return out


@lowers("aten::grid_sampler_2d", "aten::grid_sampler_3d")
def grid_sampler(x, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample(x, grid, interpolation_mode, padding_mode, align_corners)


@lowers("aten::grid_sampler_2d_backward", "aten::grid_sampler_3d_backward")
def grid_sampler_backward(grad_output, x, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    """(grad_input, grad_grid); an output not asked for in `output_mask` is undefined (None)."""

    def fn(inp, g):
        return _grid_sample(inp, g, interpolation_mode, padding_mode, align_corners)

    out, vjp = jax.vjp(fn, _upcast(x), _upcast(grid))
    grad_input, grad_grid = vjp(grad_output.astype(out.dtype))
    return (grad_input if output_mask[0] else None), grad_grid
