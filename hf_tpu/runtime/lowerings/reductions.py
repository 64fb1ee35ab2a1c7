"""Reductions, scans and softmax: sum/mean/prod, max/min and their indices, var/std, norms, any/all,
cumulative ops, softmax and its backward.

PyTorch conventions kept here: bf16/fp16 accumulate in float32 and integer/bool sums accumulate in
int64 (the dispatcher then casts to the dtype PyTorch's meta kernel reports); `dim=None` and `dim=[]`
reduce every axis for sum/mean/amax-style ops; ties in max/argmax pick the first occurrence and NaN
wins; 0-d tensors accept dim 0/-1.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from hf_tpu.runtime.buffers.dtypes import to_jax_dtype
from hf_tpu.runtime.lowerings.table import lowers

_HALF = (jnp.bfloat16, jnp.float16)


# -- helpers ------------------------------------------------------------------------------------
def _axes(x, dim, empty_means_all: bool = True) -> tuple[int, ...]:
    """Normalized reduction axes. `None` (and `[]` unless told otherwise) mean every axis."""
    if x.ndim == 0:
        return ()
    if dim is None:
        return tuple(range(x.ndim))
    if isinstance(dim, int):
        dim = [dim]
    if len(dim) == 0:
        return tuple(range(x.ndim)) if empty_means_all else ()
    return tuple(sorted({d % x.ndim for d in dim}))


def _axis(x, dim: int) -> int | None:
    """One normalized axis; None for a 0-d tensor (which PyTorch lets you reduce over dim 0/-1)."""
    return None if x.ndim == 0 else dim % x.ndim


def _is_float(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.floating)


def _is_complex(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.complexfloating)


def _acc_dtype(dtype):
    """The dtype PyTorch accumulates in: f32 for half types, int64 for integers and bool."""
    if dtype in _HALF:
        return jnp.float32
    if dtype == jnp.bool_ or jnp.issubdtype(dtype, jnp.integer):
        return jnp.int64
    return dtype


def _float_acc(dtype):
    """A floating dtype to compute in: f32 for half and non-float inputs, else the input's."""
    if _is_float(dtype) or _is_complex(dtype):
        return jnp.float32 if dtype in _HALF else dtype
    return jnp.float32


def _with_dtype(x, dtype):
    return x if dtype is None else x.astype(to_jax_dtype(dtype))


def _isnan(x):
    if _is_float(x.dtype) or _is_complex(x.dtype):
        return jnp.isnan(x)
    return jnp.zeros(x.shape, dtype=jnp.bool_)


def _count(x, axes) -> int:
    return math.prod(x.shape[a] for a in axes)


def _keep_shape(x, axes) -> tuple[int, ...]:
    return tuple(1 if i in axes else s for i, s in enumerate(x.shape))


# -- sum / mean / prod --------------------------------------------------------------------------
@lowers("aten::sum.default")
def sum_all(x, dtype=None):
    x = _with_dtype(x, dtype)
    return jnp.sum(x.astype(_acc_dtype(x.dtype)))


@lowers("aten::sum.dim_IntList")
def sum_dim(x, dim=None, keepdim=False, dtype=None):
    x = _with_dtype(x, dtype)
    return jnp.sum(x.astype(_acc_dtype(x.dtype)), axis=_axes(x, dim), keepdims=keepdim)


@lowers("aten::nansum.default")
def nansum(x, dim=None, keepdim=False, dtype=None):
    x = _with_dtype(x, dtype)
    x = jnp.where(_isnan(x), jnp.zeros((), x.dtype), x)
    # `dim=[]` reduces nothing: PyTorch's meta kernel says so (CPU eager sums everything; they disagree)
    axes = _axes(x, dim, empty_means_all=False)
    return jnp.sum(x.astype(_acc_dtype(x.dtype)), axis=axes, keepdims=keepdim)


@lowers("aten::mean.default")
def mean_all(x, dtype=None):
    return mean_dim(x, None, False, dtype)


@lowers("aten::mean.dim")
def mean_dim(x, dim=None, keepdim=False, dtype=None):
    x = _with_dtype(x, dtype)
    axes = _axes(x, dim)
    total = jnp.sum(x.astype(_float_acc(x.dtype)), axis=axes, keepdims=keepdim)
    return total / _count(x, axes)  # 0/0 = nan over empty dims, as in PyTorch


@lowers("aten::prod.default")
def prod_all(x, dtype=None):
    x = _with_dtype(x, dtype)
    return jnp.prod(x.astype(_acc_dtype(x.dtype)))


@lowers("aten::prod.dim_int")
def prod_dim(x, dim, keepdim=False, dtype=None):
    x = _with_dtype(x, dtype)
    return jnp.prod(x.astype(_acc_dtype(x.dtype)), axis=_axes(x, dim), keepdims=keepdim)


# -- max / min and their indices ----------------------------------------------------------------
@lowers("aten::amax")
def amax(x, dim=(), keepdim=False):
    return jnp.max(x, axis=_axes(x, dim), keepdims=keepdim)


@lowers("aten::amin")
def amin(x, dim=(), keepdim=False):
    return jnp.min(x, axis=_axes(x, dim), keepdims=keepdim)


@lowers("aten::max.default")
def max_all(x):
    return jnp.max(x)


@lowers("aten::min.default")
def min_all(x):
    return jnp.min(x)


def _arg_extreme(x, dim, keepdim, find):
    """argmax/argmin over one dim (None: the flattened tensor); first occurrence, NaN wins."""
    if dim is None:
        idx = find(x.reshape(-1), axis=0)
        return idx.reshape((1,) * x.ndim) if keepdim else idx
    axis = _axis(x, dim)
    if axis is None:
        return jnp.zeros((), jnp.int64)
    return find(x, axis=axis, keepdims=keepdim)


@lowers("aten::argmax")
def argmax(x, dim=None, keepdim=False):
    return _arg_extreme(x, dim, keepdim, jnp.argmax)


@lowers("aten::argmin")
def argmin(x, dim=None, keepdim=False):
    return _arg_extreme(x, dim, keepdim, jnp.argmin)


@lowers("aten::max.dim")
def max_dim(x, dim, keepdim=False):
    return amax(x, [dim], keepdim), _arg_extreme(x, dim, keepdim, jnp.argmax)


@lowers("aten::min.dim")
def min_dim(x, dim, keepdim=False):
    return amin(x, [dim], keepdim), _arg_extreme(x, dim, keepdim, jnp.argmin)


@lowers("aten::aminmax")
def aminmax(x, dim=None, keepdim=False):
    axes = _axes(x, dim)
    return jnp.min(x, axis=axes, keepdims=keepdim), jnp.max(x, axis=axes, keepdims=keepdim)


# -- variance and friends -----------------------------------------------------------------------
def _var_mean(x, dim, correction, keepdim):
    """(variance, mean) in the accumulation dtype; divides by max(N - correction, 0) like PyTorch."""
    axes = _axes(x, dim)
    xa = x.astype(_float_acc(x.dtype))
    n = _count(x, axes)
    mean = jnp.sum(xa, axis=axes, keepdims=True) / n
    d = xa - mean
    sq = jnp.real(d * jnp.conj(d)) if _is_complex(xa.dtype) else d * d
    c = 1 if correction is None else correction
    var = jnp.sum(sq, axis=axes, keepdims=keepdim) / jnp.maximum(n - c, 0)
    if not keepdim:
        mean = jnp.squeeze(mean, axis=axes)
    return var, mean


@lowers("aten::var.correction")
def var(x, dim=None, correction=None, keepdim=False):
    return _var_mean(x, dim, correction, keepdim)[0]


@lowers("aten::std.correction")
def std(x, dim=None, correction=None, keepdim=False):
    return jnp.sqrt(_var_mean(x, dim, correction, keepdim)[0])


@lowers("aten::var_mean.correction")
def var_mean(x, dim=None, correction=None, keepdim=False):
    return _var_mean(x, dim, correction, keepdim)


@lowers("aten::std_mean.correction")
def std_mean(x, dim=None, correction=None, keepdim=False):
    v, m = _var_mean(x, dim, correction, keepdim)
    return jnp.sqrt(v), m


# -- norms --------------------------------------------------------------------------------------
def _vector_norm(x, ord, dim, keepdim, dtype=None):
    """|x|_ord over `dim`; `ord` is a concrete number (0, ±inf, 1, 2 or any p)."""
    x = _with_dtype(x, dtype)
    a = jnp.abs(x.astype(_float_acc(x.dtype)))
    axes = _axes(x, dim)
    if ord == math.inf:
        return jnp.max(a, axis=axes, keepdims=keepdim)
    if ord == -math.inf:
        return jnp.min(a, axis=axes, keepdims=keepdim)
    if ord == 0:
        return jnp.sum((a != 0).astype(a.dtype), axis=axes, keepdims=keepdim)
    if ord == 1:
        return jnp.sum(a, axis=axes, keepdims=keepdim)
    if ord == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=axes, keepdims=keepdim))
    return jnp.sum(a**ord, axis=axes, keepdims=keepdim) ** (1.0 / ord)


@lowers("aten::linalg_vector_norm", static_scalars=True)
def linalg_vector_norm(x, ord=2, dim=None, keepdim=False, dtype=None):
    return _vector_norm(x, ord, dim, keepdim, dtype)


@lowers("aten::dist", graph=True)
def dist(x, other, p=2):
    """‖x - other‖_p over every element (broadcast), as `torch.dist`; eager decomposes it instead."""
    return _vector_norm(x - other, p, None, False)


@lowers("aten::norm.Scalar", static_scalars=True)
def norm_scalar(x, p=2):
    return _vector_norm(x, p, None, False)


@lowers("aten::norm.ScalarOpt_dtype", static_scalars=True)
def norm_dtype(x, p, dtype):
    return _vector_norm(x, 2 if p is None else p, None, False, dtype)


@lowers("aten::norm.ScalarOpt_dim", static_scalars=True)
def norm_dim(x, p, dim, keepdim=False):
    return _vector_norm(x, 2 if p is None else p, dim, keepdim)


@lowers("aten::norm.ScalarOpt_dim_dtype", static_scalars=True)
def norm_dim_dtype(x, p, dim, keepdim, dtype):
    return _vector_norm(x, 2 if p is None else p, dim, keepdim, dtype)


@lowers("aten::logsumexp")
def logsumexp(x, dim, keepdim=False):
    """log(sum(exp(x))) shifted by the max; an all -inf (or +inf) slice stays -inf (+inf)."""
    axes = _axes(x, dim)
    xa = x.astype(_float_acc(x.dtype))
    m = jnp.max(xa, axis=axes, keepdims=True, initial=-jnp.inf)
    m = jnp.where(jnp.isinf(m), jnp.zeros((), xa.dtype), m)
    out = jnp.log(jnp.sum(jnp.exp(xa - m), axis=axes, keepdims=True)) + m
    return out if keepdim else jnp.squeeze(out, axis=axes)


# -- boolean reductions -------------------------------------------------------------------------
@lowers("aten::any.default")
def any_all(x):
    return jnp.any(x != 0)


@lowers("aten::any.dim")
def any_dim(x, dim, keepdim=False):
    return jnp.any(x != 0, axis=_axes(x, dim), keepdims=keepdim)


@lowers("aten::any.dims")
def any_dims(x, dim=None, keepdim=False):
    # `dim=[]` reduces nothing here (unlike sum)
    return jnp.any(x != 0, axis=_axes(x, dim, empty_means_all=False), keepdims=keepdim)


@lowers("aten::all.default")
def all_all(x):
    return jnp.all(x != 0)


@lowers("aten::all.dim")
def all_dim(x, dim, keepdim=False):
    return jnp.all(x != 0, axis=_axes(x, dim), keepdims=keepdim)


@lowers("aten::all.dims")
def all_dims(x, dim=None, keepdim=False):
    return jnp.all(x != 0, axis=_axes(x, dim, empty_means_all=False), keepdims=keepdim)


@lowers("aten::count_nonzero.dim_IntList")
def count_nonzero_dims(x, dim):
    return jnp.sum((x != 0).astype(jnp.int64), axis=_axes(x, dim))


@lowers("aten::count_nonzero.default")
def count_nonzero(x, dim=None):
    return jnp.sum((x != 0).astype(jnp.int64), axis=_axes(x, dim))


# -- cumulative ops -----------------------------------------------------------------------------
@lowers("aten::cumsum")
def cumsum(x, dim, dtype=None):
    x = _with_dtype(x, dtype)
    xa = x.astype(_acc_dtype(x.dtype))
    axis = _axis(x, dim)
    return xa if axis is None else jnp.cumsum(xa, axis=axis)


@lowers("aten::cumprod")
def cumprod(x, dim, dtype=None):
    x = _with_dtype(x, dtype)
    xa = x.astype(_acc_dtype(x.dtype))
    axis = _axis(x, dim)
    return xa if axis is None else jnp.cumprod(xa, axis=axis)


def _cum_extreme(x, dim, later_wins):
    """Running extreme with its index: a later element wins ties (PyTorch), NaN beats everything."""
    axis = _axis(x, dim)
    if axis is None:
        return x, jnp.zeros((), jnp.int64)
    index = jax.lax.broadcasted_iota(jnp.int64, x.shape, axis)

    def combine(a, b):
        (av, ai), (bv, bi) = a, b
        take_b = _isnan(bv) | (~_isnan(av) & later_wins(bv, av))
        return jnp.where(take_b, bv, av), jnp.where(take_b, bi, ai)

    return jax.lax.associative_scan(combine, (x, index), axis=axis)


@lowers("aten::cummax")
def cummax(x, dim):
    return _cum_extreme(x, dim, lambda b, a: b >= a)


@lowers("aten::cummin")
def cummin(x, dim):
    return _cum_extreme(x, dim, lambda b, a: b <= a)


@lowers("aten::logcumsumexp", "aten::_logcumsumexp")
def logcumsumexp(x, dim):
    xa = x.astype(_float_acc(x.dtype))
    axis = _axis(x, dim)
    return xa if axis is None else jax.lax.cumlogsumexp(xa, axis=axis)


# -- softmax ------------------------------------------------------------------------------------
def _shifted(x, dim):
    """(x - max over dim, axes) in the compute dtype; empty slices get a -inf max, not an error."""
    xa = x.astype(_float_acc(x.dtype))
    axes = _axes(x, [dim])
    m = jnp.max(xa, axis=axes, keepdims=True, initial=-jnp.inf)
    return xa - m, axes


@lowers("aten::_softmax")
def softmax(x, dim, half_to_float=False):
    z, axes = _shifted(x, dim)
    e = jnp.exp(z)
    return e / jnp.sum(e, axis=axes, keepdims=True)


@lowers("aten::_log_softmax")
def log_softmax(x, dim, half_to_float=False):
    z, axes = _shifted(x, dim)
    return z - jnp.log(jnp.sum(jnp.exp(z), axis=axes, keepdims=True))


@lowers("aten::_safe_softmax")
def safe_softmax(x, dim, dtype=None):
    """Softmax that gives 0 (not NaN) on slices that are entirely -inf (fully masked attention rows)."""
    x = _with_dtype(x, dtype)
    out = softmax(x, dim)
    masked = jnp.all(x == -jnp.inf, axis=_axes(x, [dim]), keepdims=True)
    return jnp.where(masked, jnp.zeros((), out.dtype), out)


@lowers("aten::_softmax_backward_data")
def softmax_backward(grad, out, dim, input_dtype):
    g = grad.astype(_float_acc(grad.dtype))
    y = out.astype(g.dtype)
    axes = _axes(y, [dim])
    return y * (g - jnp.sum(g * y, axis=axes, keepdims=True))


@lowers("aten::_log_softmax_backward_data")
def log_softmax_backward(grad, out, dim, input_dtype):
    g = grad.astype(_float_acc(grad.dtype))
    y = out.astype(g.dtype)
    axes = _axes(y, [dim])
    return g - jnp.exp(y) * jnp.sum(g, axis=axes, keepdims=True)
