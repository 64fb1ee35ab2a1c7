"""Comparisons, logical and bitwise ops, NaN/inf tests, where, min/max and clamp.

Comparisons evaluate in the common torch dtype (a bfloat16 tensor compared with 0.1 compares against
bfloat16(0.1), as PyTorch does). minimum/maximum/clamp propagate NaN; fmin/fmax ignore it. Shifts follow
PyTorch CPU: shifting by a negative amount or by the bit width or more yields 0 (left) or the sign fill
(right).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from hf_tpu.runtime.lowerings.elementwise import cast, category, promote, result_type
from hf_tpu.runtime.lowerings.table import lowers


def _common(x, other):
    """Both operands in their torch result dtype (no opmath upcast: comparisons are exact)."""
    dt = result_type(x, other)
    return cast(x, dt), cast(other, dt)


def _comparison(name: str, fn):
    def lowering(x, other):
        x, other = _common(x, other)
        return fn(x, other)

    lowering.__name__ = name
    lowers(f"aten::{name}.Tensor", f"aten::{name}.Scalar")(lowering)


for _name, _fn in {
    "eq": jnp.equal,
    "ne": jnp.not_equal,
    "lt": jnp.less,
    "le": jnp.less_equal,
    "gt": jnp.greater,
    "ge": jnp.greater_equal,
}.items():
    _comparison(_name, _fn)


# -- logical ------------------------------------------------------------------------------------------
def _truth(x):
    return x if getattr(x, "dtype", None) == jnp.bool_ else x != 0


@lowers("aten::logical_not")
def logical_not(x):
    return ~_truth(x)


@lowers("aten::logical_and")
def logical_and(x, other):
    return _truth(x) & _truth(other)


@lowers("aten::logical_or")
def logical_or(x, other):
    return _truth(x) | _truth(other)


@lowers("aten::logical_xor")
def logical_xor(x, other):
    return _truth(x) ^ _truth(other)


# -- bitwise ------------------------------------------------------------------------------------------
def _bitwise(name: str, fn):
    def lowering(x, other):
        x, other = _common(x, other)
        return fn(x, other)

    lowering.__name__ = name
    lowers(f"aten::{name}.Tensor", f"aten::{name}.Scalar", f"aten::{name}.Scalar_Tensor")(lowering)


for _name, _fn in {
    "bitwise_and": jnp.bitwise_and,
    "bitwise_or": jnp.bitwise_or,
    "bitwise_xor": jnp.bitwise_xor,
}.items():
    _bitwise(_name, _fn)


@lowers("aten::bitwise_not")
def bitwise_not(x):
    return ~x


def _shift_amount(x, other):
    x, other = jnp.broadcast_arrays(*_common(x, other))
    bits = jnp.iinfo(x.dtype).bits
    signed = jnp.issubdtype(x.dtype, jnp.signedinteger)
    # PyTorch reads the amount as signed: a huge unsigned amount counts as negative
    out_of_range = (
        (other.astype(_signed(x.dtype)) < 0) | (other >= bits)
        if not signed
        else (other < 0) | (other >= bits)
    )
    return x, other, bits, out_of_range


def _signed(dt):
    return jnp.dtype(f"int{jnp.iinfo(dt).bits}")


@lowers(
    "aten::bitwise_left_shift.Tensor",
    "aten::bitwise_left_shift.Tensor_Scalar",
    "aten::bitwise_left_shift.Scalar_Tensor",
    "aten::__lshift__.Tensor",
    "aten::__lshift__.Scalar",
)
def left_shift(x, other):
    if category(result_type(x, other)) >= 2:  # float shifts (legacy __lshift__): x * 2**other
        x, other = promote(x, other)
        return x * jnp.exp2(other)
    x, other, bits, out_of_range = _shift_amount(x, other)
    shifted = lax.shift_left(x, jnp.where(out_of_range, 0, other).astype(x.dtype))
    return jnp.where(out_of_range, jnp.zeros_like(shifted), shifted)


@lowers(
    "aten::bitwise_right_shift.Tensor",
    "aten::bitwise_right_shift.Tensor_Scalar",
    "aten::bitwise_right_shift.Scalar_Tensor",
    "aten::__rshift__.Tensor",
    "aten::__rshift__.Scalar",
)
def right_shift(x, other):
    if category(result_type(x, other)) >= 2:
        x, other = promote(x, other)
        return x / jnp.exp2(other)
    x, other, bits, out_of_range = _shift_amount(x, other)
    amount = jnp.where(out_of_range, bits - 1, other).astype(x.dtype)
    shift = (
        lax.shift_right_arithmetic if jnp.issubdtype(x.dtype, jnp.signedinteger) else lax.shift_right_logical
    )
    shifted = shift(x, amount)
    if not jnp.issubdtype(x.dtype, jnp.signedinteger):
        shifted = jnp.where(out_of_range, jnp.zeros_like(shifted), shifted)
    return shifted


# -- NaN / inf tests ----------------------------------------------------------------------------------
def _is_inexact(x) -> bool:
    return category(x.dtype) >= 2


@lowers("aten::isnan")
def isnan(x):
    return jnp.isnan(x) if _is_inexact(x) else jnp.zeros(x.shape, bool)


@lowers("aten::isinf")
def isinf(x):
    return jnp.isinf(x) if _is_inexact(x) else jnp.zeros(x.shape, bool)


def isfinite(x):  # CompositeImplicitAutograd op: it decomposes itself
    return jnp.isfinite(x) if _is_inexact(x) else jnp.ones(x.shape, bool)


@lowers("aten::isposinf")
def isposinf(x):
    return x == jnp.inf if _is_inexact(x) else jnp.zeros(x.shape, bool)


@lowers("aten::isneginf")
def isneginf(x):
    return x == -jnp.inf if _is_inexact(x) else jnp.zeros(x.shape, bool)


# -- selection ----------------------------------------------------------------------------------------
@lowers("aten::where.self")
def where(condition, x, other):
    x, other = _common(x, other)
    return jnp.where(condition, x, other)


def _nan_propagating(fn):
    def lowering(x, other):
        x, other = _common(x, other)
        out = fn(x, other)
        if category(x.dtype) >= 2:
            out = jnp.where(jnp.isnan(x), x, jnp.where(jnp.isnan(other), other, out))
        return out

    return lowering


maximum = lowers("aten::maximum")(_nan_propagating(jnp.maximum))
minimum = lowers("aten::minimum")(_nan_propagating(jnp.minimum))


@lowers("aten::fmax")
def fmax(x, other):
    x, other = _common(x, other)
    return jnp.fmax(x, other) if category(x.dtype) >= 2 else jnp.maximum(x, other)


@lowers("aten::fmin")
def fmin(x, other):
    x, other = _common(x, other)
    return jnp.fmin(x, other) if category(x.dtype) >= 2 else jnp.minimum(x, other)


def clamp_values(x, lo=None, hi=None):
    """min(max(x, lo), hi): with lo > hi everything is hi; NaN in x (or a tensor bound) propagates."""
    x, lo, hi = _clamp_common(x, lo, hi)
    out = x
    if lo is not None:
        out = maximum(out, lo)
    if hi is not None:
        out = minimum(out, hi)
    return out


def _clamp_common(x, lo, hi):
    dt = result_type(x, lo, hi)
    return cast(x, dt), cast(lo, dt), cast(hi, dt)


@lowers("aten::clamp", "aten::clamp.Tensor")
def clamp(x, min=None, max=None):  # noqa: A002 - schema names
    return clamp_values(x, min, max)


@lowers("aten::clamp_min", "aten::clamp_min.Tensor")
def clamp_min(x, min):  # noqa: A002
    return clamp_values(x, lo=min)


@lowers("aten::clamp_max", "aten::clamp_max.Tensor")
def clamp_max(x, max):  # noqa: A002
    return clamp_values(x, hi=max)


@lowers("aten::equal", kind="host")
def equal(a, b) -> bool:
    """`torch.equal`: same shape and same values (NaN never equals, values compared after promotion)."""
    if a.device != b.device:
        raise RuntimeError(
            "Expected all tensors to be on the same device, but found at least two devices, "
            f"{a.device} and {b.device}!"
        )
    if tuple(a.shape) != tuple(b.shape):
        return False
    from hf_tpu.runtime.tensors.tensor import to_jax

    x, y = to_jax(a), to_jax(b)
    return bool(_all_equal(x, y))


@jax.jit
def _all_equal(x, y):
    return jnp.all(x == y)
