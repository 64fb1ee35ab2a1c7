"""More dense linear algebra: least squares, LU unpacking, general eigendecomposition, matrix exponential,
Householder products and Cholesky solves.

Results follow PyTorch's CPU (LAPACK) kernels up to rounding:

- `linalg_lstsq` solves through the SVD: the minimum-norm solution with singular values at or below
  `rcond * s_max` dropped (rcond defaults to eps * max(m, n), as PyTorch's). For full-rank problems this
  is the solution every LAPACK driver returns; for rank-deficient ones it is gelsy/gelsd/gelss's
  minimum-norm solution (gelsy decides the rank by a pivoted QR's condition estimate, which agrees with the
  singular-value cutoff except for matrices right at the threshold). The other outputs are what CPU returns
  for each driver: `rank` for gelsy/gelsd/gelss, `singular_values` for gelsd/gelss, `residuals` (squared
  column norms of A X - B) when m > n for every driver but gelsy, and for gelsd/gelss only when every
  matrix has full rank. That last condition is data-dependent, so the op is a host kernel: one jitted call,
  plus one scalar read-back for gelsd/gelss when m > n. gels does not raise on rank-deficient input as
  LAPACK does (it returns the truncated solution).
- `linalg_eig`/`_linalg_eigvals` call LAPACK's geev through XLA, as CPU PyTorch does (same normalization
  of the eigenvectors); XLA has geev on CPU (and recent CUDA), not on TPU.
- `linalg_matrix_exp` is Pade scaling-and-squaring (`jax.scipy.linalg.expm`) with as many squarings as
  the norm needs (PyTorch uses Taylor polynomials: both are accurate to a few ulps).
"""

from __future__ import annotations

from functools import cache

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import torch

from hf_tpu.runtime.lowerings.table import lowers
from hf_tpu.runtime.tensors.tensor import to_jax, wrap

_LOW_PRECISION = (jnp.bfloat16, jnp.float16)


def _mH(x):
    return jnp.conj(jnp.swapaxes(x, -1, -2))


def _hp_matmul(x, y):
    return jnp.matmul(x, y, precision=jax.lax.Precision.HIGHEST)


# -- least squares -------------------------------------------------------------------------------------
_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")


def _real_dtype(dtype):
    return jnp.finfo(dtype).dtype


def _lstsq_math(a, b, rcond, driver: str, vector: bool):
    """(solution, residuals, rank, singular values) of `a` (*, m, n) and `b` (*, m, k) or (*, m)."""
    if vector:
        b = b[..., None]
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = jnp.broadcast_to(a, batch + a.shape[-2:])
    b = jnp.broadcast_to(b, batch + b.shape[-2:])
    m, n = a.shape[-2:]
    real = _real_dtype(a.dtype)
    eps = float(jnp.finfo(real).eps)
    if rcond is None:
        cutoff = eps * max(m, n)
    elif rcond < 0 and driver in ("gelsd", "gelss"):
        cutoff = eps  # LAPACK: a negative rcond means machine precision
    else:
        cutoff = float(rcond)
    if driver == "gels":
        cutoff = 0.0  # full rank is assumed; exact zeros are still dropped (no inf/NaN)
    if min(m, n) == 0:
        x = jnp.zeros(batch + (n, b.shape[-1]), a.dtype)
        s = jnp.zeros(batch + (0,), real)
        rank = jnp.zeros(batch, jnp.int64)
    else:
        u, s, vh = jnp.linalg.svd(a, full_matrices=False)
        keep = s > cutoff * s[..., :1]
        inv = jnp.where(keep, 1 / jnp.where(keep, s, 1), 0).astype(a.dtype)
        x = _hp_matmul(_mH(vh), inv[..., :, None] * _hp_matmul(_mH(u), b))
        rank = jnp.sum(keep, axis=-1).astype(jnp.int64)
    residuals = jnp.zeros((0,), real)
    if m > n and driver != "gelsy":
        r = _hp_matmul(a, x) - b
        residuals = jnp.sum(jnp.real(r * jnp.conj(r)), axis=-2).astype(real)
    if vector:
        x = x[..., 0]
    if driver == "gels":
        rank = jnp.zeros((0,), jnp.int64)
    if driver not in ("gelsd", "gelss"):
        s = jnp.zeros((0,), real)
    return x, residuals, rank, s


@cache
def _lstsq_jit(rcond, driver: str, vector: bool):
    return jax.jit(lambda a, b: _lstsq_math(a, b, rcond, driver, vector))


def _lstsq_checks(self: torch.Tensor, b: torch.Tensor, driver) -> tuple[bool, str]:
    if self.dim() < 2:
        raise RuntimeError("torch.linalg.lstsq: input must have at least 2 dimensions.")
    if b.dim() < 1:
        raise RuntimeError("torch.linalg.lstsq: other must have at least 1 dimension.")
    if self.dtype != b.dtype:
        raise RuntimeError(
            "torch.linalg.lstsq: Expected input and other to have the same dtype, but got input's dtype "
            f"{self.dtype} and other's dtype {b.dtype}"
        )
    if not (self.dtype.is_floating_point or self.dtype.is_complex):
        raise RuntimeError(
            f"torch.linalg.lstsq: Expected a floating point or complex tensor as input. Got {self.dtype}"
        )
    dim_diff = self.dim() - b.dim()
    if not 0 <= dim_diff <= 1:
        raise RuntimeError(
            "torch.linalg.lstsq: input.dim() must be greater or equal to other.dim() and "
            "(input.dim() - other.dim()) <= 1"
        )
    vector = dim_diff == 1
    rows = b.shape[-1] if vector else b.shape[-2]
    if self.shape[-2] != rows:
        raise RuntimeError("torch.linalg.lstsq: input.size(-2) should match other.size(-2)")
    driver = "gelsy" if driver is None else driver
    if driver not in _DRIVERS:
        raise RuntimeError(
            "torch.linalg.lstsq: parameter `driver` should be one of (gels, gelsy, gelsd, gelss)"
        )
    return vector, driver


@lowers("aten::linalg_lstsq", kind="host")
def linalg_lstsq(self: torch.Tensor, b: torch.Tensor, rcond=None, *, driver=None):
    vector, driver = _lstsq_checks(self, b, driver)
    x, residuals, rank, s = _lstsq_jit(rcond, driver, vector)(to_jax(self), to_jax(b))
    m, n = self.shape[-2:]
    if driver in ("gelsd", "gelss") and m > n and not bool(jnp.all(rank == n)):
        residuals = jnp.zeros((0,), residuals.dtype)  # CPU reports residuals only at full rank
    real = self.dtype.to_real()
    return wrap(x, self.dtype), wrap(residuals, real), wrap(rank, torch.int64), wrap(s, real)


@lowers("aten::linalg_lstsq.out", kind="host")
def linalg_lstsq_out(
    self, b, rcond=None, *, driver=None, solution, residuals, rank, singular_values
):  # fmt: skip
    results = linalg_lstsq(self, b, rcond, driver=driver)
    outs = (solution, residuals, rank, singular_values)
    for out, r in zip(outs, results):
        if not torch.can_cast(r.dtype, out.dtype):
            raise RuntimeError(f"result type {r.dtype} can't be cast to the desired output type {out.dtype}")
        out.resize_(r.shape)
        out.copy_(r)
    return outs


# -- LU ------------------------------------------------------------------------------------------------
def _permutation_matrix(perm, m: int, dtype):
    """P with A = P @ L @ U from `perm` (A[perm] = L @ U): P[perm[j], j] = 1."""
    onehot = perm[..., :, None] == jnp.arange(m, dtype=perm.dtype)  # [j, i] = (perm[j] == i)
    return jnp.swapaxes(onehot, -1, -2).astype(dtype)


def _split_lu(lu):
    m, n = lu.shape[-2:]
    k = min(m, n)
    lower = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
    upper = jnp.triu(lu[..., :k, :])
    return lower, upper


@lowers("aten::linalg_lu")
def linalg_lu(a, pivot=True):
    """A = P L U with partial pivoting: P (*, m, m), L (*, m, k) unit lower, U (*, k, n)."""
    if not pivot:
        raise RuntimeError("linalg.lu_factor: LU without pivoting is not implemented on the tpu")
    lu, _, perm = jax.lax.linalg.lu(a)
    lower, upper = _split_lu(lu)
    return _permutation_matrix(perm, a.shape[-2], a.dtype), lower, upper


@lowers("aten::lu_unpack")
def lu_unpack(lu, pivots, unpack_data=True, unpack_pivots=True):
    """(P, L, U) from `linalg.lu_factor`'s packed LU and 1-based LAPACK pivots."""
    m = lu.shape[-2]
    empty = jnp.zeros((0,), lu.dtype)
    if unpack_data:
        lower, upper = _split_lu(lu)
    else:
        lower = upper = empty
    if unpack_pivots:
        perm = jax.lax.linalg.lu_pivots_to_permutation((pivots - 1).astype(jnp.int32), m)
        p = _permutation_matrix(perm, m, lu.dtype)
    else:
        p = empty
    return p, lower, upper


# -- eigendecomposition of general matrices ------------------------------------------------------------
def _complex_input(a):
    return a.astype(jnp.float32) if a.dtype in _LOW_PRECISION else a


@lowers("aten::linalg_eig")
def linalg_eig(a):
    """Eigenvalues and unit-norm right eigenvectors (LAPACK geev), complex even for real input."""
    w, v = jnp.linalg.eig(_complex_input(a))
    return w, v


@lowers("aten::_linalg_eigvals")
def linalg_eigvals(a):
    return jnp.linalg.eigvals(_complex_input(a))


# -- matrix exponential --------------------------------------------------------------------------------
def _expm_maxnorm(dtype) -> float:
    """The 1-norm up to which jax's expm needs no squaring (its Pade-13 / Pade-7 bound)."""
    return 5.371920351148152 if dtype in (jnp.float64, jnp.complex128) else 3.925724783138660


@lowers("aten::linalg_matrix_exp")
def linalg_matrix_exp(a):
    """exp(A) by scaling and squaring: A / 2**s by Pade, then s squarings, s chosen per matrix."""
    ct = jnp.float32 if a.dtype in _LOW_PRECISION else a.dtype
    x = a.astype(ct)
    if x.shape[-1] == 0:
        return x
    norm = jnp.max(jnp.sum(jnp.abs(x), axis=-2), axis=-1)
    s = jnp.ceil(jnp.log2(norm / _expm_maxnorm(ct)))  # scaled norm <= the bound (jax floors: up to 2x)
    s = jnp.where(jnp.isfinite(s) & (s > 0), s, 0).astype(jnp.int32)
    scale = jnp.exp2(-s.astype(_real_dtype(ct))).astype(ct)
    r = jsl.expm(x * scale[..., None, None], max_squarings=0)
    if x.ndim == 2:
        r = jax.lax.fori_loop(0, s, lambda i, r: _hp_matmul(r, r), r)
    else:

        def square(i, r):
            return jnp.where((i < s)[..., None, None], _hp_matmul(r, r), r)

        r = jax.lax.fori_loop(0, jnp.max(s), square, r)
    return r.astype(a.dtype)


# -- Householder products and Cholesky solves ----------------------------------------------------------
@lowers("aten::linalg_householder_product")
def linalg_householder_product(a, tau):
    """The first n columns of H_1 ... H_k, H_i = I - tau_i v_i v_i^H (LAPACK orgqr)."""
    m, n = a.shape[-2:]
    k = tau.shape[-1]
    if m < n:
        raise RuntimeError(
            "torch.linalg.householder_product: input.shape[-2] must be greater than or equal to "
            "input.shape[-1]"
        )
    if n < k:
        raise RuntimeError(
            "torch.linalg.householder_product: input.shape[-1] must be greater than or equal to tau.shape[-1]"
        )
    if n == 0 or k == 0:
        return jnp.broadcast_to(jnp.eye(m, n, dtype=a.dtype), a.shape)
    return jax.lax.linalg.householder_product(a, tau.astype(a.dtype))


@lowers("aten::_cholesky_solve_helper")
def cholesky_solve_helper(b, factor, upper):
    """A^-1 B with A = L L^H (upper=False) or U^H U (upper=True); batch dims already broadcast."""
    lower = factor if not upper else _mH(factor)
    y = jax.lax.linalg.triangular_solve(lower, b, left_side=True, lower=True)
    return jax.lax.linalg.triangular_solve(
        lower, y, left_side=True, lower=True, transpose_a=True, conjugate_a=True
    )


@lowers("aten::cholesky_solve", graph=True)
def cholesky_solve(b, factor, upper=False):
    """`torch.cholesky_solve` in a graph: the batch dims of B and the factor broadcast, then the helper
    (eager reaches the helper through PyTorch's composite, which broadcasts)."""
    batch = jnp.broadcast_shapes(b.shape[:-2], factor.shape[:-2])
    b = jnp.broadcast_to(b, batch + b.shape[-2:])
    factor = jnp.broadcast_to(factor, batch + factor.shape[-2:])
    return cholesky_solve_helper(b, factor, upper)


@lowers("aten::_trilinear", graph=True)
def _trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    """`F.bilinear`'s core: each input gets size-1 dims at its `expand` positions, the three broadcast
    and multiply, and the `sumdim` dims are summed away."""

    def expand(x, dims):
        for d in sorted(dims):
            x = jnp.expand_dims(x, d)
        return x

    product = expand(i1, expand1) * expand(i2, expand2) * expand(i3, expand3)
    return jnp.sum(product, axis=tuple(sumdim)) if sumdim else product


@lowers("aten::linalg_pinv.atol_rtol_tensor", graph=True)
def linalg_pinv(x, atol=None, rtol=None, hermitian=False):
    """Moore-Penrose inverse with PyTorch's cutoff: singular values at most max(atol, rtol * largest)
    count as zero; rtol defaults to eps * max(m, n) when atol is not given (or is zero), else to 0.
    Through the SVD, or with `hermitian` through the eigendecomposition of the lower triangle (as CPU's
    eigh path reads it; the singular values are the eigenvalues' magnitudes)."""
    m, n = x.shape[-2:]
    if hermitian:
        low = jnp.tril(x)
        w, v = jnp.linalg.eigh(low + jnp.conj(jnp.swapaxes(jnp.tril(x, -1), -1, -2)))
        s = jnp.abs(w)
        u, vh = v, jnp.conj(jnp.swapaxes(v, -1, -2)) * jnp.sign(w)[..., :, None]
    else:
        u, s, vh = jnp.linalg.svd(x, full_matrices=False)
    real = s.dtype
    if rtol is None:
        default = jnp.finfo(real).eps * max(m, n)
        rtol = default if atol is None else jnp.where(jnp.asarray(atol) > 0, 0.0, default)
    atol = 0.0 if atol is None else atol
    largest = jnp.max(s, axis=-1, keepdims=True, initial=0.0)
    cutoff = jnp.maximum(jnp.asarray(atol, real)[..., None], jnp.asarray(rtol, real)[..., None] * largest)
    s_inv = jnp.where(s > cutoff, 1.0 / jnp.where(s > cutoff, s, 1.0), 0.0).astype(x.dtype)
    return jnp.matmul(
        jnp.conj(jnp.swapaxes(vh, -1, -2)) * s_inv[..., None, :], jnp.conj(jnp.swapaxes(u, -1, -2))
    )
