"""Filling and creating values: fill_, zero_, arange, linspace/logspace, eye, triangle indices, complex.

Factories with no tensor input reach these lowerings through the `device="tpu"` argument. Their
`out=` forms are host wrappers (compute, then resize and copy into `out`). `full`, `zeros`, `ones`,
`scalar_tensor`, `*_like` and `new_*` need no lowering: PyTorch composes them from `empty` + `fill_`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from hf_tpu.runtime.buffers import platform
from hf_tpu.runtime.buffers.dtypes import to_jax_dtype
from hf_tpu.runtime.lowerings.table import lowers


@lowers("aten::fill.Scalar")
def fill(x, value):
    return jnp.full(x.shape, value, dtype=x.dtype)


@lowers("aten::fill.Tensor")
def fill_tensor(x, value):
    return jnp.broadcast_to(value.astype(x.dtype), x.shape)


@lowers("aten::zero")
def zero(x):
    return jnp.zeros(x.shape, dtype=x.dtype)


# -- ranges --------------------------------------------------------------------------------------------
# PyTorch's CPU kernels (RangeFactories) fix both the length and the arithmetic of each element; the
# lowerings follow them: arange accumulates in int64 (integers) or double (float32/64; float for
# reduced precision), linspace/logspace step from both ends so the last element is exactly `end`.
def _out_dtype(dtype):
    return to_jax_dtype(dtype if dtype is not None else torch.get_default_dtype())


# c10::ScalarType codes in enum order: schema defaults such as `ScalarType? dtype=long` reach
# lowerings as these ints rather than as torch.dtype objects.
_SCALAR_TYPES = (
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.float32,
    torch.float64,
    torch.complex32,
    torch.complex64,
    torch.complex128,
    torch.bool,
    torch.qint8,
    torch.quint8,
    torch.qint32,
    torch.bfloat16,
)


def as_torch_dtype(dtype, default: torch.dtype = torch.int64) -> torch.dtype:
    """A `ScalarType?` argument as a torch.dtype: None -> default, a schema-default int -> its dtype."""
    if dtype is None:
        return default
    if isinstance(dtype, int):
        return _SCALAR_TYPES[dtype]
    return dtype


def _wide_float():
    """The widest float this platform computes in: float64, or float32 on TPU."""
    return jnp.float64 if platform.supports_float64() else jnp.float32


def _is_integral(dtype) -> bool:
    return not (jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.complexfloating))


@lowers("aten::arange", "aten::arange.start", "aten::arange.start_step", static_scalars=True)
def arange(*args):
    """torch.arange: the length (and any error) comes from PyTorch's own meta kernel."""
    *scalars, dtype, _layout, _device, _pin = args
    if len(scalars) == 1:  # arange(end)
        scalars = [0, *scalars]
    start, end, step = (*scalars, 1)[:3]
    meta = torch.ops.aten.arange.start_step(start, end, step, dtype=dtype, device="meta")
    n, out = meta.shape[0], to_jax_dtype(meta.dtype)
    if _is_integral(out):
        return (int(start) + int(step) * jnp.arange(n, dtype=jnp.int64)).astype(out)
    acc = _wide_float() if out in (jnp.float32, jnp.float64) else jnp.float32
    return (acc(start) + acc(step) * jnp.arange(n, dtype=acc)).astype(out)


@lowers("aten::arange.start_out", kind="host")
def arange_start_out(start, end, step=1, *, out):
    result = torch.ops.aten.arange.start_step(start, end, step, dtype=out.dtype, device=out.device)
    return _copy_into(out, result)


@lowers("aten::arange.out", kind="host")
def arange_out(end, *, out):
    return arange_start_out(0, end, 1, out=out)


def _copy_into(out: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    """out= semantics: resize `out` to the result's shape, then copy (casting to out's dtype)."""
    if tuple(out.shape) != tuple(result.shape):
        out.resize_(result.shape)
    return out.copy_(result)


def _opaque(n: int, dtype):
    """The constant `n` hidden from XLA's simplifier, which rewrites `x / c` as `x * (1 / c)`: that is
    not IEEE division (linspace(50, 1, 50) in int64 would give 24 where CPU gives 25)."""
    return jax.lax.optimization_barrier(jnp.asarray(n, dtype=dtype))


def _from_both_ends(start, end, steps: int, dtype):
    """start + step*i for the first half, end - step*(steps-1-i) for the rest, in PyTorch's step type.

    Floats compute in their own dtype (as CPU PyTorch does, bf16 included); integers step in double.
    CPU's float32/float64 kernels round `start + step*i` once (a fused multiply-add): float32 computes
    it in float64 (exact product, one rounding back), float64 with an emulated fma.
    """
    integral = _is_integral(dtype)
    step_t = _wide_float() if integral else dtype
    # Scalar.to<scalar_t>() first: integers truncate, floats round
    s = jnp.asarray(start).astype(dtype).astype(step_t)
    e = jnp.asarray(end).astype(dtype).astype(step_t)
    if step_t == jnp.float16:
        step = _half_ops(step_t).divide(_half_ops(step_t).subtract(e, s), _opaque(steps - 1, jnp.float32))
    else:
        step = (e - s) / _opaque(steps - 1, step_t)
    idx = jnp.arange(steps, dtype=jnp.int64)
    fma = _fma_for(step_t)
    head = fma(step, idx.astype(step_t), s)
    tail = fma(-step, (steps - 1 - idx).astype(step_t), e)
    return jnp.where(idx < steps // 2, head, tail)


def _fma_for(dtype):
    """a*b + c rounded once where CPU's kernel fuses it (float32, float64), else as two operations."""
    if dtype == jnp.float32 and platform.supports_float64():
        f64 = jnp.float64
        return lambda a, b, c: (a.astype(f64) * b.astype(f64) + c.astype(f64)).astype(dtype)
    if dtype == jnp.float64:
        return _fma64
    if dtype == jnp.float16:
        ops = _half_ops(dtype)
        return lambda a, b, c: ops.add(c, ops.multiply(a, b))
    return lambda a, b, c: c + a * b


class _half_ops:
    """float16 arithmetic as CPU's `c10::Half` in linspace's scalar kernel: each operation in float32,
    rounded to float16 (values stay float32; the caller casts at the end). Written in float16, XLA may keep
    intermediate results wider, as it did on a host with native half arithmetic (AVX512-FP16): one ulp
    off CPU PyTorch in most ranges. bfloat16 matches CPU's kernel (float32, rounded once) as written."""

    def __init__(self, dtype) -> None:
        self.dtype = dtype

    def _op(self, fn, a, b):
        """`fn` in float32, rounded to the dtype by `reduce_precision`: a round trip through the dtype
        (astype) is dropped by XLA (`xla_allow_excess_precision`), an explicit rounding is kept."""
        f32 = jnp.float32
        result = fn(jnp.asarray(a).astype(f32), jnp.asarray(b).astype(f32))
        return jax.lax.reduce_precision(result, exponent_bits=5, mantissa_bits=10)

    def add(self, a, b):
        return self._op(jnp.add, a, b)

    def subtract(self, a, b):
        return self._op(jnp.subtract, a, b)

    def multiply(self, a, b):
        return self._op(jnp.multiply, a, b)

    def divide(self, a, b):
        return self._op(jnp.divide, a, b)


def _fma64(a, b, c):
    """float64 a*b + c with (nearly always) one rounding: the product's exact error (Dekker's split)
    and the sum's exact error (Knuth's two-sum) are added back before the final rounding."""
    p = a * b
    split = 134217729.0  # 2**27 + 1
    a_big, b_big = a * split, b * split
    a_hi = a_big - (a_big - a)
    b_hi = b_big - (b_big - b)
    a_lo, b_lo = a - a_hi, b - b_hi
    p_err = ((a_hi * b_hi - p) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo
    total = c + p
    c_part = total - p
    sum_err = (c - c_part) + (p - (total - c_part))
    out = total + (p_err + sum_err)
    return jnp.where(jnp.isfinite(out), out, c + p)


@lowers(
    "aten::linspace",
    "aten::linspace.Tensor_Tensor",
    "aten::linspace.Tensor_Scalar",
    "aten::linspace.Scalar_Tensor",
)
def linspace(start, end, steps, dtype=None, layout=None, device=None, pin_memory=None):
    """`steps` evenly spaced values from start to end inclusive."""
    out = _out_dtype(dtype)
    if steps <= 1:
        return jnp.full((steps,), jnp.asarray(start).astype(out), dtype=out)
    values = _from_both_ends(start, end, steps, out)
    return values.astype(out)


@lowers(
    "aten::logspace",
    "aten::logspace.Tensor_Tensor",
    "aten::logspace.Tensor_Scalar",
    "aten::logspace.Scalar_Tensor",
)
def logspace(start, end, steps, base=10.0, dtype=None, layout=None, device=None, pin_memory=None):
    """base ** (start + step * i), as CPU PyTorch's kernel: the ends are cast to the output dtype and
    subtracted in it (bf16 rounds, integers truncate), the step and the power are taken in double."""
    out = _out_dtype(dtype)
    wide = out if jnp.issubdtype(out, jnp.complexfloating) else _wide_float()
    if steps <= 1:
        value = jnp.power(jnp.asarray(base, wide), jnp.asarray(start).astype(wide))
        return jnp.full((steps,), value).astype(out)
    s = jnp.asarray(start).astype(out)
    e = jnp.asarray(end).astype(out)
    if _is_integral(out):  # C++ promotes small integer types to int before subtracting
        s, e = s.astype(jnp.int64), e.astype(jnp.int64)
    step = (e - s).astype(wide) / _opaque(steps - 1, wide)
    idx = jnp.arange(steps, dtype=jnp.int64)
    head = s.astype(wide) + step * idx.astype(wide)
    tail = e.astype(wide) - step * (steps - 1 - idx).astype(wide)
    exponent = jnp.where(idx < steps // 2, head, tail)
    return jnp.power(jnp.asarray(base, wide), exponent).astype(out)


@lowers("aten::linspace.out", kind="host")
def linspace_out(start, end, steps, *, out):
    return _copy_into(out, torch.linspace(start, end, steps, dtype=out.dtype, device=out.device))


@lowers("aten::logspace.out", kind="host")
def logspace_out(start, end, steps, base=10.0, *, out):
    return _copy_into(out, torch.logspace(start, end, steps, base, dtype=out.dtype, device=out.device))


# -- matrices and index sets ----------------------------------------------------------------------------
@lowers("aten::eye")
def eye(n, dtype=None, layout=None, device=None, pin_memory=None):
    """n x n identity matrix."""
    return jnp.eye(n, dtype=_out_dtype(dtype))


@lowers("aten::eye.m")
def eye_m(n, m, dtype=None, layout=None, device=None, pin_memory=None):
    """n x m matrix with ones on the main diagonal."""
    return jnp.eye(n, m, dtype=_out_dtype(dtype))


@lowers("aten::eye.out", kind="host")
def eye_out(n, *, out):
    return _copy_into(out, torch.eye(n, dtype=out.dtype, device=out.device))


@lowers("aten::eye.m_out", kind="host")
def eye_m_out(n, m, *, out):
    return _copy_into(out, torch.eye(n, m, dtype=out.dtype, device=out.device))


def _index_pairs(rows, cols, dtype):
    return jnp.asarray(np.stack([rows, cols]), dtype=to_jax_dtype(as_torch_dtype(dtype)))


@lowers("aten::tril_indices")
def tril_indices(row, col, offset=0, dtype=torch.int64, layout=None, device=None, pin_memory=None):
    """(2, N) coordinates of the lower triangle, row-major (static sizes: built at trace time)."""
    return _index_pairs(*np.tril_indices(row, offset, col), dtype)


@lowers("aten::triu_indices")
def triu_indices(row, col, offset=0, dtype=torch.int64, layout=None, device=None, pin_memory=None):
    """(2, N) coordinates of the upper triangle, row-major."""
    return _index_pairs(*np.triu_indices(row, offset, col), dtype)


# -- complex numbers from parts ---------------------------------------------------------------------------
@lowers("aten::complex")
def complex_(real, imag):
    """real + i*imag (float32 -> complex64, float64 -> complex128)."""
    real, imag = jnp.broadcast_arrays(real, imag)
    return jax.lax.complex(real, imag)


@lowers("aten::polar")
def polar(abs_, angle):
    """abs * (cos(angle) + i*sin(angle))."""
    abs_, angle = jnp.broadcast_arrays(abs_, angle)
    return jax.lax.complex(abs_ * jnp.cos(angle), abs_ * jnp.sin(angle))
