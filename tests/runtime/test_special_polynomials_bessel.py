"""torch.special's orthogonal polynomials, Bessel functions and Airy Ai on tpu vs CPU PyTorch (ATen's own
algorithms: lowerings/special_polynomials.py, special_bessel.py): value grids with the edge cases
(|x| == 1, x == 0, branch points, NaN, inf, negative and non-integer degrees, degrees past Hermite's
limit) in float32 and float64."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

NAN, INF = math.nan, math.inf
TOL = {torch.float32: {"atol": 1e-5, "rtol": 1e-5}, torch.float64: {"atol": 1e-12, "rtol": 1e-10}}
DTYPES = [torch.float32, torch.float64]

POLYNOMIALS = [
    "chebyshev_polynomial_t",
    "chebyshev_polynomial_u",
    "chebyshev_polynomial_v",
    "chebyshev_polynomial_w",
    "shifted_chebyshev_polynomial_t",
    "shifted_chebyshev_polynomial_u",
    "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w",
    "hermite_polynomial_h",
    "hermite_polynomial_he",
    "laguerre_polynomial_l",
    "legendre_polynomial_p",
]
UNARY = [
    "bessel_j0",
    "bessel_j1",
    "bessel_y0",
    "bessel_y1",
    "modified_bessel_k0",
    "modified_bessel_k1",
    "scaled_modified_bessel_k0",
    "scaled_modified_bessel_k1",
    "airy_ai",
]

# x: the ends of [-1, 1] and of [0, 1] (shifted kinds), just inside them (where the trigonometric forms
# are ill-conditioned), outside them, NaN and inf; plus a sweep of [-1.2, 1.2].
POLY_X = [NAN, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 0.999, -0.999, 0.9999999, -0.9999999, 1e-3, 0.3, -0.7]
POLY_X += [1.5, -1.5, 2.0, -3.0, 10.0, 100.0, INF, -INF] + torch.linspace(-1.2, 1.2, 25).tolist()
# n: negative, truncated (1.9 -> 1, -0.5 -> 0), every small degree around the switch to the trigonometric
# forms (4, 6, 8), large ones, Hermite's limits (128 float32, 512 float64), NaN, inf, out of int64 range.
POLY_N = [-3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 1.9, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 12.0, 20.0]
POLY_N += [50.0, 127.0, 128.0, 129.0, 300.0, 512.0, 513.0, NAN, INF, -INF, 1e20]


def _special(name):
    return getattr(torch.special, name)


def _check(got, want):
    assert got.device.type == "tpu"
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, equal_nan=True, **TOL.get(want.dtype, {}))


# -- polynomials ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", POLYNOMIALS)
def test_polynomial_grid_matches_cpu(name, dtype):
    xs, ns = zip(*itertools.product(POLY_X, POLY_N))
    x, n = torch.tensor(xs, dtype=dtype), torch.tensor(ns, dtype=dtype)
    got, want = _special(name)(x.to("tpu"), n.to("tpu")), _special(name)(x, n)
    if dtype == torch.float64 or "chebyshev" not in name:
        _check(got, want)
        return
    # float32 Chebyshev degrees past 4 inside the interval take cos(n acos x)-like forms: where glibc's acosf is
    # not correctly rounded (x = -0.9: 1 ulp off) the phase n * acos(x) moves by up to n ulps of acos.
    large = (n > 4) & (n < 1e19)
    _check(got[~large.to("tpu")], want[~large])
    torch.testing.assert_close(got.cpu()[large], want[large], equal_nan=True, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("name", POLYNOMIALS)
def test_polynomial_random_inputs_broadcast_like_cpu(name):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(5, 1, generator=g, dtype=torch.float64) * 4 - 2
    n = torch.randint(-2, 15, (7,), generator=g).double()
    _check(_special(name)(x.to("tpu"), n.to("tpu")), _special(name)(x, n))


@pytest.mark.parametrize("name", POLYNOMIALS)
def test_polynomial_scalar_overloads_and_integer_inputs(name):
    f = _special(name)
    x = torch.tensor([-1.0, -0.4, 0.0, 0.2, 0.9, 1.0, 1.7])
    n_int = torch.arange(-1, 10)
    # x_scalar: a Python float x with an integer degree tensor computes (and returns) float32
    _check(f(0.35, n_int.to("tpu")), f(0.35, n_int))
    _check(f(2, n_int.to("tpu")), f(2, n_int))
    # n_scalar
    for degree in (0, 1, 3, 9, 11):
        _check(f(x.to("tpu"), degree), f(x, degree))
    # integer x and n promote to float32
    xi = torch.tensor([-2, -1, 0, 1, 2, 3])
    _check(f(xi.to("tpu"), n_int[:6].to("tpu")), f(xi, n_int[:6]))


@pytest.mark.parametrize("name", ["chebyshev_polynomial_t", "legendre_polynomial_p", "hermite_polynomial_h"])
def test_polynomial_out_variant(name):
    f = _special(name)
    x = torch.linspace(-1.5, 1.5, 13, dtype=torch.float64)
    n = torch.full((13,), 7.0, dtype=torch.float64)
    out = torch.empty(13, dtype=torch.float64, device="tpu")
    result = f(x.to("tpu"), n.to("tpu"), out=out)
    assert result is out
    _check(out, f(x, n))


def test_polynomial_special_values():
    """Spot values with known answers, independent of CPU."""
    cheb_t = torch.special.chebyshev_polynomial_t
    x = torch.tensor([0.5, 0.5, -1.0, -1.0, 0.3, 0.3], dtype=torch.float64, device="tpu")
    n = torch.tensor([3.0, -2.0, 5.0, 4.0, NAN, 2.7], dtype=torch.float64, device="tpu")
    # T3(1/2) = cos(pi) = -1; negative and NaN degrees give 0; T_n(-1) = (-1)^n; 2.7 truncates to 2
    want = torch.tensor([-1.0, 0.0, -1.0, 1.0, 0.0, 2 * 0.09 - 1], dtype=torch.float64)
    torch.testing.assert_close(cheb_t(x, n).cpu(), want)
    # Hermite's degree limit is per dtype: 128 in float32 (where H_129 overflows anyway), 512 in float64
    h = torch.special.hermite_polynomial_h
    wide = h(
        torch.tensor([0.1], dtype=torch.float64, device="tpu"),
        torch.tensor([129.0], dtype=torch.float64).to("tpu"),
    )
    assert torch.isfinite(wide.cpu()).all()


@pytest.mark.parametrize("name", POLYNOMIALS[:8])
def test_chebyshev_float32_large_degree_where_acos_rounds_like_cpu(name):
    """Where glibc's acosf is correctly rounded, the float32 trigonometric forms match CPU tightly even at
    n = 513 (a float32 XLA acos, ~2 ulp off, moves these by ~1e-4)."""
    x = torch.tensor([0.001, 0.75, -0.4, 0.2])
    n = torch.tensor([127.0, 300.0, 513.0])
    x, n = x[:, None].expand(4, 3).reshape(-1), n.repeat(4)
    _check(_special(name)(x.to("tpu"), n.to("tpu")), _special(name)(x, n))


def test_polynomial_large_degree_inside_the_interval_uses_the_closed_form():
    """n = 10^7 inside (-1, 1): ATen's cos(n acos x) form, no ten-million-step loop (and the same value)."""
    x = torch.tensor([0.3, -0.8, 0.999], dtype=torch.float64)
    n = torch.full((3,), 1e7, dtype=torch.float64)
    for name in ("chebyshev_polynomial_t", "chebyshev_polynomial_u", "shifted_chebyshev_polynomial_w"):
        _check(_special(name)(x.to("tpu"), n.to("tpu")), _special(name)(x, n))


# -- Bessel functions and Airy Ai ----------------------------------------------------------------------
# Zeros, the branch points of each approximation (j/y: 5; k: 2; i inside k: 8; airy: -2.09, 2.09, 8.32,
# 103.892), tiny (j0's 1e-5 series), negative, huge, inf and NaN arguments, then a sweep.
UNARY_X = [0.0, -0.0, 1e-6, -1e-6, 1e-5, 2.0, -2.0, 5.0, -5.0, 8.0, 2.09, -2.09, 8.3203353, 103.892, 104.0]
UNARY_X += [0.5, -0.5, 1.0, -1.0, 30.0, 200.0, 1e3, 1e5, 1e10, 1e30, -1e30, INF, -INF, NAN]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", UNARY)
def test_bessel_and_airy_match_cpu(name, dtype):
    x = torch.cat(
        [
            torch.tensor(UNARY_X, dtype=dtype),
            torch.linspace(-30, 30, 1201, dtype=dtype),
            torch.logspace(-8, 3, 200, dtype=dtype),
        ]
    )
    _check(_special(name)(x.to("tpu")), _special(name)(x))


@pytest.mark.parametrize("name", UNARY)
def test_bessel_and_airy_integer_inputs_promote_to_float32(name):
    x = torch.tensor([-3, -1, 0, 1, 2, 5, 9])
    _check(_special(name)(x.to("tpu")), _special(name)(x))


def test_bessel_domain_edges():
    """Y and K: -inf / +inf at 0, NaN for x < 0; Ai: NaN at +-inf, 0 past 103.892; J at 0."""
    x = torch.tensor([0.0, -1.0], dtype=torch.float64, device="tpu")
    assert torch.special.bessel_y0(x).cpu().tolist()[0] == -INF
    assert math.isnan(torch.special.bessel_y1(x).cpu().tolist()[1])
    assert torch.special.modified_bessel_k1(x).cpu().tolist()[0] == INF
    assert math.isnan(torch.special.scaled_modified_bessel_k0(x).cpu().tolist()[1])
    ai = torch.special.airy_ai(torch.tensor([INF, -INF, 104.0, 0.0], dtype=torch.float64, device="tpu"))
    ai = ai.cpu().tolist()
    assert math.isnan(ai[0]) and math.isnan(ai[1]) and ai[2] == 0.0
    assert ai[3] == pytest.approx(0.3550280538878172)  # Ai(0) = 3^(-2/3) / Gamma(2/3)
    j = torch.special.bessel_j0(
        torch.tensor([0.0, 2.404825557695773], dtype=torch.float64, device="tpu")
    ).cpu()
    torch.testing.assert_close(j, torch.tensor([1.0, 0.0], dtype=torch.float64), atol=1e-15, rtol=0)


def test_inside_a_compiled_graph():
    """The recurrences' while_loop and the series loop also lower inside torch.compile(backend="tpu")."""

    def f(x, n):
        return (
            torch.special.legendre_polynomial_p(x, n)
            + torch.special.bessel_j0(x) * torch.special.chebyshev_polynomial_u(x, 3)
            + torch.special.airy_ai(x)
        )

    x = torch.linspace(-3, 3, 50, dtype=torch.float64)
    n = torch.arange(50, dtype=torch.float64) % 12
    got = torch.compile(f, backend="tpu")(x.to("tpu"), n.to("tpu"))
    _check(got, f(x, n))


def test_spherical_bessel_j0_at_infinity_and_zero_matches_cpu():
    x = torch.tensor([float("inf"), -float("inf"), 0.0, 1.5, -3.0, float("nan")])
    torch.testing.assert_close(
        torch.special.spherical_bessel_j0(x.to("tpu")).cpu(),
        torch.special.spherical_bessel_j0(x),
        equal_nan=True,
    )
