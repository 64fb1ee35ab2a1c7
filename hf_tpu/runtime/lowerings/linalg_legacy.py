"""Legacy and LAPACK-style linear algebra: `cholesky`, `cholesky_inverse`, `triangular_solve`, `geqrf`,
`ormqr`, and the symmetric-indefinite LDL^T factorization (`linalg_ldl_factor_ex`, `linalg_ldl_solve`).

Results follow PyTorch's CPU (LAPACK/MKL) kernels up to rounding:

- `cholesky` and `cholesky_inverse` read only the triangle LAPACK's potrf/potri read (lower, or upper with
  `upper=True`); `cholesky_inverse` is M^H M with M = L^-1 (or M M^H with M = U^-1), which XLA:CPU's
  dot makes exactly Hermitian, as CPU's result is. A matrix that is not positive definite gives NaNs
  instead of CPU's error (no device-to-host read per call, as `linalg_cholesky_ex` here, whose `info` is
  always 0).
- `triangular_solve` broadcasts the batch dimensions of B and A and returns A (broadcast) as its second
  output, as CPU; `transpose=True` solves with A^T, not A^H, like LAPACK's trsm with 'T'.
- `geqrf` is LAPACK's geqrf through XLA (`jnp.linalg.qr(mode="raw")`): the same Householder vectors and
  tau (beta = -sign(alpha) * norm, LAPACK's larfg convention) as CPU up to rounding. `ormqr` applies those
  reflectors to C without forming Q (`jax.lax.linalg.ormqr`); `transpose=True` means Q^H.
- `linalg_ldl_factor_ex` runs LAPACK's unblocked Bunch-Kaufman algorithm (sytf2 for symmetric input, hetf2
  for complex Hermitian, lower storage), so LD and the 1-based pivots (negative for 2 x 2 blocks) are those
  of CPU's sytrf/hetrf: the pivot choices are the same comparisons on the same values, only rounding differs
  (MKL's blocked sytrf for n > 64 too: blocking delays updates but chooses the same pivots). It reads the
  lower triangle; the upper triangle of LD is zero. `info` is LAPACK's (k > 0: D[k-1, k-1] is exactly zero);
  `check_errors=True` is not raised on (no host read), as in `linalg_cholesky_ex` here.
- `linalg_ldl_solve` is LAPACK's sytrs/hetrs on those factors (so it also solves with factors made on CPU).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from hf_tpu.runtime.lowerings.table import lowers

_LOW_PRECISION = (jnp.bfloat16, jnp.float16)
_ALPHA = (1 + math.sqrt(17.0)) / 8  # Bunch-Kaufman's pivot threshold (LAPACK's ALPHA)


def _mH(x: jax.Array) -> jax.Array:
    return jnp.conj(jnp.swapaxes(x, -1, -2))


def _hp_matmul(x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.matmul(x, y, precision=jax.lax.Precision.HIGHEST)


def _compute(x: jax.Array, op: str) -> jax.Array:
    """`x` in a dtype LAPACK-style kernels take: float32 for half types; integers are refused as on CPU."""
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        raise RuntimeError(f"{op}: expected a floating point or complex tensor, got {x.dtype}")
    return x.astype(jnp.float32) if x.dtype in _LOW_PRECISION else x


# -- Cholesky ------------------------------------------------------------------------------------------
@lowers("aten::cholesky")
def cholesky(a: jax.Array, upper: bool = False) -> jax.Array:
    """L with A = L L^H from A's lower triangle, or U with A = U^H U from its upper one (upper=True)."""
    x = _compute(a, "cholesky")
    # U^H U = A  <=>  L L^H = A^H with L = U^H, and A^H's lower triangle is A's upper one conjugated
    lower = jax.lax.linalg.cholesky(_mH(x) if upper else x, symmetrize_input=False)
    return _mH(lower) if upper else lower


@lowers("aten::cholesky_inverse")
def cholesky_inverse(factor: jax.Array, upper: bool = False) -> jax.Array:
    """A^-1 from A's Cholesky factor: (L L^H)^-1 = L^-H L^-1, or (U^H U)^-1 = U^-1 U^-H (LAPACK potri)."""
    f = _compute(factor, "cholesky_inverse")
    n = f.shape[-1]
    eye = jnp.broadcast_to(jnp.eye(n, dtype=f.dtype), f.shape)
    inv = jax.lax.linalg.triangular_solve(f, eye, left_side=True, lower=not upper)  # reads one triangle
    return _hp_matmul(inv, _mH(inv)) if upper else _hp_matmul(_mH(inv), inv)


# -- triangular solve ----------------------------------------------------------------------------------
@lowers("aten::triangular_solve")
def triangular_solve(
    b: jax.Array, a: jax.Array, upper: bool = True, transpose: bool = False, unitriangular: bool = False
) -> tuple[jax.Array, jax.Array]:
    """(X, A) with op(A) X = B, op(A) = A or A^T; only A's `upper`/lower triangle is read."""
    batch = jnp.broadcast_shapes(b.shape[:-2], a.shape[:-2])
    a = jnp.broadcast_to(a, batch + a.shape[-2:])
    b = jnp.broadcast_to(b, batch + b.shape[-2:])
    x = jax.lax.linalg.triangular_solve(
        _compute(a, "triangular_solve"),
        _compute(b, "triangular_solve"),
        left_side=True,
        lower=not upper,
        transpose_a=transpose,
        unit_diagonal=unitriangular,
    )
    return x, a


# -- Householder QR ------------------------------------------------------------------------------------
@lowers("aten::geqrf")
def geqrf(a: jax.Array) -> tuple[jax.Array, jax.Array]:
    """LAPACK's compact QR: R on and above the diagonal, the Householder vectors below it, and their tau."""
    if a.ndim < 2:
        raise RuntimeError("torch.geqrf: input must have at least 2 dimensions.")
    x = _compute(a, "geqrf")
    m, n = x.shape[-2:]
    if min(m, n) == 0 or x.size == 0:
        return x, jnp.zeros(x.shape[:-2] + (min(m, n),), x.dtype)
    h, tau = jnp.linalg.qr(x, mode="raw")  # h is geqrf's output transposed (numpy's convention)
    return jnp.swapaxes(h, -1, -2), tau


@lowers("aten::ormqr")
def ormqr(
    reflectors: jax.Array, tau: jax.Array, other: jax.Array, left: bool = True, transpose: bool = False
) -> jax.Array:
    """Q C, Q^H C, C Q or C Q^H with Q = H_1 ... H_k from geqrf's (reflectors, tau); Q is never formed."""
    c = _compute(other, "ormqr")
    k = tau.shape[-1]
    if k == 0 or c.size == 0:
        return c
    v = reflectors[..., :, :k].astype(c.dtype)  # LAPACK reads the first k columns only
    return jax.lax.linalg.ormqr(v, tau.astype(c.dtype), c, left=left, transpose=transpose)


# -- LDL^T (Bunch-Kaufman) -----------------------------------------------------------------------------
def _abs1(x: jax.Array) -> jax.Array:
    """LAPACK's pivot magnitude: |x| for real, |Re x| + |Im x| (CABS1) for complex."""
    if jnp.iscomplexobj(x):
        return jnp.abs(jnp.real(x)) + jnp.abs(jnp.imag(x))
    return jnp.abs(x)


def _ldl_factor_one(a: jax.Array, hermitian: bool) -> tuple[jax.Array, jax.Array, jax.Array]:
    """LAPACK's sytf2/hetf2 with uplo='L' on one n x n matrix: (LD, 1-based pivots, info).

    Step k picks a 1 x 1 pivot (possibly after swapping rows/columns k and kp of the trailing matrix) or a
    2 x 2 one (swapping k+1 and kp), then updates the trailing matrix; columns before k are left in place,
    so L is LAPACK's product form P_1 L_1 P_2 L_2 ... and `_ldl_solve_one` undoes it in the same order."""
    n = a.shape[-1]
    herm = hermitian and jnp.iscomplexobj(a)
    conj = jnp.conj if herm else (lambda z: z)
    idx = jnp.arange(n)
    row, col = idx[:, None], idx[None, :]
    diag_mask = row == col

    def real_diag(x):
        return jnp.where(diag_mask, jnp.real(x).astype(x.dtype), x) if herm else x

    def diag_abs(z):  # hetf2 measures a diagonal entry by |Re|
        return jnp.abs(jnp.real(z)) if herm else _abs1(z)

    def body(state):
        a, piv, info, k = state
        # the symmetric (Hermitian) matrix stored in `a`'s lower triangle
        full = a + conj(jnp.swapaxes(jnp.tril(a, -1), 0, 1))
        colk = a[:, k]
        absakk = diag_abs(colk[k])
        colabs = jnp.where(idx > k, _abs1(colk), -1)
        imax = jnp.argmax(colabs)  # the first largest, as LAPACK's i?amax
        colmax = jnp.maximum(colabs[imax], 0)
        rowabs = jnp.where((idx >= k) & (idx != imax), _abs1(full[imax]), -1)
        rowmax = jnp.max(rowabs)
        aii = diag_abs(a[imax, imax])
        zero = (jnp.maximum(absakk, colmax) == 0) | jnp.isnan(absakk)
        keep = zero | (absakk >= _ALPHA * colmax) | (absakk >= _ALPHA * colmax * (colmax / rowmax))
        two = ~keep & ~(aii >= _ALPHA * rowmax)
        kp = jnp.where(keep, k, imax)
        kk = k + two.astype(k.dtype)
        # interchange rows and columns kk and kp of the trailing matrix (a symmetric permutation)
        perm = idx.at[kk].set(kp).at[kp].set(kk)
        trailing = (row >= k) & (col >= k)
        a = jnp.tril(jnp.where(trailing, full[perm][:, perm], full))
        # 1 x 1 pivot: A[k+1:, k+1:] -= x x^H / d, then x /= d
        colk = a[:, k]
        d = jnp.real(colk[k]).astype(a.dtype) if herm else colk[k]
        d11 = 1 / d
        x = jnp.where(idx > k, colk, 0)
        a1 = a + jnp.tril(x[:, None] * (-d11 * conj(x))[None, :])
        a1 = a1.at[:, k].set(jnp.where(idx > k, x * d11, colk))
        # 2 x 2 pivot on rows/columns k, k+1 (k + 1 < n whenever it is chosen)
        k1 = jnp.minimum(k + 1, n - 1)
        colk1 = a[:, k1]
        below = idx > k1
        ck = jnp.where(below, colk, 0)
        ck1 = jnp.where(below, colk1, 0)
        if herm:
            d = jnp.abs(colk[k1])
            e11 = jnp.real(colk1[k1]) / d
            e22 = jnp.real(colk[k]) / d
            t = 1 / (e11 * e22 - 1)
            d21 = colk[k1] / d
            d = t / d
            wk = d * (e11 * ck - d21 * ck1)
            wkp1 = d * (e22 * ck1 - jnp.conj(d21) * ck)
        else:
            d21 = colk[k1]
            e11 = colk1[k1] / d21
            e22 = colk[k] / d21
            t = 1 / (e11 * e22 - 1)
            d21 = t / d21
            wk = d21 * (e11 * ck - ck1)
            wkp1 = d21 * (e22 * ck1 - ck)
        a2 = a - jnp.tril(ck[:, None] * conj(wk)[None, :] + ck1[:, None] * conj(wkp1)[None, :])
        a2 = a2.at[:, k].set(jnp.where(below, wk, colk)).at[:, k1].set(jnp.where(below, wkp1, colk1))
        a = real_diag(jnp.where(zero, a, jnp.where(two, a2, a1)))
        p = jnp.where(two, -(kp + 1), kp + 1).astype(piv.dtype)
        piv = jnp.where((idx == k) | (two & (idx == k1)), p, piv)
        info = jnp.where(zero & (info == 0), k + 1, info).astype(info.dtype)
        return a, piv, info, k + 1 + two.astype(k.dtype)

    state = (
        real_diag(jnp.tril(a)),
        jnp.zeros((n,), jnp.int32),
        jnp.zeros((), jnp.int32),
        jnp.zeros((), jnp.int32),
    )
    ld, piv, info, _ = jax.lax.while_loop(lambda s: s[3] < n, body, state)
    return ld, piv, info


def _batched(fn, batch: tuple[int, ...], *arrays: jax.Array):
    """`fn` on single matrices, mapped over the (common) leading `batch` dimensions of `arrays`."""
    nb = len(batch)
    flat = [x.reshape((-1,) + x.shape[nb:]) for x in arrays]
    out = jax.vmap(fn)(*flat)
    return jax.tree_util.tree_map(lambda y: y.reshape(batch + y.shape[1:]), out)


@lowers("aten::linalg_ldl_factor_ex")
def linalg_ldl_factor_ex(
    a: jax.Array, hermitian: bool = False, check_errors: bool = False
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(LD, pivots, info) of LAPACK's sytrf/hetrf (Bunch-Kaufman, lower): see the module docstring."""
    x = _compute(a, "torch.linalg.ldl_factor_ex")
    batch, n = x.shape[:-2], x.shape[-1]
    if n == 0 or math.prod(batch) == 0:
        return jnp.tril(x), jnp.zeros(batch + (n,), jnp.int32), jnp.zeros(batch, jnp.int32)
    return _batched(lambda m: _ldl_factor_one(m, hermitian), batch, x)


def _ldl_solve_one(ld: jax.Array, piv: jax.Array, b: jax.Array, hermitian: bool) -> jax.Array:
    """LAPACK's sytrs/hetrs with uplo='L': X = A^-1 B from (LD, pivots) of `_ldl_factor_one`."""
    n = ld.shape[-1]
    herm = hermitian and jnp.iscomplexobj(ld)
    conj = jnp.conj if herm else (lambda z: z)
    idx = jnp.arange(n)

    def swap(b, i, j):
        return b[idx.at[i].set(j).at[j].set(i)]

    def forward(state):  # solve (P L D) Y = B, one pivot block at a time
        k, b = state
        p = piv[k]
        one = p > 0
        k1 = jnp.minimum(k + 1, n - 1)
        colk, colk1 = ld[:, k], ld[:, k1]
        # 1 x 1 block
        b1 = swap(b, k, p - 1)
        b1 = b1 - jnp.where(idx > k, colk, 0)[:, None] * b1[k][None, :]
        dk = jnp.real(colk[k]).astype(ld.dtype) if herm else colk[k]
        b1 = b1.at[k].set(b1[k] * (1 / dk))
        # 2 x 2 block on rows k, k+1
        b2 = swap(b, k1, -p - 1)
        below = idx > k1
        b2 = b2 - jnp.where(below, colk, 0)[:, None] * b2[k][None, :]
        b2 = b2 - jnp.where(below, colk1, 0)[:, None] * b2[k1][None, :]
        akm1k = colk[k1]
        akm1 = colk[k] / conj(akm1k)
        ak = colk1[k1] / akm1k
        denom = akm1 * ak - 1
        bkm1 = b2[k] / conj(akm1k)
        bk = b2[k1] / akm1k
        b2 = b2.at[k].set((ak * bkm1 - bk) / denom).at[k1].set((akm1 * bk - bkm1) / denom)
        return k + jnp.where(one, 1, 2), jnp.where(one, b1, b2)

    def backward(state):  # solve (P L)^H X = Y from the last block up
        k, b = state
        p = piv[k]
        one = p > 0
        km1 = jnp.maximum(k - 1, 0)
        below = (idx > k)[:, None]
        rows_k = b[k] - jnp.sum(jnp.where(below, conj(ld[:, k])[:, None] * b, 0), axis=0)
        rows_km1 = b[km1] - jnp.sum(jnp.where(below, conj(ld[:, km1])[:, None] * b, 0), axis=0)
        b1 = swap(b.at[k].set(rows_k), k, p - 1)
        b2 = swap(b.at[k].set(rows_k).at[km1].set(rows_km1), k, -p - 1)
        return k - jnp.where(one, 1, 2), jnp.where(one, b1, b2)

    zero = jnp.zeros((), jnp.int32)
    _, b = jax.lax.while_loop(lambda s: s[0] < n, forward, (zero, b))
    _, b = jax.lax.while_loop(lambda s: s[0] >= 0, backward, (zero + n - 1, b))
    return b


@lowers("aten::linalg_ldl_solve")
def linalg_ldl_solve(ld: jax.Array, pivots: jax.Array, b: jax.Array, hermitian: bool = False) -> jax.Array:
    """A^-1 B from `linalg_ldl_factor`'s (LD, pivots) (LAPACK sytrs/hetrs); batch dimensions broadcast."""
    x = _compute(ld, "torch.linalg.ldl_solve")
    rhs = _compute(b, "torch.linalg.ldl_solve").astype(x.dtype)
    batch = jnp.broadcast_shapes(x.shape[:-2], rhs.shape[:-2])
    x = jnp.broadcast_to(x, batch + x.shape[-2:])
    piv = jnp.broadcast_to(pivots.astype(jnp.int32), batch + pivots.shape[-1:])
    rhs = jnp.broadcast_to(rhs, batch + rhs.shape[-2:])
    if rhs.size == 0:
        return rhs
    return _batched(lambda m, p, r: _ldl_solve_one(m, p, r, hermitian), batch, x, piv, rhs)
