"""Orthogonal polynomials (Chebyshev T/U/V/W and shifted, Hermite H/He, Laguerre, Legendre), as PyTorch's CPU
kernels compute them.

PyTorch evaluates these itself (ATen/native/Math.h) rather than through a libm, so matching CPU means
following the same algorithms: the three-term recurrences with PyTorch's special cases (n < 0 gives 0,
closed forms at |x| == 1 and x == 0, trigonometric forms for large n inside [-1, 1], Hermite gives NaN
past n = 128 (float32) / 512 (float64)). The degree n is a tensor: it is truncated to an integer as
C++'s cast does (NaN, inf and out-of-range degrees become negative, hence 0), and the recurrence runs in
one `lax.while_loop` up to the largest degree, each element stopping at its own degree or at a NaN, as
the CPU loop does (k is carried as a float array so that XLA keeps ATen's divisions). Float32 acos in the
trigonometric forms is rounded from float64 where the platform has it, as glibc's acosf (nearly always
correctly rounded) is: n times XLA's float32 acos error would show. Everything computes in the op's float
dtype (integers and bools promote to float32).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from hf_tpu.runtime.buffers import platform
from hf_tpu.runtime.lowerings.elementwise import to_float
from hf_tpu.runtime.lowerings.table import lowers


# -- polynomials ------------------------------------------------------------------------------------
def _degree(n):
    """static_cast<int64_t>(n) on x86: truncation; NaN, inf and out-of-range values become negative."""
    valid = jnp.isfinite(n) & (jnp.abs(n) < 2.0**63)
    return jnp.where(valid, jnp.trunc(n), -1).astype(jnp.int64)


def _recurrence(n, p, q, step, live):
    """q after steps k = 1 .. n-1 of (p, q) -> (q, step(k, p, q)) where `live`; an element stops early
    at a NaN q, like the CPU loops (whose result is then that NaN).

    `step` gets k as a float array carried through the loop, not a broadcast scalar: XLA rewrites a
    division by a broadcast into a multiplication by its reciprocal, which rounds differently from
    ATen's division."""

    def active(j, q):
        return live & (j < n) & ~jnp.isnan(q)

    def cond(state):
        j, _, _, q = state
        return jnp.any(active(j, q))

    def body(state):
        j, k, p, q = state
        on = active(j, q)
        r = step(k, p, q)
        return j + 1, k + 1, jnp.where(on, q, p), jnp.where(on, r, q)

    init = (jnp.asarray(1, jnp.int64), jnp.ones_like(q), p, q)
    return lax.while_loop(cond, body, init)[3]


def _polynomial_args(x, n):
    x, n = to_float(x, n)
    x, n = jnp.broadcast_arrays(x, n)
    return x, _degree(n)


def _as(v, like):
    return v.astype(like.dtype)


def _arccos(y):
    """acos rounded from the platform's widest float: XLA's float32 acos is up to ~2 ulp from glibc's
    (ATen's std::acos), and the trigonometric forms multiply that error by n."""
    wide = jnp.float64 if platform.supports_float64() else y.dtype
    return jnp.arccos(y.astype(wide)).astype(y.dtype)


def _odd_sign(n, v):
    """v for even n, -v for odd n."""
    return jnp.where(n % 2 == 0, v, -v)


def _chebyshev_kind(kind, x, n, shifted):
    """T, U, V or W (of y = 2x - 1 when shifted): r = 2y q - p from (1, q1), with ATen's closed forms
    at the ends of the interval (x = +-1, or x = 1 and 0 when shifted) and its trigonometric forms
    inside it past a small degree."""
    one = jnp.ones_like(x)
    y = x + x - 1 if shifted else x
    theta = _arccos(y)
    nf = _as(n, x)
    two_n_plus_1 = _as(n + n + 1, x)
    if kind == "t":
        q1 = y
        trig = jnp.cos(nf * theta)
        at_one, at_other_end = one, _odd_sign(n, one)
        trig_from = 6
    elif kind == "u":
        q1 = y + y
        n1 = _as(n + 1, x)
        sin_theta = jnp.sin(theta)
        trig = jnp.where(sin_theta != 0, jnp.sin(n1 * theta) / sin_theta, n1 * jnp.cos(n1 * theta) / y)
        at_one, at_other_end = n1, _odd_sign(n, n1)
        trig_from = 6 if shifted else 8
    elif kind == "v":
        q1 = y + y - 1
        half = theta / 2
        trig = jnp.where(
            jnp.sin(half) != 1, jnp.cos((nf + 0.5) * theta) / jnp.cos(half), _odd_sign(n, two_n_plus_1)
        )
        at_one, at_other_end = one, _odd_sign(n, two_n_plus_1)
        trig_from = 6 if shifted else 8
    else:  # "w"
        q1 = y + y + 1
        half = theta / 2
        # ATen's value where cos(theta / 2) rounds to 1 (plain W also checks x > 0 there)
        fallback = _odd_sign(n, one) if shifted else jnp.where(x > 0, two_n_plus_1, _odd_sign(n, one))
        trig = jnp.where(jnp.cos(half) != 1, jnp.sin((nf + 0.5) * theta) / jnp.sin(half), fallback)
        at_one, at_other_end = two_n_plus_1, _odd_sign(n, one)
        trig_from = 4 if shifted else 8
    if shifted:
        ends = (x == 1) | (x == 0)
        at_ends = jnp.where(x == 1, at_one, at_other_end)
    else:
        ends = jnp.abs(x) == 1
        at_ends = jnp.where(x > 0, at_one, at_other_end)
    use_trig = ~ends & (n > trig_from) & (jnp.abs(y) < 1)
    two_y = y + y
    out = _recurrence(n, one, q1, lambda k, p, q: two_y * q - p, (n >= 2) & ~ends & ~use_trig)
    out = jnp.where(n == 1, q1, out)
    out = jnp.where(n == 0, one, out)
    out = jnp.where(use_trig, trig, out)
    out = jnp.where(ends, at_ends, out)
    return jnp.where(n < 0, jnp.zeros_like(x), out)


def _register_chebyshev(kind: str, shifted: bool):
    name = f"special_{'shifted_' if shifted else ''}chebyshev_polynomial_{kind}"

    def lowering(x, n):
        x, n = _polynomial_args(x, n)
        return _chebyshev_kind(kind, x, n, shifted)

    lowering.__name__ = name
    lowering.__doc__ = f"{name}: recurrence, closed forms and trigonometric form as ATen's CPU kernel."
    lowers(f"aten::{name}", f"aten::{name}.x_scalar", f"aten::{name}.n_scalar")(lowering)


for _kind in "tuvw":
    _register_chebyshev(_kind, shifted=False)
    _register_chebyshev(_kind, shifted=True)


def _hermite_limit(x):
    return 128 if x.dtype == jnp.float32 else 512


@lowers(
    "aten::special_hermite_polynomial_h",
    "aten::special_hermite_polynomial_h.x_scalar",
    "aten::special_hermite_polynomial_h.n_scalar",
)
def hermite_polynomial_h(x, n):
    """Physicists' Hermite: H_{k+1} = 2x H_k - 2k H_{k-1}; NaN past PyTorch's degree limit."""
    return _hermite(x, n, 2)


@lowers(
    "aten::special_hermite_polynomial_he",
    "aten::special_hermite_polynomial_he.x_scalar",
    "aten::special_hermite_polynomial_he.n_scalar",
)
def hermite_polynomial_he(x, n):
    """Probabilists' Hermite: He_{k+1} = x He_k - k He_{k-1}; NaN past PyTorch's degree limit."""
    return _hermite(x, n, 1)


def _hermite(x, n, factor: int):
    """P_{k+1} = f x P_k - f k P_{k-1} from P_0 = 1, P_1 = f x (f = 2: physicists', 1: probabilists')."""
    x, n = _polynomial_args(x, n)
    fx = x + x if factor == 2 else x
    too_high = n > _hermite_limit(x)
    step = (lambda k, p, q: fx * q - (k + k) * p) if factor == 2 else (lambda k, p, q: x * q - k * p)
    out = _recurrence(n, jnp.ones_like(x), fx, step, (n >= 2) & ~too_high)
    out = jnp.where(too_high, jnp.full_like(x, jnp.nan), out)
    out = jnp.where(n == 1, fx, out)
    out = jnp.where(n == 0, jnp.ones_like(x), out)
    return jnp.where(n < 0, jnp.zeros_like(x), out)


@lowers(
    "aten::special_laguerre_polynomial_l",
    "aten::special_laguerre_polynomial_l.x_scalar",
    "aten::special_laguerre_polynomial_l.n_scalar",
)
def laguerre_polynomial_l(x, n):
    """Laguerre: (k+1) L_{k+1} = (2k + 1 - x) L_k - k L_{k-1}; 1 at x == 0."""
    x, n = _polynomial_args(x, n)
    one_minus_x = 1 - x

    def step(k, p, q):
        return ((k + k + one_minus_x) * q - k * p) / (k + 1)

    out = _recurrence(n, jnp.ones_like(x), one_minus_x, step, (n >= 2) & (x != 0))
    out = jnp.where(n == 1, one_minus_x, out)
    out = jnp.where((n == 0) | (x == 0), jnp.ones_like(x), out)
    return jnp.where(n < 0, jnp.zeros_like(x), out)


@lowers(
    "aten::special_legendre_polynomial_p",
    "aten::special_legendre_polynomial_p.x_scalar",
    "aten::special_legendre_polynomial_p.n_scalar",
)
def legendre_polynomial_p(x, n):
    """Legendre: (k+1) P_{k+1} = (2k+1) x P_k - k P_{k-1}; +-1 at |x| == 1."""
    x, n = _polynomial_args(x, n)

    def step(k, p, q):
        return ((k + k + 1) * x * q - k * p) / (k + 1)

    one = jnp.ones_like(x)
    out = _recurrence(n, one, x, step, (n >= 2) & (jnp.abs(x) != 1))
    out = jnp.where(n == 1, x, out)
    out = jnp.where(n == 0, one, out)
    out = jnp.where(jnp.abs(x) == 1, jnp.where(x > 0, one, _odd_sign(n, one)), out)
    return jnp.where(n < 0, jnp.zeros_like(x), out)
