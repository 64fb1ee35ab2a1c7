"""Losses: pointwise (MSE, L1, Huber, smooth L1, soft margin), binary cross-entropy, negative
log-likelihood (1-D and 2-D), margin losses. Reductions and bf16/fp16 handling follow `nn.py`'s
conventions (statistics in float32, the result cast back); backward ops are the VJPs of the forwards
here unless PyTorch's closed form is simpler.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from hf_tpu.runtime.lowerings.nn import _compute_dtype, _pullback, _upcast
from hf_tpu.runtime.lowerings.table import lowers

_NONE, _MEAN, _SUM = 0, 1, 2


def _reduce(loss, reduction):
    if reduction == _MEAN:
        return jnp.mean(loss)
    if reduction == _SUM:
        return jnp.sum(loss)
    return loss


def _pointwise_loss(fn):
    """Register nothing; build (forward, backward) for a loss elementwise in (input, target)."""

    def forward(x, target, reduction, *extra):
        return _reduce(fn(_upcast(x), _upcast(target), *extra), reduction)

    def backward(grad_output, x, target, reduction, *extra):
        return _pullback(lambda v: forward(v, target, reduction, *extra), _upcast(x), grad_output)

    return forward, backward


def _huber(x, t, delta):
    d = jnp.abs(x - t)
    return jnp.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta))


def _smooth_l1(x, t, beta):
    d = jnp.abs(x - t)
    if beta == 0:
        return d
    return jnp.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta)


_mse_fwd, _mse_bwd = _pointwise_loss(lambda x, t: jnp.square(x - t))
_huber_fwd, _huber_bwd = _pointwise_loss(_huber)
_smooth_fwd, _smooth_bwd = _pointwise_loss(_smooth_l1)
lowers("aten::mse_loss")(_mse_fwd)
lowers("aten::mse_loss_backward")(_mse_bwd)
lowers("aten::huber_loss")(_huber_fwd)
lowers("aten::huber_loss_backward")(_huber_bwd)
lowers("aten::smooth_l1_loss")(_smooth_fwd)
lowers("aten::smooth_l1_loss_backward")(_smooth_bwd)


@lowers("aten::binary_cross_entropy")
def binary_cross_entropy(x, target, weight=None, reduction=_MEAN):
    """-w (t log x + (1 - t) log(1 - x)) with each log clamped at -100, as PyTorch."""
    x, t = _upcast(x), _upcast(target)
    loss = -(t * jnp.maximum(jnp.log(x), -100) + (1 - t) * jnp.maximum(jnp.log1p(-x), -100))
    if weight is not None:
        loss = loss * _upcast(weight)
    return _reduce(loss, reduction)


@lowers("aten::binary_cross_entropy_backward")
def binary_cross_entropy_backward(grad_output, x, target, weight=None, reduction=_MEAN):
    """PyTorch's formula: w (x - t) / max(x (1 - x), 1e-12)."""
    x, t = _upcast(x), _upcast(target)
    grad = (x - t) / jnp.maximum(x * (1 - x), 1e-12) * _upcast(grad_output)
    if weight is not None:
        grad = grad * _upcast(weight)
    if reduction == _MEAN:
        grad = grad / x.size
    return grad


@lowers("aten::binary_cross_entropy_with_logits")
def binary_cross_entropy_with_logits(x, target, weight=None, pos_weight=None, reduction=_MEAN):
    x, t = _upcast(x), _upcast(target)
    log_sigmoid_neg = jnp.log1p(jnp.exp(-jnp.abs(x))) + jnp.maximum(-x, 0)  # -log(sigmoid(x))
    if pos_weight is not None:
        loss = (1 - t) * x + (1 + (_upcast(pos_weight) - 1) * t) * log_sigmoid_neg
    else:
        loss = (1 - t) * x + log_sigmoid_neg
    if weight is not None:
        loss = loss * _upcast(weight)
    return _reduce(loss, reduction)


def _nll_parts(x, target, weight, ignore_index):
    """Class dim last: x (M, C), target (M,) -> per-sample weights and picked log-probabilities."""
    valid = target != ignore_index
    safe = jnp.where(valid, target, 0).astype(jnp.int32)
    w = jnp.ones(x.shape[-1], _compute_dtype(x.dtype)) if weight is None else _upcast(weight)
    w_t = jnp.where(valid, w[safe], 0)
    picked = jnp.take_along_axis(_upcast(x), safe[:, None], axis=-1)[:, 0]
    return w_t, picked, safe


def _nll(x, target, weight, reduction, ignore_index):
    """x (M, C) log-probabilities, target (M,): (output, total_weight)."""
    w_t, picked, _ = _nll_parts(x, target, weight, ignore_index)
    losses = -picked * w_t
    total = jnp.sum(w_t)
    if reduction == _NONE:
        return losses, jnp.zeros((), w_t.dtype)
    if reduction == _SUM:
        return jnp.sum(losses), total
    return jnp.sum(losses) / total, total


def _nll_grad(grad_output, x, target, weight, reduction, ignore_index, total_weight):
    w_t, _, safe = _nll_parts(x, target, weight, ignore_index)
    g = _upcast(grad_output)
    if reduction == _MEAN:
        g = g / _upcast(total_weight)
    scale = -w_t * g  # g is a scalar unless reduction == none
    rows = jnp.arange(x.shape[0])
    return jnp.zeros(x.shape, scale.dtype).at[rows, safe].add(scale)


def _class_last(x):
    """(N, C, *spatial) -> (N*prod(spatial), C), and back."""
    return jnp.moveaxis(x, 1, -1).reshape(-1, x.shape[1])


@lowers("aten::nll_loss_forward")
def nll_loss_forward(x, target, weight, reduction, ignore_index):
    if x.ndim == 1:
        out, total = _nll(x[None], target.reshape(1), weight, reduction, ignore_index)
        return (out[0] if reduction == _NONE else out), total
    return _nll(x, target, weight, reduction, ignore_index)


@lowers("aten::nll_loss_backward")
def nll_loss_backward(grad_output, x, target, weight, reduction, ignore_index, total_weight):
    if x.ndim == 1:
        g = grad_output.reshape(1) if reduction == _NONE else grad_output
        return _nll_grad(g, x[None], target.reshape(1), weight, reduction, ignore_index, total_weight)[0]
    return _nll_grad(grad_output, x, target, weight, reduction, ignore_index, total_weight)


@lowers("aten::nll_loss2d_forward")
def nll_loss2d_forward(x, target, weight, reduction, ignore_index):
    out, total = _nll(_class_last(x), target.reshape(-1), weight, reduction, ignore_index)
    return (out.reshape(target.shape) if reduction == _NONE else out), total


@lowers("aten::nll_loss2d_backward")
def nll_loss2d_backward(grad_output, x, target, weight, reduction, ignore_index, total_weight):
    g = grad_output.reshape(-1) if reduction == _NONE else grad_output
    flat = _nll_grad(g, _class_last(x), target.reshape(-1), weight, reduction, ignore_index, total_weight)
    spatial = x.shape[2:]
    return jnp.moveaxis(flat.reshape((x.shape[0],) + spatial + (x.shape[1],)), -1, 1)


def _multi_margin(x, target, p, margin, weight, reduction):
    """sum over j != y of w[y] max(0, margin - x[y] + x[j])^p / C per row (a 1-D input is one row); the
    hinge's gradient is 0 where it is exactly 0, as PyTorch's kernels."""
    rows = _upcast(x).reshape(-1, x.shape[-1])
    t = target.reshape(-1).astype(jnp.int32)
    z = margin - jnp.take_along_axis(rows, t[:, None], axis=1) + rows
    z = jnp.where(z > 0, z, 0)
    if p == 2:
        z = z * z
    if weight is not None:
        z = z * _upcast(weight)[t][:, None]
    z = jnp.where(jnp.arange(rows.shape[1])[None, :] == t[:, None], 0, z)
    return _reduce(jnp.sum(z, axis=1) / rows.shape[1], reduction)


@lowers("aten::multi_margin_loss_backward", static_scalars=True)
def multi_margin_loss_backward(grad_output, x, target, p, margin, weight=None, reduction=_MEAN):
    fn = functools.partial(
        _multi_margin, target=target, p=p, margin=margin, weight=weight, reduction=reduction
    )
    out = jax.eval_shape(fn, _upcast(x))
    return _pullback(fn, _upcast(x), grad_output.reshape(out.shape)).astype(x.dtype)


def _multilabel_targets(target, c):
    """(rows of target indices, mask of the ones before each row's first -1)."""
    t = target.reshape(-1, c)
    return t, jnp.cumprod(t >= 0, axis=1).astype(bool)


def _multilabel_margin(x, target, is_target, reduction):
    """Row i: sum over its targets y (those before the first -1) and the non-targets k of
    max(0, 1 - (x[y] - x[k])) / C; a 1-D (or 0-d) input is one row."""
    c = x.shape[-1] if x.ndim else 1
    rows = _upcast(x).reshape(-1, c)
    t, valid = _multilabel_targets(target, c)
    picked = jnp.take_along_axis(rows, jnp.where(valid, t, 0).astype(jnp.int32), axis=1)
    z = 1 - picked[:, :, None] + rows[:, None, :]
    keep = valid[:, :, None] & (is_target.reshape(-1, c) == 0)[:, None, :] & (z > 0)
    loss = jnp.sum(jnp.where(keep, z, 0), axis=(1, 2)) / c
    return _reduce(loss.reshape(()) if x.ndim <= 1 else loss, reduction)


@lowers("aten::multilabel_margin_loss_forward")
def multilabel_margin_loss_forward(x, target, reduction):
    """Lowered directly: torch._decomp's version also counts the slots after a row's first -1 (as target
    0), so it disagreed with PyTorch's CPU kernel whenever a row had fewer targets than classes."""
    c = x.shape[-1] if x.ndim else 1
    t, valid = _multilabel_targets(target, c)
    hits = (t[:, :, None] == jnp.arange(c)[None, None, :]) & valid[:, :, None]
    is_target = jnp.any(hits, axis=1).reshape(target.shape).astype(x.dtype)
    return _multilabel_margin(x, target, is_target, reduction), is_target


@lowers("aten::multilabel_margin_loss_backward")
def multilabel_margin_loss_backward(grad_output, x, target, reduction, is_target):
    fn = functools.partial(_multilabel_margin, target=target, is_target=is_target, reduction=reduction)
    out = jax.eval_shape(fn, _upcast(x))
    return _pullback(fn, _upcast(x), grad_output.reshape(out.shape)).astype(x.dtype)
