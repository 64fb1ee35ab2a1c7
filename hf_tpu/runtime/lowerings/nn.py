"""Neural-network layers: normalization, pooling, pixel shuffle (losses live in `losses.py`,
resampling and grid sampling in `resampling.py`).

Conventions shared by this family:
- Statistics and reductions of bf16/fp16 inputs run in float32 and the result is cast back, as
  PyTorch's CPU kernels do.
- Everything that depends only on shapes (window positions, interpolation weights, pool divisors) is
  computed with numpy while tracing, so the traced program is a few slices/gathers/matmuls with constants.
- Normalization backward ops use the saved statistics with the closed-form gradient (as PyTorch does);
  the linear ops' backward passes (pooling, resampling) are the VJPs of the forward functions here.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np

from hf_tpu.runtime.lowerings.table import lowers
from hf_tpu.runtime.tensors.tensor import to_jax, wrap, write

_HALF = (jnp.bfloat16, jnp.float16)


def _compute_dtype(dtype):
    return jnp.float32 if dtype in _HALF else dtype


def _upcast(x):
    return None if x is None else x.astype(_compute_dtype(x.dtype))


def _pullback(fn, x, cotangent):
    """d fn / d x applied to `cotangent` (fn linear or not; evaluated at x)."""
    out, vjp = jax.vjp(fn, x)
    return vjp(cotangent.astype(out.dtype))[0]


# -- normalization -----------------------------------------------------------------------------------
def _normalize(x, stat_axes, eps):
    """(x - mean) * rstd over `stat_axes`, in float32 for half inputs; also returns mean and rstd."""
    xf = _upcast(x)
    mean = jnp.mean(xf, axis=stat_axes, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=stat_axes, keepdims=True)
    rstd = jax.lax.rsqrt(var + eps)
    return (xf - mean) * rstd, mean, rstd


def _affine(y, weight, bias):
    if weight is not None:
        y = y * _upcast(weight)
    if bias is not None:
        y = y + _upcast(bias)
    return y


def _norm_backward(dy, x, mean, rstd, weight, stat_axes, param_axes, mask, batch_stats=True):
    """Closed-form gradients of y = (x - mean) * rstd * w + b, with mean/rstd saved by the forward.

    batch_stats: mean/rstd were computed from x (training); else they are constants (eval batch norm).
    """
    dy = _upcast(dy)
    xhat = (_upcast(x) - mean) * rstd
    g = dy * _upcast(weight) if weight is not None else dy
    grad_input = grad_weight = grad_bias = None
    if mask[0]:
        if batch_stats:
            mean_g = jnp.mean(g, axis=stat_axes, keepdims=True)
            mean_gx = jnp.mean(g * xhat, axis=stat_axes, keepdims=True)
            grad_input = rstd * (g - mean_g - xhat * mean_gx)
        else:
            grad_input = g * rstd
    if mask[1]:
        grad_weight = jnp.sum(dy * xhat, axis=param_axes)
    if mask[2]:
        grad_bias = jnp.sum(dy, axis=param_axes)
    return grad_input, grad_weight, grad_bias


def _trailing(x, n):
    return tuple(range(x.ndim - n, x.ndim))


@lowers("aten::native_layer_norm")
def native_layer_norm(x, normalized_shape, weight, bias, eps):
    y, mean, rstd = _normalize(x, _trailing(x, len(normalized_shape)), eps)
    return _affine(y, weight, bias), mean, rstd


@lowers("aten::native_layer_norm_backward")
def native_layer_norm_backward(grad_out, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    n = len(normalized_shape)
    leading = tuple(range(x.ndim - n))
    mean = _upcast(mean).reshape(x.shape[: x.ndim - n] + (1,) * n)
    rstd = _upcast(rstd).reshape(mean.shape)
    mask = (output_mask[0], output_mask[1] and weight is not None, output_mask[2] and bias is not None)
    return _norm_backward(grad_out, x, mean, rstd, weight, _trailing(x, n), leading, mask)


def _rms_axes_and_eps(x, normalized_shape, eps):
    """RMS norm's axes and eps (default: machine epsilon of the float32/float64 compute type)."""
    return _trailing(x, len(normalized_shape)), float(
        jnp.finfo(_compute_dtype(x.dtype)).eps
    ) if eps is None else eps


@lowers("aten::_fused_rms_norm")
def _fused_rms_norm(x, normalized_shape, weight, eps):
    """F.rms_norm on tpu arrives here whole (PyTorch's composite rms_norm calls it for PrivateUse1)."""
    axes, eps = _rms_axes_and_eps(x, normalized_shape, eps)
    xf = _upcast(x)
    rstd = jax.lax.rsqrt(jnp.mean(jnp.square(xf), axis=axes, keepdims=True) + eps)
    return _affine(xf * rstd, weight, None), rstd


@lowers("aten::_fused_rms_norm_backward")
def _fused_rms_norm_backward(grad_out, x, normalized_shape, rstd, weight, output_mask):
    axes = _trailing(x, len(normalized_shape))
    dy, rstd = _upcast(grad_out), _upcast(rstd)
    y = _upcast(x) * rstd
    grad_input = grad_weight = None
    if output_mask[0]:
        g = dy * _upcast(weight) if weight is not None else dy
        grad_input = rstd * (g - y * jnp.mean(g * y, axis=axes, keepdims=True))
    if output_mask[1] and weight is not None:
        grad_weight = jnp.sum(dy * y, axis=tuple(range(x.ndim - len(normalized_shape))))
    return grad_input, grad_weight


def _grouped(x, n, group):
    """(N, C, *spatial) -> (N, G, C/G, prod(spatial)): group norm's statistics run over the last two."""
    return x.reshape(n, group, x.shape[1] // group, math.prod(x.shape[2:]))


def _group_param(v, group):
    return None if v is None else v.reshape(1, group, -1, 1)


@lowers("aten::native_group_norm")
def native_group_norm(x, weight, bias, N, C, HxW, group, eps):
    """Reshape + mean/var (never a per-group loop: a lax.map version was 54x slower on a UNet)."""
    y, mean, rstd = _normalize(_grouped(x, N, group), (2, 3), eps)
    y = _affine(y, _group_param(weight, group), _group_param(bias, group))
    return y.reshape(x.shape), mean.reshape(N, group), rstd.reshape(N, group)


@lowers("aten::native_group_norm_backward")
def native_group_norm_backward(grad_out, x, mean, rstd, weight, N, C, HxW, group, output_mask):
    xg = _grouped(x, N, group)
    mean = _upcast(mean).reshape(N, group, 1, 1)
    rstd = _upcast(rstd).reshape(N, group, 1, 1)
    gi, gw, gb = _norm_backward(
        _grouped(grad_out, N, group), xg, mean, rstd, _group_param(weight, group), (2, 3), (0, 3), output_mask
    )
    return (
        None if gi is None else gi.reshape(x.shape),
        None if gw is None else gw.reshape(C),
        None if gb is None else gb.reshape(C),
    )


# batch norm: statistics per channel (dim 1) over batch and spatial dims
def _bn_axes(x):
    return (0,) + tuple(range(2, x.ndim))


def _bn_train(x, weight, bias, running_mean, running_var, momentum, eps):
    """Training batch norm: output, save_mean, save_invstd, updated running mean/var (or None)."""
    axes = _bn_axes(x)
    y, mean, rstd = _normalize(x, axes, eps)
    out = _affine(y, _channel(weight, x), _channel(bias, x))
    save_mean, save_invstd = mean.reshape(-1), rstd.reshape(-1)
    new_mean = new_var = None
    if running_mean is not None:
        new_mean = (1 - momentum) * _upcast(running_mean) + momentum * save_mean
    if running_var is not None:
        n = x.size // x.shape[1]
        var = jnp.var(_upcast(x), axis=axes)
        unbiased = var * (n / max(n - 1, 1))
        new_var = (1 - momentum) * _upcast(running_var) + momentum * unbiased
    return out, save_mean, save_invstd, new_mean, new_var


def _bn_eval(x, weight, bias, running_mean, running_var, eps):
    """Inference batch norm as PyTorch's CPU kernel evaluates it: x * scale + shift per channel."""
    mean = _upcast(running_mean)
    invstd = 1 / jnp.sqrt(_upcast(running_var) + eps)
    scale = invstd if weight is None else invstd * _upcast(weight)
    shift = -mean * scale if bias is None else _upcast(bias) - mean * scale
    out = _upcast(x) * _channel(scale, x) + _channel(shift, x)
    return out, mean, invstd


def _channel(v, x):
    return None if v is None else v.reshape((1, -1) + (1,) * (x.ndim - 2))


_bn_train_jit = jax.jit(_bn_train, static_argnums=(5, 6))
_bn_eval_jit = jax.jit(_bn_eval, static_argnums=(5,))


def _arr(t):
    return None if t is None else to_jax(t)


def _batch_norm_host(x, weight, bias, running_mean, running_var, training, momentum, eps, empty_eval_stats):
    """Batch norm on torch tensors: writes updated running statistics in place when training."""
    xa = to_jax(x)
    if training:
        out, save_mean, save_invstd, new_mean, new_var = _bn_train_jit(
            xa, _arr(weight), _arr(bias), _arr(running_mean), _arr(running_var), float(momentum), float(eps)
        )
        if running_mean is not None:
            write(running_mean, new_mean.astype(to_jax(running_mean).dtype))
        if running_var is not None:
            write(running_var, new_var.astype(to_jax(running_var).dtype))
    else:
        if running_mean is None or running_var is None:
            raise RuntimeError("batch_norm: running_mean and running_var must be defined in evaluation mode")
        out, save_mean, save_invstd = _bn_eval_jit(
            xa, _arr(weight), _arr(bias), _arr(running_mean), _arr(running_var), float(eps)
        )
        if empty_eval_stats:
            save_mean = save_invstd = jnp.zeros((0,), jnp.float32)
    stat_dtype = save_mean.dtype if x.dtype.is_floating_point and x.dtype.itemsize >= 4 else jnp.float32
    return (
        wrap(out.astype(xa.dtype), x.dtype),
        wrap(save_mean.astype(stat_dtype)),
        wrap(save_invstd.astype(stat_dtype)),
    )


@lowers("aten::native_batch_norm", kind="host")
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    return _batch_norm_host(input, weight, bias, running_mean, running_var, training, momentum, eps, True)


@lowers("aten::_native_batch_norm_legit", kind="host")
def _native_batch_norm_legit(input, weight, bias, running_mean, running_var, training, momentum, eps):
    return _batch_norm_host(input, weight, bias, running_mean, running_var, training, momentum, eps, True)


@lowers("aten::_native_batch_norm_legit.no_stats", kind="host")
def _native_batch_norm_legit_no_stats(input, weight, bias, training, momentum, eps):
    return _batch_norm_host(input, weight, bias, None, None, True, momentum, eps, True)


@lowers("aten::_native_batch_norm_legit.no_stats", graph=True)
def _native_batch_norm_legit_no_stats_graph(x, weight, bias, training, momentum, eps):
    """Batch statistics with no running ones to update (instance norm, a BatchNorm with
    track_running_stats=False) inside a traced graph: (out, save_mean, save_invstd)."""
    out, mean, invstd, _, _ = _bn_train(x, weight, bias, None, None, momentum, eps)
    return out, mean, invstd


@lowers("aten::_batch_norm_with_update", kind="host")
def _batch_norm_with_update(input, weight, bias, running_mean, running_var, momentum, eps):
    out, mean, invstd = _batch_norm_host(
        input, weight, bias, running_mean, running_var, True, momentum, eps, True
    )
    return out, mean, invstd, wrap(jnp.zeros((0,), jnp.uint8))


@lowers("aten::_native_batch_norm_legit_functional")
def _native_batch_norm_legit_functional(x, weight, bias, running_mean, running_var, training, momentum, eps):
    if training:
        out, mean, invstd, new_mean, new_var = _bn_train(
            x, weight, bias, running_mean, running_var, momentum, eps
        )
        return out, mean, invstd, new_mean, new_var
    out, mean, invstd = _bn_eval(x, weight, bias, running_mean, running_var, eps)
    return out, mean, invstd, running_mean, running_var


@lowers("aten::_batch_norm_with_update_functional", graph=True)
def _batch_norm_with_update_functional(x, weight, bias, running_mean, running_var, momentum, eps):
    """A training step's batch norm in a graph: (out, save_mean, save_invstd, reserve, new running mean,
    new running var); aot_autograd writes the new statistics back into the module's buffers."""
    out, mean, invstd, new_mean, new_var = _bn_train(
        x, weight, bias, running_mean, running_var, momentum, eps
    )
    return out, mean, invstd, jnp.zeros((0,), jnp.uint8), new_mean, new_var


@lowers("aten::_native_batch_norm_legit_no_training")
def _native_batch_norm_legit_no_training(x, weight, bias, running_mean, running_var, momentum, eps):
    return _bn_eval(x, weight, bias, running_mean, running_var, eps)


@lowers("aten::_batch_norm_no_update")
def _batch_norm_no_update(x, weight, bias, running_mean, running_var, momentum, eps):
    if running_mean is None:
        out, mean, invstd, _, _ = _bn_train(x, weight, bias, None, None, momentum, eps)
    else:
        out, mean, invstd = _bn_eval(x, weight, bias, running_mean, running_var, eps)
    return out, mean, invstd, jnp.zeros((0,), jnp.uint8)


def _bn_backward(grad_out, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps, mask):
    if train:
        mean, rstd = _upcast(save_mean), _upcast(save_invstd)
    else:
        mean = _upcast(running_mean)
        rstd = jax.lax.rsqrt(_upcast(running_var) + eps)
    mask = (mask[0], mask[1] and weight is not None, mask[2])
    axes = _bn_axes(x)
    return _norm_backward(
        grad_out, x, _channel(mean, x), _channel(rstd, x), _channel(weight, x), axes, axes, mask, train
    )


@lowers("aten::native_batch_norm_backward")
def native_batch_norm_backward(
    grad_out, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask
):
    return _bn_backward(
        grad_out, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask
    )


@lowers("aten::batch_norm_backward")
def batch_norm_backward(
    grad_out, x, weight, running_mean, running_var, save_mean, save_var, update, eps, output_mask, reserve
):
    train = save_mean is not None and save_mean.size > 0
    return _bn_backward(
        grad_out, x, weight, running_mean, running_var, save_mean, save_var, train, eps, output_mask
    )


# -- pooling -----------------------------------------------------------------------------------------
def _pool_out_size(size, k, s, p, d, ceil_mode):
    """PyTorch's pooling_output_shape."""
    out = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _pool_params(x, n, kernel_size, stride, padding, dilation=(1,)):
    """Normalize PyTorch's int-or-list pooling arguments to n-tuples (stride=[] means kernel_size)."""

    def expand(v):
        v = tuple(v)
        return v * n if len(v) == 1 else v

    kernel = expand(kernel_size)
    stride = expand(stride) if len(stride) else kernel
    return kernel, stride, expand(padding), expand(dilation)


def _windows(x, kernel, stride, padding, dilation, ceil_mode, fill):
    """All kernel offsets of the pooling windows over the last len(kernel) dims, as strided slices.

    Returns (slices, positions): slices[j] is the input value at window offset j for every output
    position; positions[..., j] is that element's flat index in the (unpadded) input plane.
    """
    n = len(kernel)
    sizes = x.shape[-n:]
    outs = [
        _pool_out_size(sz, k, s, p, d, ceil_mode)
        for sz, k, s, p, d in zip(sizes, kernel, stride, padding, dilation)
    ]
    pads = []
    for sz, k, s, p, d, o in zip(sizes, kernel, stride, padding, dilation, outs):
        needed = (o - 1) * s + d * (k - 1) + 1
        pads.append((p, max(0, needed - sz - p)))
    xp = jnp.pad(x, [(0, 0)] * (x.ndim - n) + pads, constant_values=fill)
    lead = x.ndim - n
    slices, positions = [], []
    plane_strides = [math.prod(sizes[i + 1 :]) for i in range(n)]
    for offset in itertools.product(*[range(k) for k in kernel]):
        start = [0] * lead + [i * d for i, d in zip(offset, dilation)]
        limit = list(x.shape[:lead]) + [st + (o - 1) * s + 1 for st, o, s in zip(start[lead:], outs, stride)]
        slices.append(jax.lax.slice(xp, start, limit, [1] * lead + list(stride)))
        pos = np.zeros(outs, np.int64)
        for dim in range(n):
            coord = np.arange(outs[dim]) * stride[dim] - padding[dim] + offset[dim] * dilation[dim]
            pos = pos + (coord * plane_strides[dim]).reshape([-1 if i == dim else 1 for i in range(n)])
        positions.append(pos)
    return slices, np.stack(positions, axis=-1)


def _lowest(dtype):
    return -jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min


def _max_pool(x, kernel_size, stride, padding, dilation, ceil_mode, n):
    kernel, stride, padding, dilation = _pool_params(x, n, kernel_size, stride, padding, dilation)
    slices, positions = _windows(x, kernel, stride, padding, dilation, ceil_mode, _lowest(x.dtype))
    stacked = jnp.stack(slices, axis=-1)
    arg = jnp.argmax(stacked, axis=-1)
    values = jnp.take_along_axis(stacked, arg[..., None], axis=-1)[..., 0]
    indices = jnp.take_along_axis(jnp.broadcast_to(positions, stacked.shape), arg[..., None], axis=-1)
    return values, indices[..., 0]


@lowers("aten::max_pool2d_with_indices")
def max_pool2d_with_indices(x, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    return _max_pool(x, kernel_size, stride, padding, dilation, ceil_mode, 2)


@lowers("aten::max_pool3d_with_indices")
def max_pool3d_with_indices(x, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    return _max_pool(x, kernel_size, stride, padding, dilation, ceil_mode, 3)


def _scatter_to_plane(grad, indices, x, n):
    """Sum `grad` into a zero input-shaped tensor at flat plane `indices` (max pool backward)."""
    lead = x.shape[: x.ndim - n]
    plane = math.prod(x.shape[x.ndim - n :])
    g = _upcast(grad).reshape(math.prod(lead), -1)
    idx = indices.reshape(math.prod(lead), -1)
    rows = jnp.arange(g.shape[0])[:, None]
    out = jnp.zeros((g.shape[0], plane), g.dtype).at[rows, idx].add(g)
    return out.reshape(x.shape)


@lowers("aten::max_pool2d_with_indices_backward")
def max_pool2d_with_indices_backward(
    grad_output, x, kernel_size, stride, padding, dilation, ceil_mode, indices
):
    return _scatter_to_plane(grad_output, indices, x, 2)


@lowers("aten::max_pool3d_with_indices_backward")
def max_pool3d_with_indices_backward(
    grad_output, x, kernel_size, stride, padding, dilation, ceil_mode, indices
):
    return _scatter_to_plane(grad_output, indices, x, 3)


def _avg_divisor(sizes, kernel, stride, padding, ceil_mode, count_include_pad):
    """PyTorch's per-window divisor (separable per dim), as a numpy constant over the output grid."""
    divisor = np.ones((), np.float64)
    for sz, k, s, p in zip(sizes, kernel, stride, padding):
        out = _pool_out_size(sz, k, s, p, 1, ceil_mode)
        start = np.arange(out) * s - p
        end = np.minimum(start + k, sz + p)
        pool = end - start
        valid = np.minimum(end, sz) - np.maximum(start, 0)
        divisor = np.multiply.outer(divisor, pool if count_include_pad else valid)
    return divisor


def _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, n):
    kernel, stride, padding, _ = _pool_params(x, n, kernel_size, stride, padding)
    xf = _upcast(x)
    slices, _ = _windows(xf, kernel, stride, padding, (1,) * n, ceil_mode, 0)
    total = sum(slices[1:], slices[0])
    if divisor_override:
        return total / divisor_override
    divisor = _avg_divisor(x.shape[-n:], kernel, stride, padding, ceil_mode, count_include_pad)
    return total / divisor.astype(xf.dtype)


@lowers("aten::avg_pool2d")
def avg_pool2d(
    x, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True, divisor_override=None
):
    return _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 2)


@lowers("aten::avg_pool3d")
def avg_pool3d(
    x, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True, divisor_override=None
):
    return _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 3)


@lowers("aten::avg_pool2d_backward")
def avg_pool2d_backward(
    grad_output, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
):
    fn = lambda v: _avg_pool(
        v, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 2
    )
    return _pullback(fn, x, grad_output)


@lowers("aten::avg_pool3d_backward")
def avg_pool3d_backward(
    grad_output, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
):
    fn = lambda v: _avg_pool(
        v, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 3
    )
    return _pullback(fn, x, grad_output)


def _adaptive_bounds(size, out):
    start = (np.arange(out) * size) // out
    end = -((-(np.arange(out) + 1) * size) // out)  # ceil
    return start, end


def _adaptive_avg_matrix(size, out):
    start, end = _adaptive_bounds(size, out)
    cols = np.arange(size)
    inside = (cols[None, :] >= start[:, None]) & (cols[None, :] < end[:, None])
    return inside / (end - start)[:, None]


def _taps(m):
    """A sparse (out, in) weight matrix as T taps per output: (indices (out, T), weights (out, T))."""
    nonzero = m != 0
    t = max(int(nonzero.sum(axis=1).max(initial=0)), 1)
    order = np.argsort(~nonzero, axis=1, kind="stable")[:, :t]
    return order, np.take_along_axis(m, order, axis=1)


def _apply_per_axis(x, matrices):
    """Resample each of the last len(matrices) dims of x by its (out, in) weight matrix.

    The weights are sparse (2 taps for linear, 4 for cubic, a window for pooling), so each axis is a
    gather of T neighbours and a weighted sum: O(out * T) work, never a dense (out x in) product.
    """
    n = len(matrices)
    for i, m in enumerate(matrices):
        axis = x.ndim - n + i
        idx, w = _taps(m)
        out, t = idx.shape
        g = jnp.take(x, jnp.asarray(idx.reshape(-1)), axis=axis)
        g = g.reshape(x.shape[:axis] + (out, t) + x.shape[axis + 1 :])
        weights = jnp.asarray(w, x.dtype).reshape((out, t) + (1,) * (x.ndim - axis - 1))
        x = jnp.sum(g * weights, axis=axis + 1)
    return x


def _adaptive_avg(x, output_size):
    n = len(output_size)
    mats = [_adaptive_avg_matrix(sz, o) for sz, o in zip(x.shape[-n:], output_size)]
    return _apply_per_axis(_upcast(x), mats)


@lowers("aten::_adaptive_avg_pool2d", "aten::_adaptive_avg_pool3d")
def _adaptive_avg_pool(x, output_size):
    return _adaptive_avg(x, tuple(output_size))


@lowers("aten::_adaptive_avg_pool2d_backward")
def _adaptive_avg_pool2d_backward(grad_output, x):
    return _pullback(lambda v: _adaptive_avg(v, grad_output.shape[-2:]), _upcast(x), grad_output)


@lowers("aten::_adaptive_avg_pool3d_backward")
def _adaptive_avg_pool3d_backward(grad_output, x):
    return _pullback(lambda v: _adaptive_avg(v, grad_output.shape[-3:]), _upcast(x), grad_output)


def _adaptive_max(x, output_size):
    """Variable-size windows padded to the largest one by repeating their last index (max unchanged)."""
    n = len(output_size)
    sizes = x.shape[-n:]
    idx = []
    for sz, o in zip(sizes, output_size):
        start, end = _adaptive_bounds(sz, o)
        width = int((end - start).max())
        j = np.minimum(start[:, None] + np.arange(width)[None, :], end[:, None] - 1)  # (o, width)
        idx.append(j)
    lead = x.ndim - n
    # gather each axis: (..., o1, w1, o2, w2, ...)
    g = x
    for i, j in enumerate(idx):
        axis = lead + 2 * i
        g = jnp.take(g, j, axis=axis)  # replaces axis by (o, width)
    # move window dims last: (..., o1, o2, ..., w1, w2, ...)
    order = list(range(lead)) + [lead + 2 * i for i in range(n)] + [lead + 2 * i + 1 for i in range(n)]
    g = jnp.transpose(g, order)
    win_shape = g.shape[-n:]
    flat = g.reshape(g.shape[: lead + n] + (-1,))
    arg = jnp.argmax(flat, axis=-1)
    values = jnp.take_along_axis(flat, arg[..., None], axis=-1)[..., 0]
    # flat plane index of the winner
    local = jnp.unravel_index(arg, win_shape)
    plane_strides = [math.prod(sizes[i + 1 :]) for i in range(n)]
    index = 0
    for dim in range(n):
        table = jnp.asarray(idx[dim])  # (o_dim, width_dim)
        shape = [1] * n
        shape[dim] = output_size[dim]
        rows = jnp.arange(output_size[dim]).reshape(shape)
        index = index + table[rows, local[dim]] * plane_strides[dim]
    return values, index.astype(jnp.int64)


@lowers("aten::adaptive_max_pool2d", "aten::adaptive_max_pool3d")
def adaptive_max_pool(x, output_size):
    return _adaptive_max(x, tuple(output_size))


@lowers("aten::adaptive_max_pool2d_backward")
def adaptive_max_pool2d_backward(grad_output, x, indices):
    return _scatter_to_plane(grad_output, indices, x, 2)


@lowers("aten::adaptive_max_pool3d_backward")
def adaptive_max_pool3d_backward(grad_output, x, indices):
    return _scatter_to_plane(grad_output, indices, x, 3)


# -- pixel shuffle ------------------------------------------------------------------------------------
@lowers("aten::pixel_shuffle")
def pixel_shuffle(x, upscale_factor):
    r = upscale_factor
    *lead, c, h, w = x.shape
    y = x.reshape(*lead, c // (r * r), r, r, h, w)
    k = len(lead)
    y = jnp.transpose(y, list(range(k)) + [k, k + 3, k + 1, k + 4, k + 2])
    return y.reshape(*lead, c // (r * r), h * r, w * r)


@lowers("aten::pixel_unshuffle")
def pixel_unshuffle(x, downscale_factor):
    r = downscale_factor
    *lead, c, h, w = x.shape
    y = x.reshape(*lead, c, h // r, r, w // r, r)
    k = len(lead)
    y = jnp.transpose(y, list(range(k)) + [k, k + 2, k + 4, k + 1, k + 3])
    return y.reshape(*lead, c * r * r, h // r, w // r)


@lowers("aten::_weight_norm_interface_backward")
def _weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms, dim):
    """Gradients of w = g * v / ||v|| (norm over every dim but `dim`; over all of them for dim -1), as
    PyTorch's CPU kernel: grad_g = <grad_w, v> / ||v||, grad_v = g / ||v|| * (grad_w - v * grad_g / ||v||)."""
    gw, v, g, norms = (_upcast(x) for x in (grad_w, saved_v, saved_g, saved_norms))
    axes = tuple(i for i in range(v.ndim) if i != dim) if 0 <= dim < v.ndim else tuple(range(v.ndim))
    norms = norms.reshape(tuple(1 if i in axes else v.shape[i] for i in range(v.ndim)))
    grad_g = jnp.sum(gw * v, axis=axes, keepdims=True) / norms
    grad_v = (g.reshape(norms.shape) / norms) * (gw - v * (grad_g / norms))
    return grad_v.astype(saved_v.dtype), grad_g.reshape(saved_g.shape).astype(saved_g.dtype)
