"""Pointwise lowerings (arithmetic, math, comparisons, activations and their backwards) vs CPU PyTorch."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

aten = torch.ops.aten
DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.bool]
FLOATS = [torch.float32, torch.bfloat16]
# the default suite runs every op in float32 (plus the dtype smoke tests below); `-m slow` runs the
# whole dtype matrix (each case compiles its own executables, which a 2-core CI box pays for)
SLOW = pytest.mark.slow
MATRIX = [torch.float32] + [pytest.param(d, marks=SLOW) for d in DTYPES[1:]]
FLOAT_MATRIX = [torch.float32, pytest.param(torch.bfloat16, marks=SLOW)]

# values that exercise rounding ties, signed zeros and non-finite numbers
_SPECIAL = [
    0.0,
    -0.0,
    0.5,
    -0.5,
    1.5,
    -1.5,
    2.5,
    -2.5,
    1.0,
    -1.0,
    3.0,
    -3.0,
    float("nan"),
    float("inf"),
    -float("inf"),
]


def make(shape, dtype, *, seed=0, special=True, positive=False, nonzero=False, low=-6, high=6):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if not dtype.is_floating_point:
        t = torch.randint(low, high, shape, generator=g, dtype=dtype)
        if positive:
            t = t.abs()
        if nonzero or positive:
            t = torch.where(t == 0, torch.ones_like(t), t)
        return t
    t = torch.randn(shape, generator=g) * 3
    if special and t.numel() >= len(_SPECIAL):
        t.view(-1)[: len(_SPECIAL)] = torch.tensor(_SPECIAL)
    if positive:
        t = t.abs()
    if nonzero:
        t = torch.where(t == 0, torch.ones_like(t), t)
    return t.to(dtype)


def tol(dtype):
    if dtype in (torch.bfloat16, torch.float16):
        return dict(rtol=1.6e-2, atol=1e-2)
    if dtype.is_floating_point or dtype.is_complex:
        return dict(rtol=2e-5, atol=1e-5)
    return dict(rtol=0, atol=0)


def to_tpu(v):
    if isinstance(v, torch.Tensor):
        return v.to("tpu")
    if isinstance(v, list | tuple):
        return type(v)(to_tpu(x) for x in v)
    return v


def assert_same(actual, expected, **kw):
    if isinstance(expected, list | tuple):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e, **kw)
        return
    if not isinstance(expected, torch.Tensor):
        assert actual == expected
        return
    assert actual.device.type == "tpu"
    actual = actual.cpu()
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape
    t = {**tol(expected.dtype), **kw}
    torch.testing.assert_close(actual, expected, equal_nan=True, **t)


def check(fn, *args, **kw):
    """fn on CPU and on tpu agree; if CPU raises, tpu raises too."""
    try:
        expected = fn(*args)
    except Exception as exc:  # noqa: BLE001 - CPU rejects the inputs: tpu must as well
        if "not implemented for" in str(exc):
            return None  # a dtype CPU's kernel lacks (abs of bool): tpu may compute it
        with pytest.raises(type(exc)):
            fn(*to_tpu(args))
        return None
    actual = fn(*to_tpu(args))
    assert_same(actual, expected, **kw)
    return actual


# -- unary math -------------------------------------------------------------------------------------------
UNARY = {
    "abs": torch.abs,
    "neg": torch.neg,
    "sign": torch.sign,
    "sgn": torch.sgn,
    "exp": torch.exp,
    "exp2": torch.exp2,
    "expm1": torch.expm1,
    "log": torch.log,
    "log2": torch.log2,
    "log10": torch.log10,
    "log1p": torch.log1p,
    "sin": torch.sin,
    "cos": torch.cos,
    "tan": torch.tan,
    "asin": torch.asin,
    "acos": torch.acos,
    "atan": torch.atan,
    "sinh": torch.sinh,
    "cosh": torch.cosh,
    "tanh": torch.tanh,
    "asinh": torch.asinh,
    "acosh": torch.acosh,
    "atanh": torch.atanh,
    "erf": torch.erf,
    "erfc": torch.erfc,
    "erfinv": torch.erfinv,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "reciprocal": torch.reciprocal,
    "sigmoid": torch.sigmoid,
    "floor": torch.floor,
    "ceil": torch.ceil,
    "round": torch.round,
    "round_decimals": lambda x: torch.round(x, decimals=1),
    "round_neg_decimals": lambda x: torch.round(x * 100, decimals=-1),
    "trunc": torch.trunc,
    "frac": torch.frac,
    "square": torch.square,
    "lgamma": torch.lgamma,
    "digamma": torch.digamma,
    "i0": torch.i0,
    "deg2rad": torch.deg2rad,
    "rad2deg": torch.rad2deg,
    "sinc": torch.sinc,
    "signbit": torch.signbit,
    "nan_to_num": torch.nan_to_num,
    "nan_to_num_args": lambda x: torch.nan_to_num(x, nan=1.5, posinf=2.0, neginf=-3.0),
    "logit": torch.logit,
    "logit_eps": lambda x: torch.logit(x, eps=0.25),
    "isnan": torch.isnan,
    "isinf": torch.isinf,
    "isfinite": torch.isfinite,
    "isposinf": torch.isposinf,
    "isneginf": torch.isneginf,
    "logical_not": torch.logical_not,
    "bitwise_not": torch.bitwise_not,
    "angle": torch.angle,
    "relu": torch.relu,
}


@pytest.mark.parametrize("dtype", MATRIX, ids=str)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(name, dtype):
    x = make((4, 5), dtype)
    if name in ("logit", "logit_eps", "erfinv", "asin", "acos", "atanh") and dtype.is_floating_point:
        x = torch.rand(4, 5, generator=torch.Generator().manual_seed(1)).to(dtype) * 2 - 1
        if name.startswith("logit"):
            x = (x + 1) / 2
    kw = {}
    if name in ("lgamma", "digamma", "i0", "tan") and dtype == torch.bfloat16:
        kw = dict(rtol=3e-2, atol=3e-2)
    if name in ("digamma", "lgamma") and dtype == torch.float32:
        kw = dict(rtol=1e-4, atol=1e-4)
    check(UNARY[name], x, **kw)


def test_unary_special_values():
    """Signed zeros, infinities and NaN go through the transcendental ops like on CPU."""
    x = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-30, -1e30, 88.0, -104.0])
    for fn in (
        torch.exp,
        torch.expm1,
        torch.log1p,
        torch.tanh,
        torch.sigmoid,
        torch.sqrt,
        torch.rsqrt,
        torch.atan,
    ):
        check(fn, x)
    check(torch.digamma, torch.tensor([0.0, -0.0, -1.0, 1.0]))


# -- binary arithmetic -------------------------------------------------------------------------------------
BINARY = {
    "add": torch.add,
    "add_alpha": lambda x, y: torch.add(x, y, alpha=2),
    "sub": torch.sub,
    "sub_alpha": lambda x, y: torch.sub(x, y, alpha=3),
    "rsub": torch.rsub,
    "mul": torch.mul,
    "div": torch.div,
    "div_trunc": lambda x, y: torch.div(x, y, rounding_mode="trunc"),
    "div_floor": lambda x, y: torch.div(x, y, rounding_mode="floor"),
    "true_divide": torch.true_divide,
    "floor_divide": torch.floor_divide,
    "remainder": torch.remainder,
    "fmod": torch.fmod,
    "pow": torch.pow,
    "atan2": torch.atan2,
    "hypot": torch.hypot,
    "logaddexp": torch.logaddexp,
    "logaddexp2": torch.logaddexp2,
    "xlogy": torch.xlogy,
    "copysign": torch.copysign,
    "minimum": torch.minimum,
    "maximum": torch.maximum,
    "fmin": torch.fmin,
    "fmax": torch.fmax,
    "eq": torch.eq,
    "ne": torch.ne,
    "lt": torch.lt,
    "le": torch.le,
    "gt": torch.gt,
    "ge": torch.ge,
    "logical_and": torch.logical_and,
    "logical_or": torch.logical_or,
    "logical_xor": torch.logical_xor,
    "bitwise_and": torch.bitwise_and,
    "bitwise_or": torch.bitwise_or,
    "bitwise_xor": torch.bitwise_xor,
    "heaviside": torch.heaviside,
    "nextafter": torch.nextafter,
    "gcd": torch.gcd,
    "lcm": torch.lcm,
}
_DIVISIONS = {"div", "div_trunc", "div_floor", "true_divide", "floor_divide", "remainder", "fmod"}


def _binary_inputs(name, dtype):
    x = make((3, 4), dtype, seed=1)
    y = make((3, 4), dtype, seed=2, nonzero=name in _DIVISIONS and not dtype.is_floating_point)
    if name == "pow" and not dtype.is_floating_point and dtype != torch.bool:
        y = make((3, 4), dtype, seed=2, low=-2, high=5)
    return x, y


@pytest.mark.parametrize("dtype", MATRIX, ids=str)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary(name, dtype):
    x, y = _binary_inputs(name, dtype)
    kw = dict(rtol=1e-4, atol=1e-5) if name in ("pow", "logaddexp2") and dtype == torch.float32 else {}
    check(BINARY[name], x, y, **kw)
    # broadcasting: a row against the matrix, both ways
    check(BINARY[name], x, y[:1], **kw)
    check(BINARY[name], x[:, :1], y, **kw)


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.int64, *[pytest.param(d, marks=SLOW) for d in DTYPES[1::2]]], ids=str
)
@pytest.mark.parametrize(
    "name",
    ["add", "sub", "mul", "div", "div_floor", "div_trunc", "remainder", "fmod", "pow", "eq", "lt", "ge"],
)
def test_binary_python_scalar(name, dtype):
    """Wrapped numbers take part in type promotion with the lowest priority (int tensor * 0.5 is float)."""
    for scalar in (2, -3, 0.5, -1.5, True):
        _check_python_scalar(name, dtype, scalar)


def _check_python_scalar(name, dtype, scalar):
    x = make((3, 4), dtype, seed=3)
    fn = BINARY[name]
    if not (name == "pow" and scalar is True):  # torch's meta says int64 there, CPU returns bool
        check(lambda t: fn(t, scalar), x)
    if name not in ("div_floor", "div_trunc") and not (name in ("remainder", "fmod") and dtype == torch.bool):
        y = make((3, 4), dtype, seed=4, nonzero=True)
        check(lambda t: fn(scalar, t) if name != "pow" else torch.pow(scalar, t), y)


def test_zero_dim_tensor_promotion():
    """A 0-dim tensor does not widen a dimensioned one of the same category (f32 + f64 scalar = f32)."""
    x = make((5,), torch.float32)
    check(torch.add, x, torch.tensor(1.25, dtype=torch.float64))
    check(torch.mul, make((5,), torch.int64), torch.tensor(0.5))
    check(torch.floor_divide, torch.tensor([-7, 7, -128], dtype=torch.int8), torch.tensor(2))
    check(torch.add, make((5,), torch.bfloat16), torch.tensor(0.1))


def test_integer_division_conventions():
    a = torch.tensor([7, -7, 7, -7, 0, 6, -6])
    b = torch.tensor([2, 2, -2, -2, 3, -4, 4])
    for fn in (
        torch.floor_divide,
        torch.remainder,
        torch.fmod,
        lambda x, y: torch.div(x, y, rounding_mode="trunc"),
        lambda x, y: torch.div(x, y, rounding_mode="floor"),
        torch.div,
    ):
        check(fn, a, b)
    af, bf = a.float() + 0.5, b.float()
    for fn in (
        torch.floor_divide,
        torch.remainder,
        torch.fmod,
        lambda x, y: torch.div(x, y, rounding_mode="floor"),
    ):
        check(fn, af, bf)
    # float division by zero: inf/nan like CPU, and floor of exact quotients stays exact
    check(lambda x, y: torch.div(x, y, rounding_mode="floor"), torch.tensor([1.0, -1.0, 0.0]), torch.zeros(3))
    check(torch.floor_divide, torch.tensor([0.3, -0.3, 1e8]), torch.tensor([0.1, 0.1, 3.0]))
    # operands of different ranks and 0-dim ones broadcast (lax.div/rem do not by themselves)
    for fn in (torch.floor_divide, torch.remainder, torch.fmod, torch.bitwise_left_shift):
        check(fn, a.view(7, 1), b.abs())
        check(fn, a, torch.tensor(3))
        check(fn, torch.tensor(-9), b.abs())
    # a large int64 dividend is divided exactly, not through float
    check(torch.floor_divide, torch.tensor([2**62 + 1, -(2**62) - 1]), torch.tensor([3, 3]))


def test_integer_pow():
    base = torch.tensor([2, 3, -1, -1, 1, 0, 0, -2, 5])
    exp = torch.tensor([-1, 2, -3, -2, -2, -1, 0, 3, 20])
    check(torch.pow, base, exp)
    check(lambda t: t**2, base)
    check(lambda t: 2**t, exp.clamp(min=0))
    check(torch.pow, base.to(torch.int32), exp.to(torch.int32))
    check(torch.pow, torch.tensor([2**31, 3]), torch.tensor([2, 40]))  # wraps around like int64 on CPU


def test_float_pow_special_exponents():
    x = make((6, 5), torch.float32, seed=5)
    for e in (2, 0.5, -1, 3, 1, 0, -0.5, 2.5, -2):
        check(lambda t, e=e: t**e, x, rtol=1e-6, atol=0)
    check(torch.pow, torch.tensor([-2.0, -2.0, 0.0, -0.0]), torch.tensor([3.0, 0.5, -1.0, -1.0]))
    check(lambda t: torch.pow(2.0, t), x)


def test_round_half_to_even_and_decimals():
    x = torch.tensor([0.5, 1.5, 2.5, -0.5, -2.5, 0.125, 1.005, 12345.5, -0.0])
    check(torch.round, x)
    for d in (0, 1, 2, -1, -2):
        check(lambda t, d=d: torch.round(t, decimals=d), x * 7)


# -- clamp, min/max, where ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.int64, pytest.param(torch.bfloat16, marks=SLOW)], ids=str
)
def test_clamp(dtype):
    x = make((4, 5), dtype, seed=6)
    check(lambda t: torch.clamp(t, -2, 3), x)
    check(lambda t: torch.clamp(t, min=1), x)
    check(lambda t: torch.clamp(t, max=-1), x)
    check(lambda t: torch.clamp(t, 4, 2), x)  # min > max: everything becomes max
    check(lambda t: torch.clamp(t, 0.5, 2.5), x)  # float bounds promote an int tensor
    check(lambda t: torch.clamp_min(t, 0), x)
    check(lambda t: torch.clamp_max(t, 0), x)
    lo, hi = make((1, 5), dtype, seed=7), make((4, 1), dtype, seed=8)
    check(torch.clamp, x, lo, hi)
    check(lambda t, a: torch.clamp(t, min=a), x, lo)
    check(lambda t, a: torch.clamp(t, max=a), x, hi)
    check(torch.clamp_min, x, lo)
    check(torch.clamp_max, x, hi)
    check(lambda t: torch.clip(t, -1, 1), x)


def test_nan_propagation_min_max():
    a = torch.tensor([1.0, float("nan"), 2.0, float("nan"), -0.0])
    b = torch.tensor([float("nan"), 1.0, 3.0, float("nan"), 0.0])
    for fn in (torch.minimum, torch.maximum, torch.fmin, torch.fmax, torch.max, torch.min):
        check(fn, a, b)
    check(lambda t: torch.clamp(t, 0, 1), a)
    check(torch.relu, a)


@pytest.mark.parametrize("dtype", MATRIX, ids=str)
def test_where(dtype):
    cond = make((3, 4), torch.bool, seed=9)
    x, y = make((3, 4), dtype, seed=10), make((1, 4), dtype, seed=11)
    check(torch.where, cond, x, y)
    check(lambda c, t: torch.where(c, t, 0), cond, x)
    check(lambda c, t: torch.where(c, 1.5, t), cond, x)
    check(torch.where, cond, make((3, 4), torch.float32), make((3, 4), torch.int64))


# -- shifts, lerp, fused ops ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "dtype",
    [torch.int64, torch.uint8, *[pytest.param(d, marks=SLOW) for d in (torch.int32, torch.int8)]],
    ids=str,
)
def test_shifts(dtype):
    if dtype == torch.uint8:
        x = torch.tensor([1, 2, 255, 128, 7, 0], dtype=dtype)
        s = torch.tensor([1, 7, 8, 9, 3, 1], dtype=dtype)
    else:
        x = torch.tensor([1, -1, 3, -8, 100, -100], dtype=dtype)
        bits = torch.iinfo(dtype).bits
        s = torch.tensor([1, 3, bits, -1, bits - 1, bits + 5], dtype=dtype)
    check(torch.bitwise_left_shift, x, s)
    check(torch.bitwise_right_shift, x, s)
    check(lambda t: t << 2, x)
    check(lambda t: t >> 1, x)
    check(lambda t, u: t << u, x, s)
    check(lambda t, u: t >> u, x, s)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_lerp_addcmul_addcdiv(dtype):
    x, end = make((3, 4), dtype, seed=12, special=False), make((3, 4), dtype, seed=13, special=False)
    w = torch.rand(3, 4, generator=torch.Generator().manual_seed(14)).to(dtype)
    check(torch.lerp, x, end, w)
    check(lambda a, b: torch.lerp(a, b, 0.3), x, end)
    check(lambda a, b: torch.lerp(a, b, 0.8), x, end)
    check(lambda a, b: torch.lerp(a, b, 1.0), x, end)
    check(torch.lerp, x, end[:1], w[:, :1])
    check(lambda a, b, c: torch.addcmul(a, b, c, value=0.5), x, end, w)
    check(lambda a, b, c: torch.addcdiv(a, b, c + 1, value=-2), x, end, w)
    check(torch.addcmul, x, end[:1], w[:, :1])


def test_addcmul_int():
    x, y, z = (make((3, 4), torch.int64, seed=s) for s in (15, 16, 17))
    check(lambda a, b, c: torch.addcmul(a, b, c, value=3), x, y, z)


def test_polygamma_and_zeta_follow_cephes():
    """PyTorch's zeta/polygamma are defined at negative non-integer arguments (reflection), inf at poles."""
    x = torch.tensor([-8.4784, -0.5, 0.3, 1.0, 2.5, 10.0, -3.0, 0.0])
    for n in (0, 1, 2, 3):
        check(lambda t, n=n: torch.polygamma(n, t), x, rtol=1e-4, atol=1e-4)
    s = torch.tensor([9.0, 0.0, 2.0, 3.0, 1.0, 0.5, 4.0])
    q = torch.tensor([0.0, 5.0, -2.5, 0.5, 3.0, 2.0, -1.0])
    check(torch.special.zeta, s, q, rtol=1e-5, atol=0)


def test_xlogy_and_scalars():
    x = torch.tensor([0.0, 0.0, 1.0, 2.0, 0.0, 3.0])
    y = torch.tensor([0.0, float("nan"), 0.0, 3.0, -1.0, float("inf")])
    check(torch.xlogy, x, y)
    check(lambda t: torch.xlogy(t, 2.0), x)
    check(lambda t: torch.xlogy(2.0, t), y)
    check(torch.special.xlog1py, x, y)


@pytest.mark.parametrize(
    "fn",
    [
        lambda d: torch.ones(3, dtype=torch.complex64, device=d).mul_(1j),
        lambda d: torch.ones(3, dtype=torch.complex64, device=d).add(1j),
        lambda d: torch.arange(3.0, device=d) * (2 - 1j),
        lambda d: torch.arange(3, device=d) * (2 - 1j),
        lambda d: torch.ones(3, dtype=torch.complex128, device=d) * (1 + 1e-9j),
        lambda d: torch.where(torch.tensor([True, False], device=d), torch.ones(2, device=d), 3j),
        lambda d: torch.ones(3, dtype=torch.complex64, device=d) ** (0.5 + 0.5j),
    ],
)
def test_python_complex_scalars(fn):
    """A Python complex where a tensor goes (`t * 1j`) is a wrapped number, as ints and floats are."""
    expected = fn("cpu")
    got = fn("tpu").cpu()
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got, expected)


def test_python_complex_scalars_after_a_kernel_traces_its_scalars():
    """A kernel that has seen many distinct scalars takes them as traced inputs; complex ones stay baked
    into its executables (both sides of the cache key must agree)."""
    cond, ones = torch.tensor([True, False]), torch.ones(2)
    c, o = cond.to("tpu"), ones.to("tpu")
    for v in range(40):
        torch.where(c, o, v + 0.5)
        o * (v + 0.25)
    torch.testing.assert_close(torch.where(c, o, 3j).cpu(), torch.where(cond, ones, 3j))
    torch.testing.assert_close((o * (2 - 1j)).cpu(), ones * (2 - 1j))


def test_complex64():
    z = torch.randn(3, 4, dtype=torch.complex64, generator=torch.Generator().manual_seed(18))
    w = torch.randn(3, 4, dtype=torch.complex64, generator=torch.Generator().manual_seed(19))
    for fn in (torch.add, torch.mul, torch.div, torch.sub, torch.eq):
        check(fn, z, w)
    for fn in (
        torch.exp,
        torch.abs,
        torch.sgn,
        torch.angle,
        torch.sqrt,
        torch.neg,
        torch.tanh,
        torch.sigmoid,
    ):
        check(fn, z)
    check(lambda t: t * 2.5, z)
    check(lambda t: t.conj_physical(), z)


# -- in-place and out= variants ----------------------------------------------------------------------------
INPLACE = {
    "add_": lambda t, u: t.add_(u, alpha=2),
    "sub_": lambda t, u: t.sub_(u),
    "mul_": lambda t, u: t.mul_(u),
    "div_": lambda t, u: t.div_(u),
    "div_floor_": lambda t, u: t.div_(u, rounding_mode="floor"),
    "pow_": lambda t, u: t.pow_(2),
    "clamp_": lambda t, u: t.clamp_(-1, 1),
    "clamp_min_": lambda t, u: t.clamp_min_(0.5),
    "lerp_": lambda t, u: t.lerp_(u, 0.25),
    "addcmul_": lambda t, u: t.addcmul_(u, u, value=-0.5),
    "addcdiv_": lambda t, u: t.addcdiv_(u, u.abs() + 1, value=0.1),
    "exp_": lambda t, u: t.exp_(),
    "sigmoid_": lambda t, u: t.sigmoid_(),
    "relu_": lambda t, u: t.relu_(),
    "neg_": lambda t, u: t.neg_(),
    "sqrt_": lambda t, u: t.abs_().sqrt_(),
    "round_": lambda t, u: t.round_(),
    "floor_": lambda t, u: t.floor_(),
    "maximum_": lambda t, u: t.copy_(torch.maximum(t, u)),
    "eq_": lambda t, u: t.eq_(u),
    "lt_": lambda t, u: t.lt_(0),
    "masked_where_": lambda t, u: t.mul_(u > 0),
    "int_into_float_": lambda t, u: t.add_(torch.ones_like(u, dtype=torch.int64)),
}


@pytest.mark.parametrize("name", sorted(INPLACE))
def test_inplace(name):
    fn = INPLACE[name]
    x, y = (
        make((3, 4), torch.float32, seed=20, special=False),
        make((3, 4), torch.float32, seed=21, special=False),
    )
    xt, yt = x.to("tpu"), y.to("tpu")
    ret = fn(xt, yt)
    fn(x, y)
    assert ret is xt
    assert_same(xt, x)


def test_inplace_through_view_and_broadcast():
    x = make((4, 6), torch.float32, seed=22, special=False)
    xt = x.to("tpu")
    xt[:, 1:3].mul_(10)
    xt.t()[2].add_(1)
    xt.view(-1)[::5].clamp_(max=0)
    x[:, 1:3].mul_(10)
    x.t()[2].add_(1)
    x.view(-1)[::5].clamp_(max=0)
    assert_same(xt, x)
    row = make((6,), torch.float32, seed=23)
    xt.sub_(row.to("tpu"))
    x.sub_(row)
    assert_same(xt, x)


def test_inplace_dtype_errors_match_cpu():
    """An in-place op whose result type cannot be stored (int tensor /= ...) is refused like on CPU."""
    check(lambda t: t.div_(2), torch.tensor([1, 2, 3]))
    check(lambda t: t.add_(1), torch.tensor([True, False]))


OUT = {
    "add": lambda a, b, out: torch.add(a, b, out=out),
    "mul": lambda a, b, out: torch.mul(a, b, out=out),
    "div": lambda a, b, out: torch.div(a, b, out=out),
    "remainder": lambda a, b, out: torch.remainder(a, b, out=out),
    "pow": lambda a, b, out: torch.pow(a, b, out=out),
    "exp": lambda a, b, out: torch.exp(a, out=out),
    "maximum": lambda a, b, out: torch.maximum(a, b, out=out),
    "clamp": lambda a, b, out: torch.clamp(a, -1, 1, out=out),
    "gelu": lambda a, b, out: torch._C._nn.gelu(a, out=out),
    "sigmoid": lambda a, b, out: torch.sigmoid(a, out=out),
    "where": lambda a, b, out: torch.where(a > b, a, b, out=out),
    "lerp": lambda a, b, out: torch.lerp(a, b, 0.5, out=out),
}


@pytest.mark.parametrize("name", sorted(OUT))
def test_out_variant(name):
    fn = OUT[name]
    a, b = (
        make((3, 4), torch.float32, seed=24, special=False),
        make((3, 4), torch.float32, seed=25, special=False),
    )
    out = torch.empty(3, 4)
    out_t = torch.empty(3, 4).to("tpu")
    ret = fn(a.to("tpu"), b.to("tpu"), out_t)
    fn(a, b, out)
    assert ret is out_t
    assert_same(out_t, out)
    # comparison results written into a float out, resized from a wrong shape
    out_t = torch.empty(7).to("tpu")
    torch.gt(a.to("tpu"), b.to("tpu"), out=out_t)
    assert_same(out_t, torch.gt(a, b).float())


def test_out_dtype_refused_like_cpu():
    a = torch.tensor([1.5, 2.5])
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch.add(a.to("tpu"), a.to("tpu"), out=torch.empty(2, dtype=torch.int64).to("tpu"))


# -- activations ------------------------------------------------------------------------------------------
ACTIVATIONS = {
    "relu": F.relu,
    "relu6": F.relu6,
    "gelu": lambda x: F.gelu(torch.where(x.isinf(), 0, x)),  # CPU (oneDNN): gelu(inf) = nan
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "mish": F.mish,
    "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid,
    "hardtanh": lambda x: F.hardtanh(x, -0.5, 2.0),
    "elu": lambda x: F.elu(x, alpha=0.7),
    "selu": F.selu,
    "celu": lambda x: F.celu(x, alpha=1.3),
    "leaky_relu": lambda x: F.leaky_relu(x, 0.2),
    "softplus": F.softplus,
    "softplus_beta": lambda x: F.softplus(x, beta=2, threshold=5),
    "threshold": lambda x: F.threshold(x, 0.5, -2.0),
    "logsigmoid": F.logsigmoid,
    "glu": F.glu,
    "glu_dim0": lambda x: F.glu(x, dim=0),
    "prelu": lambda x: F.prelu(x, torch.tensor([0.25, -0.1, 0.5, 1.0, 2.0])),
    "hardshrink": F.hardshrink,
    "softshrink": F.softshrink,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "tanhshrink": F.tanhshrink,
    "softsign": F.softsign,
}


@pytest.mark.parametrize("dtype", FLOAT_MATRIX, ids=str)
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_forward(name, dtype):
    x = make((4, 5), dtype, seed=26)
    fn = ACTIVATIONS[name]
    if name == "prelu":
        w = torch.tensor([0.25, -0.1, 0.5, 1.0, 2.0], dtype=dtype)
        check(F.prelu, x, w)
        return
    check(fn, x)


@pytest.mark.parametrize("name", sorted(set(ACTIVATIONS) - {"relu6"}))
def test_activation_backward(name):
    """Autograd through tpu: the backward ops (gelu_backward, ...) give CPU's gradients."""
    x = make((4, 6), torch.float32, seed=27, special=False)
    x.view(-1)[:6] = torch.tensor([0.0, 0.5, -3.0, 3.0, -0.5, 1.0])  # kinks of the piecewise ones
    grad = make(
        (4, 6) if not name.startswith("glu") else ((4, 3) if name == "glu" else (2, 6)),
        torch.float32,
        seed=28,
    )
    fn = ACTIVATIONS[name]
    extra = []
    if name == "prelu":
        w = torch.tensor([0.25, -0.1, 0.5, 1.0, 2.0, 0.3], requires_grad=True)
        fn = F.prelu
        extra = [w]

    def run(inp, g, *ws):
        inp = inp.detach().requires_grad_(True)
        ws = [w.detach().requires_grad_(True) for w in ws]
        out = fn(inp, *ws)
        out.backward(g)
        return [out.detach(), inp.grad, *(w.grad for w in ws)]

    expected = run(x, grad, *extra)
    actual = run(x.to("tpu"), grad.to("tpu"), *[w.to("tpu") for w in extra])
    assert_same(actual, expected)


def test_backward_ops_direct():
    """The backward kernels called directly, with their extra arguments."""
    g, x = (
        make((3, 5), torch.float32, seed=29, special=False),
        make((3, 5), torch.float32, seed=30, special=False),
    )
    y = torch.sigmoid(x)
    cases = [
        (aten.threshold_backward, (g, x, 0.3)),
        (aten.gelu_backward, (g, x)),
        (lambda a, b: aten.gelu_backward(a, b, approximate="tanh"), (g, x)),
        (aten.silu_backward, (g, x)),
        (aten.sigmoid_backward, (g, y)),
        (aten.tanh_backward, (g, torch.tanh(x))),
        (aten.hardtanh_backward, (g, x, -1.0, 1.0)),
        (aten.elu_backward, (g, 1.0, 1.0, 1.0, False, x)),
        (aten.elu_backward, (g, 0.5, 1.2, 0.9, True, F.elu(x, 0.5))),
        (aten.leaky_relu_backward, (g, x, 0.1, False)),
        (aten.softplus_backward, (g, x, 1.0, 20.0)),
        (aten.hardswish_backward, (g, x * 3)),
        (aten.hardsigmoid_backward, (g, x * 3)),
        (aten.mish_backward, (g, x)),
        (aten.glu_backward, (g[:, :2], x[:, :4], 1)),
        (aten.logit_backward, (g, y)),
        (lambda a, b: aten.logit_backward(a, b, 0.3), (g, y)),
        (aten._prelu_kernel_backward, (g, x, torch.full((5,), 0.2))),
    ]
    buffer = aten.log_sigmoid_forward(x)[1]
    check(aten.log_sigmoid_backward, g, x, buffer)
    for fn, args in cases:
        check(fn, *args)


def test_gelu_accuracy():
    """PyTorch CPU's exact GELU runs oneDNN's approximation (and maps inf to nan): we compare the
    float32 result with a float64 reference tightly and with CPU float32 loosely. Both forms keep
    PyTorch's formulas (1 + erf, 1 + tanh) and so their cancellation in the far negative tail, where
    values below ~5e-7 round to 0 (the erfc form is exact there but ~7x slower on XLA:CPU)."""
    x = torch.cat([torch.linspace(-8, 8, 161), torch.tensor([float("-inf"), float("nan")])])
    for approximate in ("none", "tanh"):
        actual = F.gelu(x.to("tpu"), approximate=approximate).cpu()
        reference = F.gelu(x.double(), approximate=approximate).float()
        if approximate == "none":
            torch.testing.assert_close(actual, reference, rtol=2e-6, atol=5e-7, equal_nan=True)
        expected = F.gelu(x, approximate=approximate)
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-6, equal_nan=True)
    assert F.gelu(torch.tensor([float("inf")]).to("tpu")).item() == float("inf")


# ops whose dtype handling differs most (promotion, integer conventions, opmath); the slow matrix runs all
SMOKE = {
    torch.bfloat16: [
        "add",
        "mul",
        "div",
        "pow",
        "remainder",
        "minimum",
        "lt",
        "copysign",
        "atan2",
        "logaddexp",
    ],
    torch.int64: [
        "add_alpha",
        "mul",
        "div",
        "div_floor",
        "div_trunc",
        "remainder",
        "fmod",
        "pow",
        "maximum",
        "eq",
        "bitwise_xor",
        "gcd",
    ],
    torch.bool: ["add", "mul", "div", "logical_xor", "bitwise_and", "eq", "maximum", "sub"],
}
SMOKE_UNARY = {
    torch.bfloat16: [
        "exp",
        "sigmoid",
        "round",
        "rsqrt",
        "erfinv",
        "sign",
        "isnan",
        "nan_to_num",
        "tanh",
        "relu",
    ],
    torch.int64: [
        "abs",
        "sign",
        "exp",
        "sqrt",
        "round",
        "frac",
        "reciprocal",
        "isinf",
        "bitwise_not",
        "relu",
    ],
    torch.bool: ["abs", "neg", "sign", "exp", "logical_not", "bitwise_not", "isnan", "relu", "floor"],
}


@pytest.mark.parametrize("dtype", DTYPES[1:], ids=str)
def test_dtype_smoke(dtype):
    """The non-float32 dtypes through a curated set of ops (the full matrix is `-m slow`)."""
    for name in SMOKE[dtype]:
        x, y = _binary_inputs(name, dtype)
        check(BINARY[name], x, y)
        check(BINARY[name], x, y[:1])
    for name in SMOKE_UNARY[dtype]:
        check(UNARY[name], make((4, 5), dtype))


def test_int_inputs_promote_to_float():
    x = torch.arange(-4, 5)
    for fn in (
        torch.exp,
        torch.sqrt,
        torch.sigmoid,
        torch.reciprocal,
        torch.div,
        torch.atan2,
        torch.copysign,
    ):
        if fn in (torch.div, torch.atan2, torch.copysign):
            check(fn, x, torch.tensor(3))
        else:
            check(fn, x)
    check(lambda t: t / 3, x)
    check(lambda t: t * math.pi, x)


# -- optimizer path (foreach) -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make_opt",
    [
        lambda ps: torch.optim.AdamW(ps, lr=0.1, weight_decay=0.1),
        lambda ps: torch.optim.Adam(ps, lr=0.1, amsgrad=True),
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
        lambda ps: torch.optim.AdamW(ps, lr=0.1, foreach=False),
    ],
    ids=["adamw", "adam_amsgrad", "sgd_nesterov", "adamw_for_loop"],
)
def test_optimizer_steps_match_cpu(make_opt):
    g = torch.Generator().manual_seed(32)
    init = [torch.randn(4, 3, generator=g), torch.randn(3, generator=g)]
    grads = [[torch.randn(p.shape, generator=g) for p in init] for _ in range(3)]
    results = []
    for device in ("cpu", "tpu"):
        ps = [torch.nn.Parameter(p.clone().to(device)) for p in init]
        opt = make_opt(ps)
        for step in grads:
            for p, gr in zip(ps, step):
                p.grad = gr.to(device)
            opt.step()
        results.append([p.detach() for p in ps])
    assert_same(results[1], results[0])


# -- _foreach_* ops --------------------------------------------------------------------------------------
def _foreach_inputs():
    g = torch.Generator().manual_seed(33)
    xs = [
        torch.randn(4, 3, generator=g),
        torch.randn(5, generator=g).to(torch.bfloat16),
        torch.randn(2, 2, generator=g),
    ]
    ys = [torch.randn(x.shape, generator=g).to(x.dtype) for x in xs]
    zs = [(torch.rand(x.shape, generator=g) + 0.5).to(x.dtype) for x in xs]
    return xs, ys, zs


FOREACH = {
    "add.List": lambda a, b, c: torch._foreach_add(a, b, alpha=2),
    "add.ScalarList": lambda a, b, c: torch._foreach_add(a, [1, 2.5, -1]),
    "add.Tensor": lambda a, b, c: torch._foreach_add(a, torch.tensor(2.0), alpha=0.5),
    "div.ScalarList": lambda a, b, c: torch._foreach_div(a, [2.0, 3.0, 4.0]),
    "addcdiv.Tensor": lambda a, b, c: torch._foreach_addcdiv(a, b, c, torch.tensor([0.1, -0.2, 0.3])),
    "addcmul.Scalar": lambda a, b, c: torch._foreach_addcmul(a, b, c, value=0.5),
    "lerp.List": lambda a, b, c: torch._foreach_lerp(a, b, c),
    "pow.ScalarAndTensor": lambda a, b, c: torch._foreach_pow(0.9, c),
    "sqrt": lambda a, b, c: torch._foreach_sqrt(c),
    "maximum.List": lambda a, b, c: torch._foreach_maximum(a, b),
    "clamp_min.Scalar": lambda a, b, c: torch._foreach_clamp_min(a, 0.0),
    "norm": lambda a, b, c: torch._foreach_norm(a),
    "norm_inf": lambda a, b, c: torch._foreach_norm(a, float("inf")),
    "max": lambda a, b, c: torch._foreach_max(a),
    # in-place: the mutated lists are returned for comparison
    "add_.List": lambda a, b, c: torch._foreach_add_(a, b, alpha=-1) or a,
    "mul_.Scalar": lambda a, b, c: torch._foreach_mul_(a, 0.5) or a,
    "addcdiv_.ScalarList": lambda a, b, c: torch._foreach_addcdiv_(a, b, c, [0.1, 0.2, 0.3]) or a,
    "lerp_.Scalar": lambda a, b, c: torch._foreach_lerp_(a, b, 0.3) or a,
    "sqrt_": lambda a, b, c: torch._foreach_sqrt_(c) or c,
    "zero_": lambda a, b, c: torch._foreach_zero_(a) or a,
    "copy_": lambda a, b, c: torch._foreach_copy_(a, b) or a,
    "add.List_out": lambda a, b, c: aten._foreach_add.List_out(a, b, alpha=3, out=c) or c,
}


def test_foreach_ops_match_cpu():
    """Each `_foreach_*` call is one executable over the list; values and dtypes follow CPU's loop."""
    for name, fn in FOREACH.items():
        xs, ys, zs = _foreach_inputs()
        expected = fn(*[[t.clone() for t in lst] for lst in (xs, ys, zs)])
        actual = fn(*[[t.to("tpu") for t in lst] for lst in (xs, ys, zs)])
        assert len(actual) == len(expected), name
        for a, e in zip(actual, expected):
            assert_same(a, e)


def test_foreach_inplace_aliasing_and_dtype_errors():
    """Overlapping views are updated in order like CPU's loop; int lists refuse a float result."""
    base = torch.zeros(4, 4)
    base_t = base.to("tpu")
    torch._foreach_add_([base[1], base[:, 2]], 1.0)
    torch._foreach_add_([base_t[1], base_t[:, 2]], 1.0)
    assert_same(base_t, base)
    xs = [torch.ones(3), torch.full((3,), 2.0)]
    xs_t = [x.to("tpu") for x in xs]
    torch._foreach_add_(xs, [xs[1], xs[0]])  # element 1 reads element 0 after its update: [3, 5]
    torch._foreach_add_(xs_t, [xs_t[1], xs_t[0]])
    assert_same(xs_t, xs)
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch._foreach_div_([torch.tensor([1, 2]).to("tpu")], 2.0)


def test_clip_grad_norm_matches_cpu():
    g = torch.Generator().manual_seed(34)
    grads = [torch.randn(5, 3, generator=g) * 3, torch.randn(7, generator=g)]
    results = []
    for device in ("cpu", "tpu"):
        ps = [torch.nn.Parameter(torch.zeros(gr.shape).to(device)) for gr in grads]
        for p, gr in zip(ps, grads):
            p.grad = gr.clone().to(device)
        norm = torch.nn.utils.clip_grad_norm_(ps, max_norm=1.0)
        results.append([norm, *(p.grad for p in ps)])
    assert_same(results[1], results[0])


def test_foreach_mm_matches_cpu_in_one_executable():
    from hf_tpu.runtime.launch import lazy

    torch.manual_seed(0)
    a = [torch.randn(3, 4), torch.randn(5, 2), torch.randn(1, 8)]
    b = [torch.randn(4, 6), torch.randn(2, 7), torch.randn(8, 1)]
    want = torch._foreach_mm(a, b)
    with torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        before = lazy.stats["ops"]
        got = torch._foreach_mm([x.to("tpu") for x in a], [x.to("tpu") for x in b])
        assert lazy.stats["ops"] - before == 1  # the whole list is one recorded executable
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w, rtol=1e-5, atol=1e-5)
