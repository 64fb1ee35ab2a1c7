"""Pointwise arithmetic and math: PyTorch's type promotion, integer division conventions, opmath.

PyTorch CPU computes bfloat16/float16 pointwise ops in float32 ("opmath") and rounds once at the end;
we do the same, so results match to the last bit more often than computing in the narrow type. The
dispatcher casts every output to the dtype PyTorch's meta kernel reports, but the *compute* dtype is
ours to choose: `promote`/`to_float` reproduce torch's rules (dimensioned tensors > 0-dim tensors >
Python numbers, by category bool < int < float < complex) so that e.g. integer `div` is true division
in float32 and `int8 // 0-dim int64` stays int8 arithmetic.
"""

from __future__ import annotations

import math
from functools import reduce

import jax
import jax.numpy as jnp
from jax import lax

from hf_tpu.runtime.buffers.dtypes import convert
from hf_tpu.runtime.lowerings.table import lowers

# -- type promotion helpers (shared with comparisons.py and activations.py) ------------------------
_HALF = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
_PY_DTYPE = {bool: jnp.dtype(bool), int: jnp.dtype(jnp.int64), float: jnp.dtype(jnp.float64)}


def is_weak(x) -> bool:
    """A Python number (or its traced form): PyTorch's "wrapped number", lowest promotion priority."""
    if isinstance(x, bool | int | float | complex):
        return True
    return bool(getattr(jax.typeof(x), "weak_type", False))


def dtype_of(x) -> jnp.dtype:
    if isinstance(x, complex):
        return jnp.dtype(jnp.complex128)
    if isinstance(x, bool | int | float):
        return _PY_DTYPE[type(x)]
    return jnp.dtype(x.dtype)


def category(dt) -> int:
    """0 bool, 1 integer, 2 floating, 3 complex (torch's promotion categories)."""
    dt = jnp.dtype(dt)
    if dt == jnp.bool_:
        return 0
    if jnp.issubdtype(dt, jnp.integer):
        return 1
    if jnp.issubdtype(dt, jnp.floating):
        return 2
    return 3


def _default_of(cat: int, current=None) -> jnp.dtype:
    if cat == 3:
        wide = current is not None and jnp.dtype(current) == jnp.float64
        return jnp.dtype(jnp.complex128 if wide else jnp.complex64)
    return jnp.dtype([jnp.bool_, jnp.int64, jnp.float32][cat])


def result_type(*xs) -> jnp.dtype:
    """torch.result_type over arrays and Python numbers (None entries are ignored)."""
    dims, zeros, weaks = [], [], []
    for x in xs:
        if x is None:
            continue
        if is_weak(x):
            weaks.append(dtype_of(x))
        elif jnp.ndim(x) == 0:
            zeros.append(dtype_of(x))
        else:
            dims.append(dtype_of(x))
    result = None
    for tier in (dims, zeros):
        if tier:
            t = reduce(jnp.promote_types, tier)
            if result is None or category(t) > category(result):
                result = t
    if weaks:
        cat = max(category(d) for d in weaks)
        if result is None or cat > category(result):
            result = _default_of(cat, result)
    return jnp.dtype(result if result is not None else jnp.float32)


def opmath(dt) -> jnp.dtype:
    """The dtype PyTorch computes in: float32 for bfloat16/float16, else the dtype itself."""
    dt = jnp.dtype(dt)
    return jnp.dtype(jnp.float32) if dt in _HALF else dt


def cast(x, dt):
    if x is None:
        return None
    return convert(x, jnp.dtype(dt)) if not is_weak(x) else jnp.asarray(x, dt)


def promote(*xs):
    """Cast arguments to the opmath of their common torch dtype."""
    dt = opmath(result_type(*xs))
    return [cast(x, dt) for x in xs]


def float_type(*xs) -> jnp.dtype:
    """Compute dtype of an op whose result is floating (integer inputs promote to float32)."""
    dt = result_type(*xs)
    if category(dt) < 2:
        dt = jnp.dtype(jnp.float32)
    return opmath(dt)


def to_float(*xs):
    dt = float_type(*xs)
    return [cast(x, dt) for x in xs]


def is_float(x) -> bool:
    return category(dtype_of(x)) >= 2


def is_int(x) -> bool:
    return category(dtype_of(x)) == 1


def unary_float(name: str, fn):
    """Register a float-valued unary op: integers promote to float32, halves compute in float32."""

    def lowering(x):
        (x,) = to_float(x)
        return fn(x)

    lowering.__name__ = name
    lowering.__doc__ = f"{name}: computed in opmath (float32 for halves and integers)."
    lowers(f"aten::{name}")(lowering)
    return lowering


# -- add, sub, mul -----------------------------------------------------------------------------------
@lowers("aten::add.Tensor", "aten::add.Scalar")
def add(x, other, alpha=1):
    x, other, alpha = promote(x, other, alpha)
    return x + other * alpha


@lowers("aten::sub.Tensor", "aten::sub.Scalar")
def sub(x, other, alpha=1):
    if dtype_of(x) == jnp.bool_ or dtype_of(other) == jnp.bool_:
        raise RuntimeError(
            "Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to invert a "
            "mask, use the `~` or `logical_not()` operator instead."
        )
    x, other, alpha = promote(x, other, alpha)
    return x - other * alpha


@lowers("aten::rsub.Tensor", "aten::rsub.Scalar")
def rsub(x, other, alpha=1):
    return sub(other, x, alpha)


def keep_nan(*pairs):
    """Cast, shielding bool->float converts from XLA's rewrite of `x * float(mask)` into a select.

    XLA simplifies `x * convert(pred)` and `x / convert(pred)` to selects, which turn `nan * False` into 0;
    PyTorch gives nan. An optimization barrier on the converted mask keeps IEEE semantics.
    """
    out = []
    for x, cast_x in pairs:
        if cast_x is not None and not is_weak(x) and dtype_of(x) == jnp.bool_ and category(cast_x.dtype) >= 2:
            cast_x = lax.optimization_barrier(cast_x)
        out.append(cast_x)
    return out


@lowers("aten::mul.Tensor", "aten::mul.Scalar")
def mul(x, other):
    x, other = keep_nan(*zip((x, other), promote(x, other)))
    return x * other


# -- division family: true division, trunc/floor rounding, remainder, fmod ------------------------------
def _int_floor_div(a, b):
    q = lax.div(a, b)  # truncates toward zero
    adjust = (lax.rem(a, b) != 0) & ((a < 0) != (b < 0))
    return q - adjust.astype(q.dtype)


def _float_floor_div(a, b):
    """PyTorch's div_floor_floating: Python semantics, exact for quotients of representable values."""
    mod = jnp.fmod(a, b)
    div = (a - mod) / b
    div = jnp.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    floordiv = jnp.floor(div)
    floordiv = jnp.where(div - floordiv > 0.5, floordiv + 1, floordiv)
    floordiv = jnp.where(div == 0, jnp.copysign(jnp.zeros_like(div), a / b), floordiv)
    return jnp.where(b == 0, a / b, floordiv)


def promote_broadcast(*xs):
    """promote, then broadcast: lax.div/rem/shift do not broadcast like jnp operators do."""
    return jnp.broadcast_arrays(*promote(*xs))


def floor_div(a, b):
    a, b = promote_broadcast(a, b)
    if category(a.dtype) < 2:
        if a.dtype == jnp.bool_:
            a, b = a.astype(jnp.int8), b.astype(jnp.int8)
        return _int_floor_div(a, b)
    return _float_floor_div(a, b)


def trunc_div(a, b):
    dt = result_type(a, b)
    a, b = promote_broadcast(a, b)
    if category(a.dtype) < 2:
        if a.dtype == jnp.bool_:
            a, b = a.astype(jnp.int8), b.astype(jnp.int8)
        return lax.div(a, b)
    # PyTorch CPU rounds a bfloat16/float16 quotient to its dtype before truncating it
    return jnp.trunc((a / b).astype(dt))


@lowers("aten::div.Tensor", "aten::div.Scalar")
def div(x, other):
    x, other = keep_nan(*zip((x, other), to_float(x, other)))
    return x / other


# CompositeImplicit aliases of div that reach traced graphs unexpanded: a decomposition that works on
# SymInt-derived values (interpolate's scale under dynamic shapes) emits `true_divide`
lowers("aten::true_divide.Tensor", "aten::true_divide.Scalar", graph=True)(div)


@lowers("aten::div.Tensor_mode", "aten::div.Scalar_mode")
def div_mode(x, other, rounding_mode=None):
    if rounding_mode is None:
        return div(x, other)
    if rounding_mode == "trunc":
        return trunc_div(x, other)
    if rounding_mode == "floor":
        return floor_div(x, other)
    raise ValueError(
        f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '{rounding_mode}'"
    )


@lowers("aten::floor_divide", "aten::floor_divide.Scalar")
def floor_divide(x, other):
    return floor_div(x, other)


@lowers("aten::remainder.Tensor", "aten::remainder.Scalar", "aten::remainder.Scalar_Tensor")
def remainder(x, other):
    """Python-style remainder: the result takes the divisor's sign."""
    x, other = promote_broadcast(x, other)
    mod = lax.rem(x, other) if category(x.dtype) == 1 else jnp.fmod(x, other)
    fix = (mod != 0) & ((other < 0) != (mod < 0))
    return jnp.where(fix, mod + other, mod)


@lowers("aten::fmod.Tensor", "aten::fmod.Scalar")
def fmod(x, other):
    """C-style remainder: the result takes the dividend's sign."""
    x, other = promote_broadcast(x, other)
    return lax.rem(x, other) if category(x.dtype) == 1 else jnp.fmod(x, other)


# -- powers -------------------------------------------------------------------------------------------
def _int_pow(base, exp):
    """Integer power by squaring with PyTorch's negative-exponent rule (1, -1 -> +-1; others -> 0)."""
    bits = jnp.iinfo(exp.dtype).bits

    def step(_, carry):
        result, b, e = carry
        result = jnp.where((e & 1) == 1, result * b, result)
        return result, b * b, e >> 1

    e = jnp.maximum(exp, 0)
    result, _, _ = lax.fori_loop(0, bits, step, (jnp.ones_like(base * e), base * jnp.ones_like(e), e))
    negative = jnp.where(base == 1, 1, jnp.where(base == -1, 1 - 2 * (exp & 1), 0)).astype(result.dtype)
    return jnp.where(exp < 0, negative, result)


def pow_values(base, exp):
    base, exp = promote(base, exp)
    if base.dtype == jnp.bool_:
        return base | (exp == 0)  # torch's bool pow: 1 ** e, b ** 0
    if category(base.dtype) == 1:
        return _int_pow(base, exp)
    return jnp.power(base, exp)


# PyTorch CPU evaluates these exponents with dedicated formulas (exact x*x, sqrt, rsqrt, reciprocal),
# which differ from pow() in the last ulp and on signed zeros/infinities (e.g. (-0.) ** -0.5 = -inf).
_SPECIAL_EXPONENTS = {
    0: lambda x: jnp.ones_like(x),
    1: lambda x: x,
    2: lambda x: x * x,
    3: lambda x: x * x * x,
    0.5: jnp.sqrt,
    -0.5: lax.rsqrt,
    -1: lambda x: 1 / x,
    -2: lambda x: 1 / (x * x),
}


@lowers("aten::pow.Tensor_Tensor", "aten::pow.Scalar")
def pow_(x, exponent):
    return pow_values(x, exponent)


@lowers("aten::pow.Tensor_Scalar", static_scalars=True)
def pow_tensor_scalar(x, exponent):
    """The exponent is static: pick PyTorch's special-cased formulas and reject int ** negative int."""
    if category(dtype_of(x)) <= 1 and type(exponent) is int and exponent < 0:
        raise RuntimeError("Integers to negative integer powers are not allowed.")
    x, _ = promote(x, exponent)
    if category(x.dtype) == 2 and not isinstance(exponent, complex) and exponent in _SPECIAL_EXPONENTS:
        return _SPECIAL_EXPONENTS[exponent](x)
    return pow_values(x, exponent)


@lowers("aten::reciprocal")
def reciprocal(x):
    (x,) = to_float(x)
    return 1 / x


@lowers("aten::sqrt")
def sqrt(x):
    (x,) = to_float(x)
    return jnp.sqrt(x)


@lowers("aten::rsqrt")
def rsqrt(x):
    (x,) = to_float(x)
    return lax.rsqrt(x)


# -- sign and magnitude -------------------------------------------------------------------------------
@lowers("aten::neg")
def neg(x):
    return -x


@lowers("aten::abs")
def abs_(x):
    return jnp.abs(x) if x.dtype != jnp.bool_ else x


@lowers("aten::sign")
def sign(x):
    """(0 < x) - (x < 0): NaN maps to 0 as on PyTorch CPU."""
    if x.dtype == jnp.bool_:
        return x
    return (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)


@lowers("aten::sgn")
def sgn(x):
    if category(x.dtype) < 3:
        return sign(x)
    mag = jnp.abs(x)
    return jnp.where(mag == 0, jnp.zeros_like(x), x / jnp.where(mag == 0, 1, mag).astype(x.dtype))


@lowers("aten::signbit")
def signbit(x):
    return (
        jnp.signbit(x) if category(x.dtype) == 2 else (x < 0 if x.dtype != jnp.bool_ else jnp.zeros_like(x))
    )


@lowers("aten::copysign.Tensor", "aten::copysign.Scalar")
def copysign(x, other):
    x, other = to_float(x, other)
    return jnp.copysign(x, other)


@lowers("aten::angle")
def angle(x):
    if category(x.dtype) == 3:
        return jnp.angle(x)
    (x,) = to_float(x)
    return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, jnp.pi, 0).astype(x.dtype))


@lowers("aten::_conj_physical")
def conj_physical(x):
    return jnp.conj(x) if category(x.dtype) == 3 else x


# -- exponentials, logarithms, trigonometry -----------------------------------------------------------
for _name, _fn in {
    "exp": jnp.exp,
    "exp2": jnp.exp2,
    "expm1": jnp.expm1,
    "log": jnp.log,
    "log2": jnp.log2,
    "log10": jnp.log10,
    "log1p": jnp.log1p,
    "sin": jnp.sin,
    "cos": jnp.cos,
    "tan": jnp.tan,
    "asin": jnp.arcsin,
    "acos": jnp.arccos,
    "atan": jnp.arctan,
    "sinh": jnp.sinh,
    "cosh": jnp.cosh,
    "tanh": jnp.tanh,
    "asinh": jnp.arcsinh,
    "acosh": jnp.arccosh,
    "atanh": jnp.arctanh,
    "erf": lax.erf,
    "erfc": lax.erfc,
    "erfinv": lax.erf_inv,
    "sigmoid": lambda x: 1 / (1 + jnp.exp(-x)),
    "deg2rad": lambda x: x * (math.pi / 180),
    "rad2deg": lambda x: x * (180 / math.pi),
    "sinc": lambda x: jnp.where(x == 0, jnp.ones_like(x), jnp.sin(math.pi * x) / (math.pi * x)),
}.items():
    unary_float(_name, _fn)


@lowers("aten::atan2")
def atan2(x, other):
    x, other = to_float(x, other)
    return jnp.arctan2(x, other)


@lowers("aten::hypot")
def hypot(x, other):
    x, other = to_float(x, other)
    return jnp.hypot(x, other)


@lowers("aten::logaddexp")
def logaddexp(x, other):
    x, other = to_float(x, other)
    m = jnp.maximum(x, other)
    both_inf = jnp.isinf(x) & (x == other)
    return jnp.where(both_inf, x, m + jnp.log1p(jnp.exp(-jnp.abs(x - other))))


@lowers("aten::logaddexp2")
def logaddexp2(x, other):
    x, other = to_float(x, other)
    m = jnp.maximum(x, other)
    both_inf = jnp.isinf(x) & (x == other)
    return jnp.where(both_inf, x, m + jnp.log1p(jnp.exp2(-jnp.abs(x - other))) / math.log(2))


@lowers("aten::logit")
def logit(x, eps=None):
    (x,) = to_float(x)
    if eps is not None:
        x = jnp.clip(x, eps, 1 - eps)
    return jnp.log(x / (1 - x))


def xlogy_like(x, y, log_fn):
    x, y = to_float(x, y)
    out = jnp.where(x == 0, jnp.zeros_like(x * y), x * log_fn(y))
    return jnp.where(jnp.isnan(y), y, out)


@lowers("aten::xlogy.Tensor", "aten::xlogy.Scalar_Self", "aten::xlogy.Scalar_Other")
def xlogy(x, y):
    return xlogy_like(x, y, jnp.log)


@lowers("aten::nextafter")
def nextafter(x, other):
    x, other = promote(x, other)
    return jnp.nextafter(x, other)


@lowers("aten::ldexp.Tensor")
def ldexp(x, other):
    x, other = to_float(x, other)
    return x * jnp.exp2(other)


@lowers("aten::frexp.Tensor")
def frexp(x):
    mantissa, exponent = jnp.frexp(x)
    return mantissa, exponent.astype(jnp.int32)


@lowers("aten::gcd")
def gcd(x, other):
    x, other = promote(x, other)
    return jnp.gcd(x, other)


@lowers("aten::lcm")
def lcm(x, other):
    x, other = promote(x, other)
    return jnp.lcm(x, other)


@lowers("aten::heaviside")
def heaviside(x, values):
    x, values = promote(x, values)
    return jnp.where(x == 0, values, (x > 0).astype(x.dtype))


# -- rounding -----------------------------------------------------------------------------------------
def _rounding(name: str, fn):
    """Integers and bools are already whole: rounding returns them unchanged."""

    def lowering(x):
        if category(x.dtype) < 2:
            return x
        dt = x.dtype
        return fn(cast(x, opmath(dt)))

    lowering.__name__ = name
    lowers(f"aten::{name}")(lowering)


for _name, _fn in {
    "floor": jnp.floor,
    "ceil": jnp.ceil,
    "trunc": jnp.trunc,
    "round": jnp.round,  # half to even, as PyTorch
    "frac": lambda x: x - jnp.trunc(x),
}.items():
    _rounding(_name, _fn)


@lowers("aten::round.decimals")
def round_decimals(x, decimals=0):
    if category(x.dtype) < 2:
        return x
    (x,) = to_float(x)
    scale = 10.0 ** abs(decimals)
    if decimals >= 0:
        return jnp.round(x * scale) / scale
    return jnp.round(x / scale) * scale


@lowers("aten::nan_to_num")
def nan_to_num(x, nan=None, posinf=None, neginf=None):
    """Replacements are rounded to x's own dtype; infinities default to its largest finite values."""
    if category(x.dtype) != 2:
        return x
    info = jnp.finfo(x.dtype)
    nan = 0.0 if nan is None else nan
    posinf = info.max if posinf is None else posinf
    neginf = info.min if neginf is None else neginf
    x = jnp.where(jnp.isnan(x), jnp.asarray(nan, x.dtype), x)
    x = jnp.where(x == jnp.inf, jnp.asarray(posinf, x.dtype), x)
    return jnp.where(x == -jnp.inf, jnp.asarray(neginf, x.dtype), x)


# -- fused multiply-adds ------------------------------------------------------------------------------
@lowers("aten::lerp.Scalar", "aten::lerp.Tensor")
def lerp(x, end, weight):
    """PyTorch's two-sided formula: exact at weight 0 and weight 1."""
    x, end, weight = promote(x, end, weight)
    diff = end - x
    return jnp.where(jnp.abs(weight) < 0.5, x + weight * diff, end - diff * (1 - weight))


@lowers("aten::addcmul")
def addcmul(x, tensor1, tensor2, value=1):
    x, tensor1, tensor2, value = promote(x, tensor1, tensor2, value)
    return x + value * tensor1 * tensor2


@lowers("aten::addcdiv")
def addcdiv(x, tensor1, tensor2, value=1):
    x, tensor1, tensor2, value = promote(x, tensor1, tensor2, value)
    return x + value * tensor1 / tensor2
