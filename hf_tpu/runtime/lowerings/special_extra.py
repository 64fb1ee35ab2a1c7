"""Orthogonal polynomials, Bessel functions of integer order and Airy Ai, as PyTorch's CPU kernels compute them.

PyTorch evaluates these itself (ATen/native/Math.h) rather than through a libm, so matching CPU means
following the same algorithms: the polynomials run their three-term recurrences with PyTorch's special
cases (n < 0 gives 0, closed forms at |x| == 1 and x == 0, trigonometric forms for large n inside
[-1, 1], Hermite gives NaN past n = 128 (float32) / 512 (float64)); the Bessel and Airy functions use
the Cephes rational and Chebyshev approximations with the same (public Cephes) coefficients, branch
points and evaluation order. The degree n is a tensor: it is truncated to an integer as C++'s cast
does (NaN, inf and out-of-range degrees become negative, hence 0), and the recurrence runs in one
`lax.while_loop` up to the largest degree, each element stopping at its own degree or at a NaN, as
the CPU loop does (k is carried as a float array so that XLA keeps ATen's divisions). Float32 acos in the
trigonometric forms is rounded from float64 where the platform has it, as glibc's acosf (nearly always
correctly rounded) is: n times XLA's float32 acos error would show. Everything computes in the op's float
dtype (integers and bools promote to float32).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from hf_tpu.runtime import platform
from hf_tpu.runtime.lowering_table import lowers
from hf_tpu.runtime.lowerings.elementwise import to_float, unary_float


def _horner(z, coefficients):
    """Cephes' polevl: sum c_i z^(k-i), from the leading coefficient, starting from 0 as Math.h does."""
    p = jnp.zeros_like(z)
    for c in coefficients:
        p = p * z + c
    return p


def _chebyshev_series(t, coefficients):
    """Cephes' chbevl: the Clenshaw sum of a Chebyshev series at t, as 0.5 * (b0 - b2)."""
    p = jnp.zeros_like(t)
    q = jnp.zeros_like(t)
    b = jnp.full_like(t, coefficients[0])
    for c in coefficients[1:]:
        p, q = q, b
        b = t * q - p + c
    return 0.5 * (b - p)


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


# -- Bessel functions of the first and second kind (Cephes j0.c, j1.c) -------------------------------
_J0_PP = (
    7.96936729297347051624e-04,
    8.28352392107440799803e-02,
    1.23953371646414299388e00,
    5.44725003058768775090e00,
    8.74716500199817011941e00,
    5.30324038235394892183e00,
    9.99999999999999997821e-01,
)
_J0_PQ = (
    9.24408810558863637013e-04,
    8.56288474354474431428e-02,
    1.25352743901058953537e00,
    5.47097740330417105182e00,
    8.76190883237069594232e00,
    5.30605288235394617618e00,
    1.00000000000000000218e00,
)
_J0_QP = (
    -1.13663838898469149931e-02,
    -1.28252718670509318512e00,
    -1.95539544257735972385e01,
    -9.32060152123768231369e01,
    -1.77681167980488050595e02,
    -1.47077505154951170175e02,
    -5.14105326766599330220e01,
    -6.05014350600728481186e00,
)
_J0_QQ = (
    6.43178256118178023184e01,
    8.56430025976980587198e02,
    3.88240183605401609683e03,
    7.24046774195652478189e03,
    5.93072701187316984827e03,
    2.06209331660327847417e03,
    2.42005740240291393179e02,
)
_J0_RP = (
    -4.79443220978201773821e09,
    1.95617491946556577543e12,
    -2.49248344360967716204e14,
    9.70862251047306323952e15,
)
_J0_RQ = (
    4.99563147152651017219e02,
    1.73785401676374683123e05,
    4.84409658339962045305e07,
    1.11855537045356834862e10,
    2.11277520115489217587e12,
    3.10518229857422583814e14,
    3.18121955943204943306e16,
    1.71086294081043136091e18,
)
_Y0_YP = (
    1.55924367855235737965e04,
    -1.46639295903971606143e07,
    5.43526477051876500413e09,
    -9.82136065717911466409e11,
    8.75906394395366999549e13,
    -3.46628303384729719441e15,
    4.42733268572569800351e16,
    -1.84950800436986690637e16,
)
_Y0_YQ = (
    1.04128353664259848412e03,
    6.26107330137134956842e05,
    2.68919633393814121987e08,
    8.64002487103935000337e10,
    2.02979612750105546709e13,
    3.17157752842975028269e15,
    2.50596256172653059228e17,
)
_J1_PP = (
    7.62125616208173112003e-04,
    7.31397056940917570436e-02,
    1.12719608129684925192e00,
    5.11207951146807644818e00,
    8.42404590141772420927e00,
    5.21451598682361504063e00,
    1.00000000000000000254e00,
)
_J1_PQ = (
    5.71323128072548699714e-04,
    6.88455908754495404082e-02,
    1.10514232634061696926e00,
    5.07386386128601488557e00,
    8.39985554327604159757e00,
    5.20982848682361821619e00,
    9.99999999999999997461e-01,
)
_J1_QP = (
    5.10862594750176621635e-02,
    4.98213872951233449420e00,
    7.58238284132545283818e01,
    3.66779609360150777800e02,
    7.10856304998926107277e02,
    5.97489612400613639965e02,
    2.11688757100572135698e02,
    2.52070205858023719784e01,
)
_J1_QQ = (
    7.42373277035675149943e01,
    1.05644886038262816351e03,
    4.98641058337653607651e03,
    9.56231892404756170795e03,
    7.99704160447350683650e03,
    2.82619278517639096600e03,
    3.36093607810698293419e02,
)
_J1_RP = (
    -8.99971225705559398224e08,
    4.52228297998194034323e11,
    -7.27494245221818276015e13,
    3.68295732863852883286e15,
)
_J1_RQ = (
    6.20836478118054335476e02,
    2.56987256757748830383e05,
    8.35146791431949253037e07,
    2.21511595479792499675e10,
    4.74914122079991414898e12,
    7.84369607876235854894e14,
    8.95222336184627338078e16,
    5.32278620332680085395e18,
)
_Y1_YP = (
    1.26320474790178026440e09,
    -6.47355876379160291031e11,
    1.14509511541823727583e14,
    -8.12770255501325109621e15,
    2.02439475713594898196e17,
    -7.78877196265950026825e17,
)
_Y1_YQ = (
    5.94301592346128195359e02,
    2.35564092943068577943e05,
    7.34811944459721705660e07,
    1.87601316108706159478e10,
    3.88231277496238566008e12,
    6.20557727146953693363e14,
    6.87141087355300489866e16,
    3.97270608116560655612e18,
)
_SQRT_2_OVER_PI = 0.797884560802865355879892119868763737
_TWO_OVER_PI = 0.636619772367581343075535053490057448
_PI_4 = 0.785398163397448309615660845819875721
_3PI_4 = 2.356194490192344928846982537459627163


def _j0_small(x):
    """J0 on 0 <= x <= 5: (x^2 - r1^2)(x^2 - r2^2) RP(x^2)/RQ(x^2), 1 - x^2/4 below 1e-5."""
    xx = x * x
    rational = (xx - 5.78318596294678452118e00) * (xx - 3.04712623436620863991e01) * _horner(xx, _J0_RP)
    rational = rational / _horner(xx, _J0_RQ)
    return jnp.where(x < 0.00001, 1 - xx / 4, rational)


def _j1_small(x):
    xx = x * x
    rational = _horner(xx, _J1_RP) / _horner(xx, _J1_RQ) * x
    return rational * (xx - 1.46819706421238932572e01) * (xx - 4.92184563216946036703e01)


def _bessel_asymptotic(x, z, pp, pq, qp, qq, phase, second_kind):
    """The Hankel asymptotic form sqrt(2/(pi x)) (P cos(x - phase) - 5/x Q sin(x - phase)) (J), or with
    sin/cos swapped (Y); z is (5/x)^2 computed as each Cephes routine does."""
    p = _horner(z, pp) / _horner(z, pq)
    q = 5 / x * (_horner(z, qp) / _horner(z, qq))
    shifted = x - phase
    if second_kind:
        value = p * jnp.sin(shifted) + q * jnp.cos(shifted)
    else:
        value = p * jnp.cos(shifted) - q * jnp.sin(shifted)
    return value * _SQRT_2_OVER_PI / jnp.sqrt(x)


def _bessel_j0(x):
    x = jnp.where(x < 0, -x, x)
    far = _bessel_asymptotic(x, 25 / (x * x), _J0_PP, _J0_PQ, _J0_QP, _J0_QQ, _PI_4, False)
    return jnp.where(x <= 5, _j0_small(x), far)


def _bessel_j1(x):
    ax = jnp.where(x < 0, -x, x)  # keeps -0, as ATen's `if (x < 0)` does
    z = 5 / ax * (5 / ax)
    far = _bessel_asymptotic(ax, z, _J1_PP, _J1_PQ, _J1_QP, _J1_QQ, _3PI_4, False)
    out = jnp.where(ax <= 5, _j1_small(ax), far)
    return jnp.where(x < 0, -out, out)


def _bessel_y0(x):
    xx = x * x
    near = _horner(xx, _Y0_YP) / _horner(xx, _Y0_YQ) + _TWO_OVER_PI * jnp.log(x) * _bessel_j0(x)
    far = _bessel_asymptotic(x, 25 / xx, _J0_PP, _J0_PQ, _J0_QP, _J0_QQ, _PI_4, True)
    out = jnp.where(x <= 5, near, far)
    out = jnp.where(x < 0, jnp.full_like(x, jnp.nan), out)
    return jnp.where(x == 0, jnp.full_like(x, -jnp.inf), out)


def _bessel_y1(x):
    xx = x * x
    near = x * (_horner(xx, _Y1_YP) / _horner(xx, _Y1_YQ))
    near = near + _TWO_OVER_PI * (_bessel_j1(x) * jnp.log(x) - 1 / x)
    far = _bessel_asymptotic(x, 5 / x * (5 / x), _J1_PP, _J1_PQ, _J1_QP, _J1_QQ, _3PI_4, True)
    out = jnp.where(x <= 5, near, far)
    out = jnp.where(x < 0, jnp.full_like(x, jnp.nan), out)
    return jnp.where(x == 0, jnp.full_like(x, -jnp.inf), out)


# -- modified Bessel functions (Cephes i0.c, i1.c, k0.c, k1.c) ---------------------------------------
_I0_A = (
    -4.41534164647933937950e-18,
    3.33079451882223809783e-17,
    -2.43127984654795469359e-16,
    1.71539128555513303061e-15,
    -1.16853328779934516808e-14,
    7.67618549860493561688e-14,
    -4.85644678311192946090e-13,
    2.95505266312963983461e-12,
    -1.72682629144155570723e-11,
    9.67580903537323691224e-11,
    -5.18979560163526290666e-10,
    2.65982372468238665035e-09,
    -1.30002500998624804212e-08,
    6.04699502254191894932e-08,
    -2.67079385394061173391e-07,
    1.11738753912010371815e-06,
    -4.41673835845875056359e-06,
    1.64484480707288970893e-05,
    -5.75419501008210370398e-05,
    1.88502885095841655729e-04,
    -5.76375574538582365885e-04,
    1.63947561694133579842e-03,
    -4.32430999505057594430e-03,
    1.05464603945949983183e-02,
    -2.37374148058994688156e-02,
    4.93052842396707084878e-02,
    -9.49010970480476444210e-02,
    1.71620901522208775349e-01,
    -3.04682672343198398683e-01,
    6.76795274409476084995e-01,
)
_I0_B = (
    -7.23318048787475395456e-18,
    -4.83050448594418207126e-18,
    4.46562142029675999901e-17,
    3.46122286769746109310e-17,
    -2.82762398051658348494e-16,
    -3.42548561967721913462e-16,
    1.77256013305652638360e-15,
    3.81168066935262242075e-15,
    -9.55484669882830764870e-15,
    -4.15056934728722208663e-14,
    1.54008621752140982691e-14,
    3.85277838274214270114e-13,
    7.18012445138366623367e-13,
    -1.79417853150680611778e-12,
    -1.32158118404477131188e-11,
    -3.14991652796324136454e-11,
    1.18891471078464383424e-11,
    4.94060238822496958910e-10,
    3.39623202570838634515e-09,
    2.26666899049817806459e-08,
    2.04891858946906374183e-07,
    2.89137052083475648297e-06,
    6.88975834691682398426e-05,
    3.36911647825569408990e-03,
    8.04490411014108831608e-01,
)
_I1_A = (
    2.77791411276104639959e-18,
    -2.11142121435816608115e-17,
    1.55363195773620046921e-16,
    -1.10559694773538630805e-15,
    7.60068429473540693410e-15,
    -5.04218550472791168711e-14,
    3.22379336594557470981e-13,
    -1.98397439776494371520e-12,
    1.17361862988909016308e-11,
    -6.66348972350202774223e-11,
    3.62559028155211703701e-10,
    -1.88724975172282928790e-09,
    9.38153738649577178388e-09,
    -4.44505912879632808065e-08,
    2.00329475355213526229e-07,
    -8.56872026469545474066e-07,
    3.47025130813767847674e-06,
    -1.32731636560394358279e-05,
    4.78156510755005422638e-05,
    -1.61760815825896745588e-04,
    5.12285956168575772895e-04,
    -1.51357245063125314899e-03,
    4.15642294431288815669e-03,
    -1.05640848946261981558e-02,
    2.47264490306265168283e-02,
    -5.29459812080949914269e-02,
    1.02643658689847095384e-01,
    -1.76416518357834055153e-01,
    2.52587186443633654823e-01,
)
_I1_B = (
    7.51729631084210481353e-18,
    4.41434832307170791151e-18,
    -4.65030536848935832153e-17,
    -3.20952592199342395980e-17,
    2.96262899764595013876e-16,
    3.30820231092092828324e-16,
    -1.88035477551078244854e-15,
    -3.81440307243700780478e-15,
    1.04202769841288027642e-14,
    4.27244001671195135429e-14,
    -2.10154184277266431302e-14,
    -4.08355111109219731823e-13,
    -7.19855177624590851209e-13,
    2.03562854414708950722e-12,
    1.41258074366137813316e-11,
    3.25260358301548823856e-11,
    -1.89749581235054123450e-11,
    -5.58974346219658380687e-10,
    -3.83538038596423702205e-09,
    -2.63146884688951950684e-08,
    -2.51223623787020892529e-07,
    -3.88256480887769039346e-06,
    -1.10588938762623716291e-04,
    -9.76109749136146840777e-03,
    7.78576235018280120474e-01,
)
_K0_A = (
    1.37446543561352307156e-16,
    4.25981614279661018399e-14,
    1.03496952576338420167e-11,
    1.90451637722020886025e-09,
    2.53479107902614945675e-07,
    2.28621210311945178607e-05,
    1.26461541144692592338e-03,
    3.59799365153615016266e-02,
    3.44289899924628486886e-01,
    -5.35327393233902768720e-01,
)
_K0_B = (
    5.30043377268626276149e-18,
    -1.64758043015242134646e-17,
    5.21039150503902756861e-17,
    -1.67823109680541210385e-16,
    5.51205597852431940784e-16,
    -1.84859337734377901440e-15,
    6.34007647740507060557e-15,
    -2.22751332699166985548e-14,
    8.03289077536357521100e-14,
    -2.98009692317273043925e-13,
    1.14034058820847496303e-12,
    -4.51459788337394416547e-12,
    1.85594911495471785253e-11,
    -7.95748924447710747776e-11,
    3.57739728140030116597e-10,
    -1.69753450938905987466e-09,
    8.57403401741422608519e-09,
    -4.66048989768794782956e-08,
    2.76681363944501510342e-07,
    -1.83175552271911948767e-06,
    1.39498137188764993662e-05,
    -1.28495495816278026384e-04,
    1.56988388573005337491e-03,
    -3.14481013119645005427e-02,
    2.44030308206595545468e00,
)
_K1_A = (
    -7.02386347938628759343e-18,
    -2.42744985051936593393e-15,
    -6.66690169419932900609e-13,
    -1.41148839263352776110e-10,
    -2.21338763073472585583e-08,
    -2.43340614156596823496e-06,
    -1.73028895751305206302e-04,
    -6.97572385963986435018e-03,
    -1.22611180822657148235e-01,
    -3.53155960776544875667e-01,
    1.52530022733894777053e00,
)
_K1_B = (
    -5.75674448366501715755e-18,
    1.79405087314755922667e-17,
    -5.68946255844285935196e-17,
    1.83809354436663880070e-16,
    -6.05704724837331885336e-16,
    2.03870316562433424052e-15,
    -7.01983709041831346144e-15,
    2.47715442448130437068e-14,
    -8.97670518232499435011e-14,
    3.34841966607842919884e-13,
    -1.28917396095102890680e-12,
    5.13963967348173025100e-12,
    -2.12996783842756842877e-11,
    9.21831518760500529508e-11,
    -4.19035475934189648750e-10,
    2.01504975519703286596e-09,
    -1.03457624656780970260e-08,
    5.74108412545004946722e-08,
    -3.50196060308781257119e-07,
    2.40648494783721712015e-06,
    -1.93619797416608296024e-05,
    1.95215518471351631108e-04,
    -2.85781685962277938680e-03,
    1.03923736576817238437e-01,
    2.72062619048444266945e00,
)


def _modified_bessel_i0(x):
    """I0 as ATen's modified_bessel_i0_forward (needed by K0 to match it)."""
    ax = jnp.abs(x)
    near = jnp.exp(ax) * _chebyshev_series(ax / 2 - 2, _I0_A)
    far = jnp.exp(ax) * _chebyshev_series(32 / ax - 2, _I0_B) / jnp.sqrt(ax)
    return jnp.where(ax <= 8, near, far)


def _modified_bessel_i1(x):
    """I1 as ATen's modified_bessel_i1_forward (needed by K1 to match it)."""
    ax = jnp.abs(x)
    near = _chebyshev_series(ax / 2 - 2, _I1_A) * ax * jnp.exp(ax)
    far = jnp.exp(ax) * _chebyshev_series(32 / ax - 2, _I1_B) / jnp.sqrt(ax)
    out = jnp.where(ax <= 8, near, far)
    return jnp.where(x < 0, -out, out)


def _k_domain(x, out):
    """K0/K1 are +inf at 0 and NaN for x < 0."""
    out = jnp.where(x < 0, jnp.full_like(x, jnp.nan), out)
    return jnp.where(x == 0, jnp.full_like(x, jnp.inf), out)


def _k0_near(x):
    """K0 on 0 < x <= 2 (unscaled)."""
    return _chebyshev_series(x * x - 2, _K0_A) - jnp.log(0.5 * x) * _modified_bessel_i0(x)


def _k1_near(x):
    """K1 on 0 < x <= 2 (unscaled)."""
    return jnp.log(0.5 * x) * _modified_bessel_i1(x) + _chebyshev_series(x * x - 2, _K1_A) / x


def _modified_bessel_k0(x):
    far = jnp.exp(-x) * _chebyshev_series(8 / x - 2, _K0_B) / jnp.sqrt(x)
    return _k_domain(x, jnp.where(x <= 2, _k0_near(x), far))


def _modified_bessel_k1(x):
    far = jnp.exp(-x) * _chebyshev_series(8 / x - 2, _K1_B) / jnp.sqrt(x)
    return _k_domain(x, jnp.where(x <= 2, _k1_near(x), far))


def _scaled_modified_bessel_k0(x):
    far = _chebyshev_series(8 / x - 2, _K0_B) / jnp.sqrt(x)
    return _k_domain(x, jnp.where(x <= 2, _k0_near(x) * jnp.exp(x), far))


def _scaled_modified_bessel_k1(x):
    far = _chebyshev_series(8 / x - 2, _K1_B) / jnp.sqrt(x)
    return _k_domain(x, jnp.where(x <= 2, _k1_near(x) * jnp.exp(x), far))


# -- Airy Ai (Cephes airy.c, the Ai part) -------------------------------------------------------------
_AI_AN = (
    3.46538101525629032477e-01,
    1.20075952739645805542e01,
    7.62796053615234516538e01,
    1.68089224934630576269e02,
    1.59756391350164413639e02,
    7.05360906840444183113e01,
    1.40264691163389668864e01,
    9.99999999999999995305e-01,
)
_AI_AD = (
    5.67594532638770212846e-01,
    1.47562562584847203173e01,
    8.45138970141474626562e01,
    1.77318088145400459522e02,
    1.64234692871529701831e02,
    7.14778400825575695274e01,
    1.40959135607834029598e01,
    1.00000000000000000470e00,
)
_AI_AFN = (
    -1.31696323418331795333e-01,
    -6.26456544431912369773e-01,
    -6.93158036036933542233e-01,
    -2.79779981545119124951e-01,
    -4.91900132609500318020e-02,
    -4.06265923594885404393e-03,
    -1.59276496239262096340e-04,
    -2.77649108155232920844e-06,
    -1.67787698489114633780e-08,
)
_AI_AFD = (
    1.33560420706553243746e01,
    3.26825032795224613948e01,
    2.67367040941499554804e01,
    9.18707402907259625840e00,
    1.47529146771666414581e00,
    1.15687173795188044134e-01,
    4.40291641615211203805e-03,
    7.54720348287414296618e-05,
    4.51850092970580378464e-07,
)
_AI_AGN = (
    1.97339932091685679179e-02,
    3.91103029615688277255e-01,
    1.06579897599595591108e00,
    9.39169229816650230044e-01,
    3.51465656105547619242e-01,
    6.33888919628925490927e-02,
    5.85804113048388458567e-03,
    2.82851600836737019778e-04,
    6.98793669997260967291e-06,
    8.11789239554389293311e-08,
    3.41551784765923618484e-10,
)
_AI_AGD = (
    9.30892908077441974853e00,
    1.98352928718312140417e01,
    1.55646628932864612953e01,
    5.47686069422975497931e00,
    9.54293611618961883998e-01,
    8.64580826352392193095e-02,
    4.12656523824222607191e-03,
    1.01259085116509135510e-04,
    1.17166733214413521882e-06,
    4.91834570062930015649e-09,
)
_INV_SQRT_PI = 5.64189583547756286948e-01


def _airy_ai_maclaurin(x, live):
    """Ai = c1 f - c2 g from the Maclaurin series f, g in x^3, summed (where `live`) until a term
    of f falls to machine epsilon relative to f, as ATen's loop does."""
    eps = jnp.finfo(x.dtype).eps
    z = x * x * x

    def body(state):
        live, f, g, k, m, n = state
        m1 = m * z
        k1 = k + 1
        m1 = m1 / k1
        n1 = n * z
        k2 = k1 + 1
        n1 = n1 / k2
        m1 = m1 / k2
        f1 = f + m1
        k3 = k2 + 1
        n1 = n1 / k3
        g1 = g + n1
        pick = lambda new, old: jnp.where(live, new, old)  # noqa: E731
        new = (pick(f1, f), pick(g1, g), pick(k3, k), pick(m1, m), pick(n1, n))
        return (live & (jnp.abs(m1 / f1) > eps), *new)

    one = jnp.ones_like(x)
    state = (live, one, x, one, one, x)
    _, f, g, _, _, _ = lax.while_loop(lambda s: jnp.any(s[0]), body, state)
    return 0.355028053887817239260 * f - 0.258819403792806798405 * g


def _airy_ai(x):
    # x < -2.09: the oscillating asymptotic form
    xn = jnp.where(x < -2.09, x, -4.0)
    zeta_n = -2 * xn * jnp.sqrt(-xn) / 3
    z = 1 / zeta_n
    zz = z * z
    f = zz * _horner(zz, _AI_AFN) / _horner(zz, _AI_AFD)
    g = z * _horner(zz, _AI_AGN) / _horner(zz, _AI_AGD)
    t = zeta_n + 0.25 * math.pi
    negative = _INV_SQRT_PI / jnp.sqrt(jnp.sqrt(-xn)) * (jnp.sin(t) * (1 + f) - jnp.cos(t) * g)
    # x >= 2.09: the decaying asymptotic form
    xp = jnp.where(x >= 2.09, x, 4.0)
    zeta_p = 2 * xp * jnp.sqrt(xp) / 3
    inv = 1 / zeta_p
    positive = _INV_SQRT_PI * (_horner(inv, _AI_AN) / _horner(inv, _AI_AD))
    positive = positive / (2 * jnp.sqrt(jnp.sqrt(xp)) * jnp.exp(zeta_p))
    # in between: the power series
    middle = ~(x < -2.09) & ~(x >= 2.09)
    out = jnp.where(middle, _airy_ai_maclaurin(x, middle), jnp.where(x < -2.09, negative, positive))
    out = jnp.where(x > 103.892, jnp.zeros_like(x), out)
    return jnp.where(jnp.isinf(x), jnp.full_like(x, jnp.nan), out)


for _name, _fn in {
    "special_bessel_j0": _bessel_j0,
    "special_bessel_j1": _bessel_j1,
    "special_bessel_y0": _bessel_y0,
    "special_bessel_y1": _bessel_y1,
    "special_modified_bessel_k0": _modified_bessel_k0,
    "special_modified_bessel_k1": _modified_bessel_k1,
    "special_scaled_modified_bessel_k0": _scaled_modified_bessel_k0,
    "special_scaled_modified_bessel_k1": _scaled_modified_bessel_k1,
    "special_airy_ai": _airy_ai,
}.items():
    unary_float(_name, _fn)
