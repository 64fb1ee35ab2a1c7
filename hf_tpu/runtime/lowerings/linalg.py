"""Matrix products (mm, bmm, addmm, baddbmm, dot, mv, grouped MoE matmuls), pairwise distances (cdist,
pdist) and small dense linear algebra.

Products of bf16/fp16 accumulate in float32 (as PyTorch's CPU and CUDA kernels do) and round once.
Float32 products follow `torch.set_float32_matmul_precision`: "highest" (PyTorch's default) keeps full
float32 on TPU, "high"/"medium" let the MXU use bf16 passes. The setting is read when an op is traced.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import torch

from hf_tpu.runtime.buffers import platform
from hf_tpu.runtime.buffers.dtypes import to_jax_dtype
from hf_tpu.runtime.lowerings.table import lowers
from hf_tpu.runtime.tensors.tensor import to_jax, wrap

_LOW_PRECISION = (jnp.bfloat16, jnp.float16)


def precision():
    """The XLA dot precision matching `torch.get_float32_matmul_precision()`."""
    return {
        "highest": jax.lax.Precision.HIGHEST,
        "high": jax.lax.Precision.HIGH,
    }.get(torch.get_float32_matmul_precision(), jax.lax.Precision.DEFAULT)


def accumulation_type(dtype):
    """float32 accumulation for half types; None (the input type) otherwise."""
    return jnp.float32 if dtype in _LOW_PRECISION else None


def operands(*arrays):
    """Half-precision operands as given on TPU/GPU (native bf16 x bf16 -> f32 dots); upcast on XLA:CPU,
    whose dot thunks lack mixed-precision products (same values: bf16 products are exact in f32)."""
    if arrays[0].dtype in _LOW_PRECISION and platform.platform_name() == "cpu":
        return tuple(a.astype(jnp.float32) for a in arrays)
    return arrays


def matmul(x, y):
    """x @ y with PyTorch's accumulation and precision conventions; returns the accumulation dtype."""
    acc = accumulation_type(x.dtype)
    x, y = operands(x, y)
    return jnp.matmul(x, y, precision=precision(), preferred_element_type=acc)


def _scaled_sum(self, product, beta, alpha):
    """beta * self + alpha * product; beta == 0 ignores `self` entirely (NaN/inf included), as PyTorch.

    Integer and bool products take `Scalar.to<scalar_t>()` of beta and alpha first, as CPU does:
    beta=0.6 truncates to 0 on int64 (and so drops `self`), any nonzero value is True on bool."""
    if not jnp.issubdtype(product.dtype, jnp.inexact):
        beta = jnp.asarray(beta).astype(product.dtype)
        alpha = jnp.asarray(alpha).astype(product.dtype)
    scaled = jnp.where(beta == 0, jnp.zeros((), product.dtype), beta * self.astype(product.dtype))
    return scaled + alpha * product


@lowers("aten::mm")
def mm(x, y):
    return matmul(x, y)


@lowers("aten::_int_mm")
def int_mm(x, y):
    """int8 x int8 -> int32 (quantized inference): exact, accumulated in int32 as CPU's kernel does."""
    if x.dtype not in (jnp.int8, jnp.uint8) or y.dtype != x.dtype:
        raise RuntimeError(
            f"_int_mm: Expected int8 or uint8 inputs of one dtype, got {x.dtype} and {y.dtype}"
        )
    return jnp.matmul(x, y, preferred_element_type=jnp.int32)


@lowers("aten::bmm")
def bmm(x, y):
    return matmul(x, y)


@lowers("aten::addmm")
def addmm(self, mat1, mat2, beta=1, alpha=1):
    return _scaled_sum(self, matmul(mat1, mat2), beta, alpha)


@lowers("aten::baddbmm")
def baddbmm(self, batch1, batch2, beta=1, alpha=1):
    return _scaled_sum(self, matmul(batch1, batch2), beta, alpha)


@lowers("aten::addbmm")
def addbmm(self, batch1, batch2, beta=1, alpha=1):
    """Sum over the batch of products, added to a matrix."""
    acc = accumulation_type(batch1.dtype)
    batch1, batch2 = operands(batch1, batch2)
    product = jnp.einsum("bij,bjk->ik", batch1, batch2, precision=precision(), preferred_element_type=acc)
    return _scaled_sum(self, product, beta, alpha)


@lowers("aten::dot")
def dot(x, y):
    return matmul(x, y)


@lowers("aten::vdot")
def vdot(x, y):
    return matmul(jnp.conj(x), y)


@lowers("aten::mv")
def mv(mat, vec):
    return matmul(mat, vec)


@lowers("aten::addmv")
def addmv(self, mat, vec, beta=1, alpha=1):
    return _scaled_sum(self, matmul(mat, vec), beta, alpha)


@lowers("aten::addr")
def addr(self, vec1, vec2, beta=1, alpha=1):
    return _scaled_sum(self, jnp.outer(vec1, vec2), beta, alpha)


# -- grouped matmul (Mixture-of-Experts) -------------------------------------------------------------
def _group_sizes(offs, total):
    """int32 end offsets -> per-group sizes (what jax.lax.ragged_dot expects)."""
    ends = jnp.minimum(offs.astype(jnp.int32), total)
    return jnp.diff(ends, prepend=jnp.zeros((1,), jnp.int32))


def _ragged(lhs, rhs, group_sizes, lhs_ragged, contracting, rhs_group):
    acc = jnp.float32 if lhs.dtype in _LOW_PRECISION else lhs.dtype
    lhs, rhs = operands(lhs, rhs)
    dims = jax.lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(contracting, ((), ())),
        lhs_ragged_dimensions=[lhs_ragged],
        rhs_group_dimensions=rhs_group,
    )
    return jax.lax.ragged_dot_general(
        lhs,
        rhs,
        group_sizes,
        dims,
        precision=precision(),
        preferred_element_type=acc,
    )


@jax.jit
def _grouped_2d_3d(a, b, offs):
    """(M, K) rows grouped by offs @ (G, K, N) -> (M, N); rows past offs[-1] are zero."""
    return _ragged(
        a, b, _group_sizes(offs, a.shape[0]), lhs_ragged=0, contracting=((1,), (1,)), rhs_group=[0]
    )


@jax.jit
def _grouped_2d_2d(a, b, offs):
    """(M, K) @ (K, N) with K split by offs -> (G, M, N): one product per slice of K (weight grads)."""
    return _ragged(a, b, _group_sizes(offs, a.shape[1]), lhs_ragged=1, contracting=((1,), (0,)), rhs_group=[])


@jax.jit
def _grouped_3d_2d(a, b, offs):
    """(G, M, K) @ (K, N) with N split by offs -> (M, N): group g fills its columns of the output."""
    out_t = _grouped_2d_3d(b.T, jnp.swapaxes(a, 1, 2), offs)  # (N, K) grouped @ (G, K, M) -> (N, M)
    return out_t.T


@jax.jit
def _grouped_3d_3d(a, b):
    return matmul(a, b)


def grouped_mm(a, b, offs=None, bias=None):
    """The grouped matmul on arrays, in the accumulation dtype (bias added)."""
    dims = (a.ndim, b.ndim)
    if dims == (3, 3):
        if offs is not None:
            raise RuntimeError("_grouped_mm: offs must be None when both operands are 3D")
        out = _grouped_3d_3d(a, b)
    else:
        if offs is None:
            raise RuntimeError(
                f"_grouped_mm: offs is required when an operand is 2D (got {dims[0]}D x {dims[1]}D)"
            )
        fn = {(2, 3): _grouped_2d_3d, (2, 2): _grouped_2d_2d, (3, 2): _grouped_3d_2d}.get(dims)
        if fn is None:
            raise RuntimeError(f"_grouped_mm: operands must be 2D or 3D, got {dims[0]}D and {dims[1]}D")
        out = fn(a, b, offs)
    return out if bias is None else out + bias


@lowers("aten::_grouped_mm", graph=True)
def _grouped_mm_graph(a, b, offs=None, bias=None, out_dtype=None):
    """Inside traced graphs (the output dtype comes from the graph's metadata)."""
    return grouped_mm(a, b, offs, bias)


@lowers("aten::_grouped_mm", kind="host")
def _grouped_mm(self, mat2, offs=None, bias=None, out_dtype=None):
    """torch._grouped_mm: the MoE expert matmul (int32 end offsets delimit the jagged dimension).

    Host kind because PyTorch's meta kernel accepts bfloat16 only, while its CPU kernel (and we)
    take every float type.
    """
    out = grouped_mm(
        to_jax(self),
        to_jax(mat2),
        None if offs is None else to_jax(offs),
        None if bias is None else to_jax(bias),
    )
    dtype = out_dtype or self.dtype
    return wrap(out.astype(to_jax_dtype(dtype)), dtype)


# -- dense linear algebra (cheap, batched, float32/float64) -----------------------------------------
def _lu_info(lu):
    """getrf's info: the 1-based position of U's first exactly-zero diagonal element (a singular
    matrix), else 0. `torch.linalg.inv`/`solve`/`lu_factor` raise from it, as on CPU and CUDA."""
    if lu.shape[-1] == 0:
        return jnp.zeros(lu.shape[:-2], jnp.int32)
    zero = jnp.diagonal(lu, axis1=-2, axis2=-1) == 0
    return jnp.where(jnp.any(zero, axis=-1), jnp.argmax(zero, axis=-1) + 1, 0).astype(jnp.int32)


@lowers("aten::linalg_inv_ex")
def linalg_inv_ex(a, check_errors=False):
    lu, piv = _lu_factor(a)
    eye = jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape)
    return jsl.lu_solve((lu, piv - 1), eye), _lu_info(lu)


def _cholesky_info(a, lower):
    """potrf's info: the order of the first leading minor that is not positive-definite, else 0. XLA's
    Cholesky fills a failed factor with NaN, so the order is found (only then) by an unblocked
    elimination of the diagonal, as LAPACK's."""
    if a.shape[-1] == 0 or a.size == 0:
        return jnp.zeros(a.shape[:-2], jnp.int32)
    failed = ~jnp.all(jnp.isfinite(jnp.diagonal(lower, axis1=-2, axis2=-1)), axis=-1)

    def first_failure(m):
        n = m.shape[-1]

        def step(k, state):
            low, info = state
            d = jnp.real(m[k, k]) - jnp.sum(jnp.abs(low[k]) ** 2)
            bad = (info == 0) & ~(d > 0)
            info = jnp.where(bad, k + 1, info)
            root = jnp.sqrt(jnp.where(d > 0, d, 1.0))
            col = (m[:, k] - low @ jnp.conj(low[k])) / root
            col = jnp.where(jnp.arange(n) > k, col, 0).at[k].set(root)
            return low.at[:, k].set(col.astype(low.dtype)), info

        return jax.lax.fori_loop(0, n, step, (jnp.zeros_like(m), jnp.int32(0)))[1]

    flat = a.reshape((-1,) + a.shape[-2:])
    infos = jax.lax.map(
        lambda m_f: jax.lax.cond(m_f[1], first_failure, lambda m: jnp.int32(0), m_f[0]),
        (flat, failed.reshape(-1)),
    )
    return infos.reshape(a.shape[:-2])


@lowers("aten::linalg_cholesky_ex")
def linalg_cholesky_ex(a, upper=False, check_errors=False):
    lower = jnp.linalg.cholesky(a)
    factor = jnp.conj(jnp.swapaxes(lower, -1, -2)) if upper else lower
    return factor, _cholesky_info(a, lower)


def _lu_factor(a):
    """LU with partial pivoting; pivots 1-based as LAPACK/PyTorch report them."""
    lu, piv = jsl.lu_factor(a)
    return lu, (piv + 1).astype(jnp.int32)


@lowers("aten::linalg_lu_factor_ex")
def linalg_lu_factor_ex(a, pivot=True, check_errors=False):
    if not pivot:
        raise RuntimeError("linalg.lu_factor: LU without pivoting is not supported on tpu")
    lu, piv = _lu_factor(a)
    return lu, piv, _lu_info(lu)


@lowers("aten::linalg_lu_solve")
def linalg_lu_solve(lu, pivots, b, left=True, adjoint=False):
    piv = (pivots - 1).astype(jnp.int32)
    if left:
        return jsl.lu_solve((lu, piv), b, trans=2 if adjoint else 0)
    # X A = B  <=>  A^H X^H = B^H  (adjoint=False);  X A^H = B  <=>  A X^H = B^H
    bh = jnp.conj(jnp.swapaxes(b, -1, -2))
    xh = jsl.lu_solve((lu, piv), bh, trans=0 if adjoint else 2)
    return jnp.conj(jnp.swapaxes(xh, -1, -2))


def _det_from_lu(lu, piv):
    n = lu.shape[-1]
    swaps = jnp.sum(piv != jnp.arange(1, n + 1, dtype=jnp.int32), axis=-1)
    sign = jnp.where(swaps % 2 == 0, 1, -1).astype(lu.dtype)
    return sign, jnp.diagonal(lu, axis1=-2, axis2=-1)


@lowers("aten::_linalg_det")
def _linalg_det(a):
    """det and the LU factors PyTorch saves for the backward: those of A^T (LAPACK's column-major view)."""
    lu, piv = _lu_factor(jnp.swapaxes(a, -1, -2))
    sign, diag = _det_from_lu(lu, piv)
    return sign * jnp.prod(diag, axis=-1), lu, piv


@lowers("aten::_linalg_slogdet")
def _linalg_slogdet(a):
    lu, piv = _lu_factor(jnp.swapaxes(a, -1, -2))
    sign, diag = _det_from_lu(lu, piv)
    if jnp.issubdtype(a.dtype, jnp.complexfloating):
        phase = sign * jnp.prod(diag / jnp.abs(diag), axis=-1)
    else:
        phase = sign * jnp.prod(jnp.sign(diag), axis=-1)
    return phase, jnp.sum(jnp.log(jnp.abs(diag)), axis=-1), lu, piv


@lowers("aten::_linalg_solve_ex")
def _linalg_solve_ex(a, b, left=True, check_errors=False):
    lu, piv = _lu_factor(a)
    vector = b.ndim == a.ndim - 1  # B is a (batch of) vector(s)
    rhs = b[..., None] if vector else b
    x = linalg_lu_solve(lu, piv, rhs, left=left)
    return (x[..., 0] if vector else x), lu, piv, _lu_info(lu)


@lowers("aten::linalg_solve_triangular")
def linalg_solve_triangular(a, b, upper, left=True, unitriangular=False):
    if left:
        return jsl.solve_triangular(a, b, lower=not upper, unit_diagonal=unitriangular)
    # X A = B  <=>  A^T X^T = B^T
    xt = jsl.solve_triangular(
        a, jnp.swapaxes(b, -1, -2), trans=1, lower=not upper, unit_diagonal=unitriangular
    )
    return jnp.swapaxes(xt, -1, -2)


@lowers("aten::_linalg_eigh")
def _linalg_eigh(a, UPLO="L", compute_v=True):
    w, v = jnp.linalg.eigh(a, UPLO=UPLO, symmetrize_input=False)  # read one triangle only, as LAPACK
    return w, v if compute_v else jnp.zeros((0,), a.dtype)


@lowers("aten::_linalg_svd")
def _linalg_svd(a, full_matrices=False, compute_uv=True, driver=None):
    if not compute_uv:
        s = jnp.linalg.svd(a, compute_uv=False)
        return jnp.zeros((0,), a.dtype), s, jnp.zeros((0,), a.dtype)
    u, s, vh = jnp.linalg.svd(a, full_matrices=full_matrices)
    return u, s, vh


# -- pairwise distances (cdist, pdist) ----------------------------------------------------------------
# PyTorch's CPU kernels (DistanceOpsKernel) reduce |a - b| per norm: p=0 counts nonzero differences,
# p=1 sums, p=2 takes sqrt of the sum of squares, p=inf the max, other p pow(sum |d|^p, 1/p). p=2 on
# many rows takes the matmul form |a|^2 - 2 a.b + |b|^2 instead (compute_mode), like `_euclidean_dist`.
def _norm_compute_dtype(x):
    return jnp.float32 if x.dtype in _LOW_PRECISION else x.dtype


def _pnorm_of_diffs(diff, p: float):
    """The p-norm over the last axis of |differences| `diff` (>= 0), CPU's formula for each p."""
    if p == 0:
        return jnp.sum(jnp.minimum(jnp.ceil(diff), 1), axis=-1)  # NaN propagates, as CPU
    if p == 1:
        return jnp.sum(diff, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(diff * diff, axis=-1))
    if math.isinf(p):
        # std::max(agg, NaN) keeps agg: NaN differences never win
        return jnp.max(jnp.where(jnp.isnan(diff), 0, diff), axis=-1, initial=0)
    return jnp.power(jnp.sum(jnp.power(diff, p), axis=-1), 1.0 / p)


def _batch_broadcast(x1, x2):
    """x1 (*b1, P, M) and x2 (*b2, R, M) with their batch dims broadcast together."""
    batch = jnp.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    return jnp.broadcast_to(x1, batch + x1.shape[-2:]), jnp.broadcast_to(x2, batch + x2.shape[-2:])


def _uses_mm(p: float, compute_mode, r1: int, r2: int) -> bool:
    """CPU's rule: p=2 goes through a matmul when asked (1) or, by default (0/None), past 25 rows."""
    mode = 0 if compute_mode is None else compute_mode
    return p == 2 and (mode == 1 or (mode == 0 and (r1 > 25 or r2 > 25)))


def _euclidean_mm(x1, x2):
    """sqrt(max(|a|^2 - 2 a.b + |b|^2, 0)) as one matmul of augmented rows, as `_euclidean_dist`."""
    n1 = jnp.sum(x1 * x1, axis=-1, keepdims=True)
    n2 = jnp.sum(x2 * x2, axis=-1, keepdims=True)
    a = jnp.concatenate([-2 * x1, n1, jnp.ones_like(n1)], axis=-1)
    b = jnp.concatenate([x2, jnp.ones_like(n2), n2], axis=-1)
    sq = jnp.matmul(a, jnp.swapaxes(b, -1, -2), precision=precision())
    return jnp.sqrt(jnp.maximum(sq, 0))


@lowers("aten::_cdist_forward")
def _cdist_forward(x1, x2, p: float, compute_mode=None):
    """Distances between the rows of x1 (*, P, M) and x2 (*, R, M): (*, P, R)."""
    ct = _norm_compute_dtype(x1)
    a, b = _batch_broadcast(x1.astype(ct), x2.astype(ct))
    if _uses_mm(p, compute_mode, a.shape[-2], b.shape[-2]):
        return _euclidean_mm(a, b)
    diff = jnp.abs(a[..., :, None, :] - b[..., None, :, :])
    return _pnorm_of_diffs(diff, p)


def _sign(v):
    """CPU's vectorized sign: 0 for 0, +-1 otherwise, NaN for NaN."""
    return jnp.clip(jnp.ceil(v), 0, 1) + jnp.clip(jnp.floor(v), -1, 0)


def _pnorm_grad(diff, grad, dist, p: float):
    """d dist / d a times grad for one pair, per coordinate; `diff` = a - b (signed), CPU's formulas:
    0 where the distance is 0 (a subgradient), |d|^(p-1) terms for p < 2 zeroed at d == 0 when p < 1."""
    grad, dist = grad[..., None], dist[..., None]
    zero = jnp.zeros((), diff.dtype)
    if p == 1:
        return grad * _sign(diff)
    if math.isinf(p):
        return grad * _sign(diff) * (1 - jnp.minimum(1, jnp.ceil(jnp.abs(jnp.abs(diff) - dist))))
    if p == 2:
        return jnp.where(dist == 0, zero, grad * diff / dist)
    if p < 2:
        term = _sign(diff) * jnp.power(jnp.abs(diff), p - 1) * grad / jnp.power(dist, p - 1)
        term = jnp.where(dist == 0, zero, term)
        return jnp.where((diff == 0) & (p < 1), zero, term)
    term = diff * jnp.power(jnp.abs(diff), p - 2) * grad / jnp.power(dist, p - 1)
    return jnp.where(dist == 0, zero, term)


@lowers("aten::_cdist_backward")
def _cdist_backward(grad, x1, x2, p: float, cdist):
    """Gradient for x1 (at the broadcast batch shape; autograd reduces it): sum over x2's rows."""
    ct = _norm_compute_dtype(x1)
    a, b = _batch_broadcast(x1.astype(ct), x2.astype(ct))
    if p == 0 or 0 in a.shape or 0 in b.shape:
        return jnp.zeros(a.shape, x1.dtype)
    diff = a[..., :, None, :] - b[..., None, :, :]
    terms = _pnorm_grad(diff, grad.astype(ct), cdist.astype(ct), p)
    return jnp.sum(terms, axis=-2).astype(x1.dtype)


def _upper_pairs(n: int):
    """Row indices (i, j), i < j, in PyTorch's pdist order (row-major upper triangle)."""
    i, j = np.triu_indices(n, k=1)
    return jnp.asarray(i, jnp.int32), jnp.asarray(j, jnp.int32)


@lowers("aten::_pdist_forward")
def _pdist_forward(x, p: float = 2.0):
    """Distances between every pair of rows i < j of x (N, M): N (N - 1) / 2 values."""
    ct = _norm_compute_dtype(x)
    i, j = _upper_pairs(x.shape[0])
    xc = x.astype(ct)
    return _pnorm_of_diffs(jnp.abs(xc[i] - xc[j]), p)


@lowers("aten::_pdist_backward")
def _pdist_backward(grad, x, p: float, pdist):
    """Each pair's gradient goes to row i and, negated, to row j."""
    ct = _norm_compute_dtype(x)
    if p == 0 or pdist.shape[0] == 0:
        return jnp.zeros(x.shape, x.dtype)
    i, j = _upper_pairs(x.shape[0])
    xc = x.astype(ct)
    terms = _pnorm_grad(xc[i] - xc[j], grad.astype(ct), pdist.astype(ct), p)
    out = jnp.zeros(x.shape, ct).at[i].add(terms).at[j].add(-terms)
    return out.astype(x.dtype)


@lowers("aten::linalg_qr")
def linalg_qr(a, mode="reduced"):
    """Householder QR (LAPACK's geqrf/orgqr on CPU, as PyTorch); mode "r" returns an empty Q."""
    if mode == "r":
        return jnp.zeros((0,), a.dtype), jnp.linalg.qr(a, mode="r")
    q, r = jnp.linalg.qr(a, mode=mode)
    return q, r


@lowers("aten::_linalg_check_errors", graph=True)
def _linalg_check_errors_in_graph(info, api_name, is_matrix):
    """Inside a compiled graph the factorization's `info` is not checked: an XLA program cannot raise
    without a sync, so a singular or non-positive-definite input gives inf/nan there (as on torch_xla),
    while eager tpu ops raise CPU's LinAlgError."""
    return None
