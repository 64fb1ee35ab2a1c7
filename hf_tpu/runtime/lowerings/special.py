"""Special functions: the gamma family, Hurwitz zeta, Bessel functions, error-function relatives.

PyTorch implements several of these itself (Cephes-derived) with domains JAX's versions do not share:
polygamma and zeta are defined at negative non-integer arguments, digamma is -inf/+inf at +0/-0. Those
follow PyTorch's algorithms here; the rest use jax.scipy.special. All compute in opmath (float32 for
halves and integers), like the other pointwise ops.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import jax.scipy.special as jsp
from jax import lax

from hf_tpu.runtime.lowerings.elementwise import to_float, unary_float, xlogy_like
from hf_tpu.runtime.lowerings.table import lowers

for _name, _fn in {
    "lgamma": lax.lgamma,
    "i0": jsp.i0,
    "special_i0e": jsp.i0e,
    "special_i1": jsp.i1,
    "special_i1e": jsp.i1e,
    "special_ndtri": jsp.ndtri,
    "special_log_ndtr": jsp.log_ndtr,
    "special_erfcx": jsp.erfcx,
    "special_modified_bessel_i0": jsp.i0,
    "special_modified_bessel_i1": jsp.i1,
    # sin(x)/x, 1 at 0 and 0 at +-inf (as CPU; sin(inf)/inf would be NaN)
    "special_spherical_bessel_j0": lambda x: jnp.where(
        x == 0, jnp.ones_like(x), jnp.where(jnp.isinf(x), jnp.zeros_like(x), jnp.sin(x) / x)
    ),
    "special_entr": lambda x: jnp.where(
        x > 0, -x * jnp.log(x), jnp.where(x == 0, jnp.zeros_like(x), jnp.where(x < 0, -jnp.inf, x))
    ),
}.items():
    unary_float(_name, _fn)


@lowers("aten::digamma")
def digamma(x):
    """lax.digamma is NaN at 0; PyTorch returns -inf at +0 and +inf at -0 (the limits)."""
    (x,) = to_float(x)
    at_zero = jnp.where(jnp.signbit(x), jnp.inf, -jnp.inf).astype(x.dtype)
    return jnp.where(x == 0, at_zero, lax.digamma(x))


# Cephes' Hurwitz zeta, as PyTorch implements it: defined for negative non-integer q when s is an
# integer (polygamma of negative arguments needs that), inf at s == 1 and at non-positive integer q.
_ZETA_A = (
    12.0,
    -720.0,
    30240.0,
    -1209600.0,
    47900160.0,
    -1.8924375803183791606e9,
    7.47242496e10,
    -2.950130727918164224e12,
    1.1646782814350067249e14,
    -4.5979787224074726105e15,
    1.8152105401943546773e17,
    -7.1661652561756670113e18,
)
_MACHEP = 1.11022302462515654042e-16


def hurwitz_zeta(x, q):
    x, q = jnp.broadcast_arrays(x, q)

    def direct_cond(state):
        i, a, _, _, done = state
        return jnp.any(~done & ((i < 9) | (a <= 9)))

    def direct_body(state):
        i, a, s, b, done = state
        active = ~done & ((i < 9) | (a <= 9))
        a_next = a + 1
        b_next = a_next**-x
        s_next = s + b_next
        converged = active & (jnp.abs(b_next / s_next) < _MACHEP)
        pick = lambda new, old: jnp.where(active, new, old)  # noqa: E731
        return i + active, pick(a_next, a), pick(s_next, s), pick(b_next, b), done | converged

    s0 = q**-x
    init = (jnp.zeros(x.shape, jnp.int32), q, s0, s0, jnp.zeros(x.shape, bool))
    _, a, s, b, done = lax.while_loop(direct_cond, direct_body, init)
    # Euler-Maclaurin tail
    w = a
    s = jnp.where(done, s, s + b * w / (x - 1) - 0.5 * b)
    fac, k = jnp.ones_like(x), 0.0
    for coefficient in _ZETA_A:
        fac = fac * (x + k)
        b = b / w
        t = fac * b / coefficient
        s_next = s + t
        s = jnp.where(done, s, s_next)
        done = done | (jnp.abs(t / s_next) < _MACHEP)
        k += 1.0
        fac = fac * (x + k)
        b = b / w
        k += 1.0
    nan, inf = jnp.full_like(s, jnp.nan), jnp.full_like(s, jnp.inf)
    s = jnp.where((q <= 0) & (x != jnp.floor(x)), nan, s)
    s = jnp.where((q <= 0) & (q == jnp.floor(q)), inf, s)
    s = jnp.where(x < 1, nan, s)
    return jnp.where(x == 1, inf, s)


def trigamma(x):
    """PyTorch's trigamma: reflection below 1/2, six recurrence steps, then the asymptotic series."""
    reflect = x < 0.5
    sin_pi_x = jnp.sin(math.pi * x)
    result = jnp.where(reflect, -(math.pi**2) / (sin_pi_x * sin_pi_x), 0)
    x = jnp.where(reflect, 1 - x, x)
    for _ in range(6):
        result = result + 1 / (x * x)
        x = x + 1
    ixx = 1 / (x * x)
    result = result + (1 + 1 / (2 * x) + ixx * (1 / 6 - ixx * (1 / 30 - ixx * (1 / 42)))) / x
    return jnp.where(reflect, -result, result)


@lowers("aten::polygamma")
def polygamma(n, x):
    (x,) = to_float(x)
    if n == 0:
        return digamma(x)
    if n == 1:
        return trigamma(x)
    return (1.0 if n % 2 else -1.0) * math.exp(math.lgamma(n + 1)) * hurwitz_zeta(jnp.full_like(x, n + 1), x)


@lowers("aten::mvlgamma")
def mvlgamma(x, p):
    """Multivariate log-gamma: sum_j lgamma(x - j/2) + p(p-1)/4 log(pi)."""
    (x,) = to_float(x)
    terms = sum(lax.lgamma(x - j / 2) for j in range(p))
    return terms + p * (p - 1) / 4 * math.log(math.pi)


@lowers("aten::igamma")
def igamma(x, other):
    x, other = to_float(x, other)
    return jsp.gammainc(x, other)


@lowers("aten::igammac")
def igammac(x, other):
    x, other = to_float(x, other)
    return jsp.gammaincc(x, other)


@lowers("aten::special_zeta", "aten::special_zeta.self_scalar", "aten::special_zeta.other_scalar")
def zeta(x, other):
    x, other = to_float(x, other)
    return hurwitz_zeta(x, other)


@lowers("aten::special_xlog1py", "aten::special_xlog1py.self_scalar", "aten::special_xlog1py.other_scalar")
def xlog1py(x, y):
    return xlogy_like(x, y, jnp.log1p)
