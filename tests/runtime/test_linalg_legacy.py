"""Legacy/LAPACK-style linalg on tpu vs CPU PyTorch: cholesky, cholesky_inverse, triangular_solve, geqrf,
ormqr, linalg.ldl_factor(_ex) and linalg.ldl_solve (hf_tpu/runtime/lowerings/linalg_legacy.py)."""

from __future__ import annotations

import warnings

import pytest
import torch

DTYPES = [torch.float32, torch.float64, torch.complex64]
DTYPE_IDS = ["f32", "f64", "c64"]


def _tol(dtype: torch.dtype) -> dict:
    if dtype in (torch.float64, torch.complex128):
        return {"atol": 1e-10, "rtol": 1e-10}
    return {"atol": 1e-4, "rtol": 1e-4}


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(shape, dtype, seed=0) -> torch.Tensor:
    return torch.randn(shape, dtype=dtype, generator=_gen(seed))


def _hpd(shape, dtype, seed=0) -> torch.Tensor:
    """A well-conditioned Hermitian positive definite batch of shape (*, n, n)."""
    x = _randn(shape, dtype, seed)
    n = shape[-1]
    return x @ x.mH + n * torch.eye(n, dtype=dtype)


def _cpu(x):
    return tuple(t.cpu() for t in x)


@pytest.fixture(autouse=True)
def _quiet_deprecations():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*deprecated.*")
        warnings.filterwarnings("ignore", message=".*torch.linalg.solve_triangular.*")
        yield


# -- cholesky ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("upper", [False, True], ids=["lower", "upper"])
@pytest.mark.parametrize("shape", [(5, 5), (2, 3, 4, 4), (0, 3, 3)], ids=["single", "batched", "empty_batch"])
def test_cholesky_matches_cpu(dtype, upper, shape):
    a = _hpd(shape, dtype)
    want = torch.cholesky(a, upper=upper)
    got = torch.cholesky(a.to("tpu"), upper=upper).cpu()
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, **_tol(dtype))


@pytest.mark.parametrize("upper", [False, True], ids=["lower", "upper"])
def test_cholesky_reads_only_its_triangle(upper):
    a = _hpd((4, 4), torch.float64, seed=1)
    junk = torch.full((4, 4), 1e3, dtype=torch.float64)
    a = a.triu() + junk.tril(-1) if upper else a.tril() + junk.triu(1)  # garbage in the unread triangle
    want = torch.cholesky(a, upper=upper)
    torch.testing.assert_close(torch.cholesky(a.to("tpu"), upper=upper).cpu(), want, **_tol(torch.float64))


def test_cholesky_out_variant():
    a = _hpd((3, 3), torch.float32)
    out = torch.empty(3, 3, device="tpu")
    torch.cholesky(a.to("tpu"), upper=True, out=out)
    torch.testing.assert_close(out.cpu(), torch.cholesky(a, upper=True), **_tol(torch.float32))


@pytest.mark.parametrize("upper", [False, True], ids=["lower", "upper"])
def test_cholesky_backward_matches_cpu(upper):
    a = _hpd((2, 4, 4), torch.float64, seed=2)
    grad = _randn((2, 4, 4), torch.float64, seed=3)
    a_cpu = a.clone().requires_grad_()
    a_tpu = a.to("tpu").requires_grad_()
    torch.cholesky(a_cpu, upper=upper).backward(grad)
    torch.cholesky(a_tpu, upper=upper).backward(grad.to("tpu"))
    torch.testing.assert_close(a_tpu.grad.cpu(), a_cpu.grad, **_tol(torch.float64))


# -- cholesky_inverse ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("upper", [False, True], ids=["lower", "upper"])
@pytest.mark.parametrize("shape", [(5, 5), (2, 4, 4), (0, 0)], ids=["single", "batched", "empty"])
def test_cholesky_inverse_matches_cpu(dtype, upper, shape):
    factor = torch.linalg.cholesky(_hpd(shape, dtype), upper=upper)
    want = torch.cholesky_inverse(factor, upper=upper)
    got = torch.cholesky_inverse(factor.to("tpu"), upper=upper).cpu()
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, **_tol(dtype))
    if got.numel():
        torch.testing.assert_close(got, got.mH, atol=0, rtol=0)  # exactly Hermitian, as CPU's


@pytest.mark.parametrize("upper", [False, True], ids=["lower", "upper"])
def test_cholesky_inverse_reads_only_its_triangle(upper):
    factor = torch.linalg.cholesky(_hpd((4, 4), torch.float64, seed=4), upper=upper)
    junk = torch.full((4, 4), 7.0, dtype=torch.float64)
    factor = factor + (junk.tril(-1) if upper else junk.triu(1))
    want = torch.cholesky_inverse(factor, upper=upper)
    got = torch.cholesky_inverse(factor.to("tpu"), upper=upper).cpu()
    torch.testing.assert_close(got, want, **_tol(torch.float64))


def test_cholesky_inverse_backward_matches_cpu():
    factor = torch.linalg.cholesky(_hpd((2, 3, 3), torch.float64, seed=5))
    f_cpu = factor.clone().requires_grad_()
    f_tpu = factor.to("tpu").requires_grad_()
    weights = _randn((2, 3, 3), torch.float64, seed=6)
    (torch.cholesky_inverse(f_cpu) * weights).sum().backward()
    (torch.cholesky_inverse(f_tpu) * weights.to("tpu")).sum().backward()
    torch.testing.assert_close(f_tpu.grad.cpu(), f_cpu.grad, **_tol(torch.float64))


# -- triangular_solve ----------------------------------------------------------------------------------
def _triangular_system(a_shape, b_shape, dtype, seed=0):
    n = a_shape[-1]
    a = _randn(a_shape, dtype, seed) + 3 * n * torch.eye(n, dtype=dtype)  # well conditioned both ways
    return a, _randn(b_shape, dtype, seed + 1)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("upper", [True, False], ids=["upper", "lower"])
@pytest.mark.parametrize("transpose", [False, True], ids=["plain", "transposed"])
@pytest.mark.parametrize("unitriangular", [False, True], ids=["diag", "unit"])
def test_triangular_solve_flags_match_cpu(dtype, upper, transpose, unitriangular):
    a, b = _triangular_system((2, 5, 5), (2, 5, 3), dtype)
    a[..., range(5), range(5)] *= 5  # a diagonal that unitriangular=True must ignore
    want = torch.triangular_solve(b, a, upper=upper, transpose=transpose, unitriangular=unitriangular)
    got = _cpu(
        torch.triangular_solve(
            b.to("tpu"), a.to("tpu"), upper=upper, transpose=transpose, unitriangular=unitriangular
        )
    )
    torch.testing.assert_close(got[0], want.solution, **_tol(dtype))
    torch.testing.assert_close(got[1], want.cloned_coefficient, atol=0, rtol=0)


@pytest.mark.parametrize(
    "a_shape,b_shape",
    [((5, 5), (5, 1)), ((2, 1, 4, 4), (3, 4, 2)), ((4, 4), (2, 4, 3)), ((2, 0, 0), (2, 0, 3))],
    ids=["single", "broadcast_both", "broadcast_a", "empty"],
)
def test_triangular_solve_broadcasts_batches_like_cpu(a_shape, b_shape):
    a, b = _triangular_system(a_shape, b_shape, torch.float32, seed=7)
    want = torch.triangular_solve(b, a)
    got = _cpu(torch.triangular_solve(b.to("tpu"), a.to("tpu")))
    assert got[0].shape == want.solution.shape and got[1].shape == want.cloned_coefficient.shape
    torch.testing.assert_close(got[0], want.solution, **_tol(torch.float32))
    torch.testing.assert_close(got[1], want.cloned_coefficient, atol=0, rtol=0)


@pytest.mark.parametrize("transpose", [False, True], ids=["plain", "transposed"])
def test_triangular_solve_backward_matches_cpu(transpose):
    a, b = _triangular_system((2, 4, 4), (2, 4, 3), torch.float64, seed=8)
    weights = _randn((2, 4, 3), torch.float64, seed=9)
    a_cpu, b_cpu = a.clone().requires_grad_(), b.clone().requires_grad_()
    a_tpu, b_tpu = a.to("tpu").requires_grad_(), b.to("tpu").requires_grad_()
    (torch.triangular_solve(b_cpu, a_cpu, upper=False, transpose=transpose)[0] * weights).sum().backward()
    x_tpu = torch.triangular_solve(b_tpu, a_tpu, upper=False, transpose=transpose)[0]
    (x_tpu * weights.to("tpu")).sum().backward()
    torch.testing.assert_close(a_tpu.grad.cpu(), a_cpu.grad, **_tol(torch.float64))
    torch.testing.assert_close(b_tpu.grad.cpu(), b_cpu.grad, **_tol(torch.float64))


# -- geqrf / ormqr -------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(
    "shape",
    [(5, 5), (6, 3), (3, 6), (2, 1, 4, 3), (0, 3, 3), (4, 0)],
    ids=["square", "tall", "wide", "batched", "empty_batch", "no_columns"],
)
def test_geqrf_matches_cpu(dtype, shape):
    a = _randn(shape, dtype, seed=10)
    want = torch.geqrf(a)
    got = _cpu(torch.geqrf(a.to("tpu")))
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g, w, **_tol(dtype))


def test_geqrf_rejects_vectors():
    with pytest.raises(RuntimeError, match="at least 2 dimensions"):
        torch.geqrf(torch.ones(3, device="tpu"))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("left", [True, False], ids=["left", "right"])
@pytest.mark.parametrize("transpose", [False, True], ids=["Q", "QH"])
@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 1, 4, 4)], ids=["tall", "wide", "batched"])
def test_ormqr_matches_cpu(dtype, left, transpose, shape):
    reflectors, tau = torch.geqrf(_randn(shape, dtype, seed=11))
    m = shape[-2]
    other = _randn(shape[:-2] + ((m, 2) if left else (2, m)), dtype, seed=12)
    want = torch.ormqr(reflectors, tau, other, left=left, transpose=transpose)
    got = torch.ormqr(
        reflectors.to("tpu"), tau.to("tpu"), other.to("tpu"), left=left, transpose=transpose
    ).cpu()
    torch.testing.assert_close(got, want, **_tol(dtype))


def test_ormqr_with_no_reflectors_is_the_identity():
    reflectors, tau = torch.geqrf(_randn((4, 0), torch.float32))
    other = _randn((4, 3), torch.float32, seed=13)
    got = torch.ormqr(reflectors.to("tpu"), tau.to("tpu"), other.to("tpu")).cpu()
    torch.testing.assert_close(got, torch.ormqr(reflectors, tau, other), atol=0, rtol=0)


def test_geqrf_then_ormqr_rebuilds_the_input():
    a = _randn((2, 5, 3), torch.float64, seed=14)
    reflectors, tau = torch.geqrf(a.to("tpu"))
    r = reflectors.triu()[..., :3, :]
    eye_cols = torch.eye(5, 3, dtype=torch.float64).expand(2, 5, 3).to("tpu")
    q = torch.ormqr(reflectors, tau, eye_cols)  # the first 3 columns of Q
    torch.testing.assert_close((q @ r).cpu(), a, **_tol(torch.float64))


# -- LDL^T ---------------------------------------------------------------------------------------------
def _symmetric(shape, dtype, hermitian, seed=0):
    """An indefinite symmetric (Hermitian) batch: Bunch-Kaufman takes 1x1 and 2x2 pivots with swaps."""
    x = _randn(shape, dtype, seed)
    return x + (x.mH if hermitian else x.mT)


LDL_CASES = [
    (torch.float32, False),
    (torch.float64, False),
    (torch.float64, True),
    (torch.complex64, False),
    (torch.complex64, True),
]
LDL_IDS = ["f32", "f64", "f64_hermitian", "c64_symmetric", "c64_hermitian"]


@pytest.mark.parametrize("dtype,hermitian", LDL_CASES, ids=LDL_IDS)
@pytest.mark.parametrize("shape", [(6, 6), (4, 5, 5), (2, 0, 0)], ids=["single", "batched", "empty"])
def test_ldl_factor_ex_matches_cpu(dtype, hermitian, shape):
    a = _symmetric(shape, dtype, hermitian, seed=20)
    want = torch.linalg.ldl_factor_ex(a, hermitian=hermitian)
    got = _cpu(torch.linalg.ldl_factor_ex(a.to("tpu"), hermitian=hermitian))
    torch.testing.assert_close(got[0], want.LD, **_tol(dtype))
    assert torch.equal(got[1], want.pivots), (got[1], want.pivots)  # the same Bunch-Kaufman pivots
    assert torch.equal(got[2], want.info)


def test_ldl_factor_takes_two_by_two_pivots_like_cpu():
    a = torch.tensor([[0.0, 1.0, 2.0], [1.0, 0.0, 3.0], [2.0, 3.0, 0.0]], dtype=torch.float64)
    want = torch.linalg.ldl_factor(a)
    got = _cpu(torch.linalg.ldl_factor(a.to("tpu")))
    assert (want.pivots < 0).any()  # the case exercises a 2x2 block with an interchange
    assert torch.equal(got[1], want.pivots)
    torch.testing.assert_close(got[0], want.LD, **_tol(torch.float64))


def test_ldl_factor_larger_than_lapack_block_size():
    a = _symmetric((70, 70), torch.float64, hermitian=False, seed=21)  # MKL's sytrf blocks above n = 64
    want = torch.linalg.ldl_factor(a)
    got = _cpu(torch.linalg.ldl_factor(a.to("tpu")))
    assert torch.equal(got[1], want.pivots)
    torch.testing.assert_close(got[0], want.LD, atol=1e-9, rtol=1e-9)


def test_ldl_factor_reads_only_the_lower_triangle():
    a = _symmetric((5, 5), torch.float64, hermitian=False, seed=22)
    a = a.tril() + torch.full((5, 5), 50.0, dtype=torch.float64).triu(1)
    want = torch.linalg.ldl_factor_ex(a)
    got = _cpu(torch.linalg.ldl_factor_ex(a.to("tpu")))
    torch.testing.assert_close(got[0], want.LD, **_tol(torch.float64))
    assert torch.equal(got[1], want.pivots)


def test_ldl_factor_info_of_a_singular_matrix_matches_cpu():
    a = torch.zeros(2, 3, 3)
    a[1] = _symmetric((3, 3), torch.float32, hermitian=False, seed=23)
    want = torch.linalg.ldl_factor_ex(a)
    got = _cpu(torch.linalg.ldl_factor_ex(a.to("tpu")))
    assert torch.equal(got[2], want.info) and want.info.tolist() == [1, 0]
    assert torch.equal(got[1], want.pivots)
    torch.testing.assert_close(got[0], want.LD, **_tol(torch.float32))
    with pytest.raises(RuntimeError, match="Unknown error code: 1"):  # CPU's message for info > 0
        torch.linalg.ldl_factor(torch.zeros(3, 3, device="tpu"))


def test_ldl_factor_out_variant():
    a = _symmetric((4, 4), torch.float32, hermitian=False, seed=24)
    ld = torch.empty(4, 4, device="tpu")
    piv = torch.empty(4, dtype=torch.int32, device="tpu")
    torch.linalg.ldl_factor(a.to("tpu"), out=(ld, piv))
    want = torch.linalg.ldl_factor(a)
    torch.testing.assert_close(ld.cpu(), want.LD, **_tol(torch.float32))
    assert torch.equal(piv.cpu(), want.pivots)


@pytest.mark.parametrize("dtype,hermitian", LDL_CASES, ids=LDL_IDS)
@pytest.mark.parametrize(
    "a_shape,b_shape",
    [((6, 6), (6, 3)), ((3, 5, 5), (5, 2)), ((3, 5, 5), (3, 5, 4)), ((0, 4, 4), (4, 2))],
    ids=["single", "broadcast_b", "batched", "empty_batch"],
)
def test_ldl_solve_of_cpu_factors_matches_cpu(dtype, hermitian, a_shape, b_shape):
    ld, piv = torch.linalg.ldl_factor(_symmetric(a_shape, dtype, hermitian, seed=25), hermitian=hermitian)
    b = _randn(b_shape, dtype, seed=26)
    want = torch.linalg.ldl_solve(ld, piv, b, hermitian=hermitian)
    got = torch.linalg.ldl_solve(ld.to("tpu"), piv.to("tpu"), b.to("tpu"), hermitian=hermitian).cpu()
    assert got.shape == want.shape
    scale = float(want.abs().max()) if want.numel() else 1.0  # indefinite systems: compare relative to X
    tol = _tol(dtype)
    torch.testing.assert_close(got, want, atol=tol["atol"] * scale, rtol=tol["rtol"])


@pytest.mark.parametrize("dtype,hermitian", LDL_CASES, ids=LDL_IDS)
def test_ldl_factor_then_solve_on_tpu_solves_the_system(dtype, hermitian):
    a = _symmetric((3, 6, 6), dtype, hermitian, seed=27) + 6 * torch.eye(6, dtype=dtype)
    b = _randn((3, 6, 2), dtype, seed=28)
    ld, piv = torch.linalg.ldl_factor(a.to("tpu"), hermitian=hermitian)
    x = torch.linalg.ldl_solve(ld, piv, b.to("tpu"), hermitian=hermitian).cpu()
    torch.testing.assert_close(a @ x, b, **_tol(dtype))
