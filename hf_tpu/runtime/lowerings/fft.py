"""Discrete Fourier transforms: the three primitives every `torch.fft.*` function reaches.

`normalization` is ATen's enum: 0 none, 1 by 1/sqrt(n), 2 by 1/n, where n is the product of the
transformed sizes (of the signal, for c2r). Complex results stay in the input's precision (float32 ->
complex64), as PyTorch does.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from hf_tpu.runtime.lowerings.table import lowers


def _scale(x, n: int, normalization: int):
    if normalization == 1:
        return x / jnp.asarray(math.sqrt(n), x.real.dtype)
    if normalization == 2:
        return x / jnp.asarray(n, x.real.dtype)
    return x


def _complex_dtype(x):
    return jnp.complex128 if x.dtype in (jnp.float64, jnp.complex128) else jnp.complex64


@lowers("aten::_fft_r2c")
def fft_r2c(x, dim, normalization, onesided):
    """Real -> complex; `onesided` keeps the last transformed dim's non-negative frequencies."""
    dims = tuple(dim)
    n = math.prod(x.shape[d] for d in dims)
    out = jnp.fft.fftn(x.astype(_complex_dtype(x)), axes=dims)
    if onesided:
        last = dims[-1]
        out = jnp.take(out, jnp.arange(x.shape[last] // 2 + 1), axis=last)
    return _scale(out, n, normalization).astype(_complex_dtype(x))


@lowers("aten::_fft_c2c")
def fft_c2c(x, dim, normalization, forward):
    dims = tuple(dim)
    n = math.prod(x.shape[d] for d in dims)
    out = jnp.fft.fftn(x, axes=dims) if forward else jnp.fft.ifftn(x, axes=dims) * n
    return _scale(out, n, normalization).astype(x.dtype)


@lowers("aten::_fft_c2r")
def fft_c2r(x, dim, normalization, last_dim_size):
    """Complex (one-sided) -> real of length `last_dim_size` along the last transformed dim."""
    dims = tuple(dim)
    sizes = [x.shape[d] for d in dims[:-1]] + [last_dim_size]
    n = math.prod(sizes)
    out = jnp.fft.irfftn(x, s=sizes, axes=dims) * n  # unnormalized, then ATen's normalization
    return _scale(out, n, normalization).astype(x.real.dtype)
