"""Layers with a random part: fractional max pooling (2d/3d) and randomized leaky ReLU (rrelu).

Fractional max pooling gets its randomness as an input (`random_samples`, one number in [0, 1) per
plane and spatial dim, drawn by `F.fractional_max_pool*d`), so the lowering is deterministic given
it and matches CPU PyTorch exactly: window starts follow ATen's interval formula
`start[i] = int((i + u) * alpha) - int(u * alpha)`, `alpha = (in - k) / (out - 1)`, the last window
ending at the input's edge, computed in the input dtype (each step rounded to bf16/f16 as c10's half
types do). Samples index dims as ATen does: (W, H) in 2d, (T, H, W) in 3d. In each window the first
maximum wins and a NaN beats everything (the last NaN in scan order). Indices are flat per plane.

`rrelu_with_noise` in training draws a slope in [lower, upper] for every element <= 0 (not for NaN)
and writes it into `noise` (1 elsewhere); out = x * noise there, x elsewhere, so autograd's backward
(`grad * noise`) is its exact derivative (for bf16 the slope is rounded before use; CPU multiplies by
the unrounded one, at most one bf16 ulp away). The draw comes from the device PRNG, so values differ from CPU's; a CPU
`generator=` draws on CPU and equals CPU PyTorch. In eval it is leaky_relu with slope (lower+upper)/2
and `noise` is left alone. `noise` is a mutated argument of a non in-place op, which the dispatcher
cannot derive: the jitted `rrelu_with_noise_functional` computes, host kernels write back.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch

from hf_tpu.runtime.lowerings.random import _check_generator_free, _uniform01
from hf_tpu.runtime.lowerings.table import lowers

_HALF = (jnp.bfloat16, jnp.float16)


def _is_float(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.floating)


def _compute_dtype(dtype):
    return jnp.float32 if dtype in _HALF else dtype


def _rounded_like(dtype):
    """Rounding to `dtype`'s precision after each float32 step: c10's BFloat16/Half arithmetic rounds
    every intermediate (reduce_precision survives XLA's excess-precision simplifications)."""
    if dtype not in _HALF:
        return lambda v: v
    info = jnp.finfo(dtype)
    return lambda v: jax.lax.reduce_precision(v, exponent_bits=info.nexp, mantissa_bits=info.nmant)


# -- fractional max pooling ---------------------------------------------------------------------------
def _intervals(sample, in_size: int, out_size: int, pool: int, dtype):
    """Window starts along one dim for every plane: `sample` (N, C) -> (N, C, out_size) int64."""
    ct = _compute_dtype(dtype)
    rnd = _rounded_like(dtype)
    last = jnp.full(sample.shape + (min(out_size, 1),), in_size - pool, jnp.int64)
    if out_size <= 1:
        return last
    u = sample.astype(ct)[..., None]
    alpha = rnd(rnd(jnp.asarray(in_size - pool, ct)) / rnd(jnp.asarray(out_size - 1, ct)))
    i = rnd(jnp.arange(out_size - 1, dtype=ct))
    first = jnp.trunc(rnd(rnd(i + u) * alpha)) - jnp.trunc(rnd(u * alpha))
    starts = jnp.clip(first.astype(jnp.int64), 0, in_size - pool)  # samples outside [0, 1) stay in bounds
    return jnp.concatenate([starts, last], axis=-1)


def _window_argmax(values):
    """(value, position) of each window's max along the last axis: the first maximum, or the last NaN."""
    k = values.shape[-1]
    isnan = jnp.isnan(values)
    last_nan = k - 1 - jnp.argmax(isnan[..., ::-1], axis=-1)
    top = jnp.max(jnp.where(isnan, -jnp.inf, values), axis=-1, keepdims=True)
    first_max = jnp.argmax(values == top, axis=-1)
    pos = jnp.where(jnp.any(isnan, axis=-1), last_nan, first_max)
    return jnp.take_along_axis(values, pos[..., None], axis=-1)[..., 0], pos


def _check_fractional(name: str, x, kernel_size, output_size, samples, n: int):
    if not _is_float(x.dtype):
        raise RuntimeError(f"{name}: expected a floating-point input, got {x.dtype}")
    if len(kernel_size) != n or len(output_size) != n:
        raise RuntimeError(f"{name}: kernel_size and output_size must have {n} elements each")
    if x.ndim not in (n + 1, n + 2):
        raise RuntimeError(f"{name}: expected a {n + 1}D or {n + 2}D input, got {x.ndim}D")
    first = x.ndim - n - 1
    if any(size == 0 for size in x.shape[first:]):
        raise RuntimeError(
            f"{name}(): Expected input to have non-zero size for non-batch dimensions, but got {list(x.shape)}"
        )
    if samples.dtype != x.dtype:
        raise RuntimeError(f"{name}: Expect _random_samples to have the same dtype as input")
    batch = x.shape[0] if x.ndim == n + 2 else 1
    if samples.ndim != 3 or samples.shape[0] < batch or samples.shape[1:] != (x.shape[-n - 1], n):
        raise RuntimeError(
            f"{name}: _random_samples must have shape (>= batch {batch}, channels {x.shape[-n - 1]}, {n}),"
            f" got {tuple(samples.shape)}"
        )
    # ATen's 3d check is strict (out + k - 1 < size), its 2d check is not: both kept
    limit = 1 if n == 3 else 0
    for size, k, o in zip(x.shape[-n:], kernel_size, output_size):
        if o + k - 1 > size - limit:
            raise RuntimeError(f"{name}: pool size {k} too large relative to input size {size} (output {o})")


def _fractional_max_pool(name, x, kernel_size, output_size, samples, n: int, sample_dims):
    """Shared 2d/3d body; `sample_dims[d]` is the column of `samples` that drives spatial dim d."""
    _check_fractional(name, x, kernel_size, output_size, samples, n)
    batched = x.ndim == n + 2
    xb = x if batched else x[None]
    nb, c = xb.shape[:2]
    spatial = xb.shape[2:]
    u = samples[:nb]
    # flat in-plane index of every (output position, window offset), broadcast over all dims
    flat = jnp.zeros((nb, c) + (1,) * (2 * n), jnp.int64)
    plane_stride = 1
    for d in reversed(range(n)):
        starts = _intervals(u[:, :, sample_dims[d]], spatial[d], output_size[d], kernel_size[d], x.dtype)
        pos = starts[..., None] + jnp.arange(kernel_size[d], dtype=jnp.int64)  # (N, C, out_d, k_d)
        shape = [nb, c] + [1] * (2 * n)
        shape[2 + d], shape[2 + n + d] = output_size[d], kernel_size[d]
        flat = flat + pos.reshape(shape) * plane_stride
        plane_stride *= spatial[d]
    flat = jnp.broadcast_to(flat, (nb, c) + tuple(output_size) + tuple(kernel_size))
    window = math.prod(kernel_size)
    flat = flat.reshape(nb, c, math.prod(output_size) * window)  # explicit sizes: N or C may be 0
    gathered = jnp.take_along_axis(xb.reshape(nb, c, math.prod(spatial)), flat, axis=-1)
    gathered = gathered.reshape((nb, c) + tuple(output_size) + (window,))
    values, pos = _window_argmax(gathered)
    indices = jnp.take_along_axis(flat.reshape(gathered.shape), pos[..., None], axis=-1)[..., 0]
    if not batched:
        values, indices = values[0], indices[0]
    return values, indices


@lowers("aten::fractional_max_pool2d")
def fractional_max_pool2d(x, kernel_size, output_size, random_samples):
    return _fractional_max_pool(
        "fractional_max_pool2d", x, kernel_size, output_size, random_samples, 2, (1, 0)
    )


@lowers("aten::fractional_max_pool3d")
def fractional_max_pool3d(x, kernel_size, output_size, random_samples):
    return _fractional_max_pool(
        "fractional_max_pool3d", x, kernel_size, output_size, random_samples, 3, (0, 1, 2)
    )


def _fractional_backward(name, grad_output, x, indices, n: int):
    """Each output's gradient added at its max's flat in-plane index (windows may overlap)."""
    if grad_output.shape != indices.shape or grad_output.shape[:-n] != x.shape[:-n]:
        raise RuntimeError(
            f"{name}: grad_output {tuple(grad_output.shape)} and indices {tuple(indices.shape)} must have "
            f"the pooled output's shape for input {tuple(x.shape)}"
        )
    planes = math.prod(x.shape[:-n])
    plane = math.prod(x.shape[-n:])
    outputs = math.prod(grad_output.shape[-n:])
    g = grad_output.astype(_compute_dtype(grad_output.dtype)).reshape(planes, outputs)
    rows = jnp.arange(planes)[:, None]
    out = jnp.zeros((planes, plane), g.dtype).at[rows, indices.reshape(planes, outputs)].add(g, mode="drop")
    return out.reshape(x.shape).astype(x.dtype)


@lowers("aten::fractional_max_pool2d_backward")
def fractional_max_pool2d_backward(grad_output, x, kernel_size, output_size, indices):
    return _fractional_backward("fractional_max_pool2d_backward", grad_output, x, indices, 2)


@lowers("aten::fractional_max_pool3d_backward")
def fractional_max_pool3d_backward(grad_output, x, kernel_size, output_size, indices):
    return _fractional_backward("fractional_max_pool3d_backward", grad_output, x, indices, 3)


# -- rrelu ----------------------------------------------------------------------------------------------
def _check_rrelu(x, noise) -> None:
    if not _is_float(x.dtype):
        raise RuntimeError(f"rrelu_with_noise: expected a floating-point input, got {x.dtype}")
    if noise.shape != x.shape:
        raise RuntimeError(
            "noise tensor shape must match self tensor shape. "
            f"Got self.shape = {list(x.shape)} noise.shape = {list(noise.shape)}"
        )
    if noise.dtype != x.dtype:
        raise RuntimeError(f"rrelu_with_noise: expected noise of dtype {x.dtype}, got {noise.dtype}")


@lowers("aten::rrelu_with_noise_functional", random=True, static_scalars=True)
def rrelu_with_noise_functional(key, x, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    """(out, noise_out): in training a slope in [lower, upper] per element <= 0; else leaky_relu."""
    _check_generator_free(generator)
    _check_rrelu(x, noise)
    ct = _compute_dtype(x.dtype)
    xf = x.astype(ct)
    if not training:
        slope = (float(lower) + float(upper)) / 2
        return jnp.where(xf > 0, xf, xf * jnp.asarray(slope, ct)).astype(x.dtype), noise
    if float(lower) > float(upper):
        raise RuntimeError(f"rrelu_with_noise: lower ({lower}) must not exceed upper ({upper}) in training")
    u = _uniform01(key, x.shape, ct)
    slope = jnp.asarray(lower, u.dtype) + jnp.asarray(float(upper) - float(lower), u.dtype) * u
    # the slope as stored in `noise` (bf16: rounded) is the one applied, so out == x * noise exactly
    # and autograd's grad * noise is its derivative; CPU multiplies by the unrounded slope (<= 1 ulp)
    slope = slope.astype(x.dtype).astype(ct)
    negative = xf <= 0
    out = jnp.where(negative, xf * slope, xf)
    return out.astype(x.dtype), jnp.where(negative, slope, 1).astype(noise.dtype)


def _rrelu(self, noise, lower, upper, training, generator):
    """The functional op on tpu, with `noise` updated in place as PyTorch's kernel does."""
    out, noise_out = torch.ops.aten.rrelu_with_noise_functional(
        self, noise, lower, upper, training, generator=generator
    )
    if training:
        noise.copy_(noise_out)
    return out


@lowers("aten::rrelu_with_noise", kind="host")
def rrelu_with_noise(self, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    return _rrelu(self, noise, lower, upper, training, generator)


@lowers("aten::rrelu_with_noise_", kind="host")
def rrelu_with_noise_(self, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    return self.copy_(_rrelu(self, noise, lower, upper, training, generator))


@lowers("aten::rrelu_with_noise.out", kind="host")
def rrelu_with_noise_out(self, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None, *, out):
    result = _rrelu(self, noise, lower, upper, training, generator)
    if out.dtype != result.dtype:
        raise RuntimeError(f"rrelu_with_noise: expected out= dtype {result.dtype}, got {out.dtype}")
    if tuple(out.shape) != tuple(result.shape):
        out.resize_(result.shape)
    return out.copy_(result)
