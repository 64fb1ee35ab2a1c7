"""Fused LSTM/GRU cells: PyTorch runs `nn.LSTM`, `nn.GRU`, `nn.LSTMCell` and `nn.GRUCell` through them on
CUDA, XPU and PrivateUse1 devices. Gate order and the saved workspace follow PyTorch's CUDA kernels
(LSTM: input, forget, cell, output gates; GRU: reset, input (update), new gates), so the backward ops
receive what the forward saved. Half types compute in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hf_tpu.runtime.lowerings.table import lowers


def _f32(x):
    return None if x is None else x.astype(jnp.float32) if x.dtype in (jnp.bfloat16, jnp.float16) else x


def _gates(input_gates, hidden_gates, input_bias, hidden_bias):
    gates = _f32(input_gates) + _f32(hidden_gates)
    if input_bias is not None:
        gates = gates + _f32(input_bias) + _f32(hidden_bias)
    return gates


@lowers("aten::_thnn_fused_lstm_cell")
def thnn_fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    dtype = input_gates.dtype
    i, f, g, o = jnp.split(_gates(input_gates, hidden_gates, input_bias, hidden_bias), 4, axis=-1)
    i, f, g, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)
    cy = f * _f32(cx) + i * g
    hy = o * jnp.tanh(cy)
    workspace = jnp.concatenate([i, f, g, o], axis=-1)
    return hy.astype(dtype), cy.astype(dtype), workspace.astype(dtype)


@lowers("aten::_thnn_fused_lstm_cell_backward_impl")
def thnn_fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    dtype = workspace.dtype
    i, f, g, o = jnp.split(_f32(workspace), 4, axis=-1)
    cy, cx = _f32(cy), _f32(cx)
    grad_hy = jnp.zeros_like(cy) if grad_hy is None else _f32(grad_hy)
    grad_cy = jnp.zeros_like(cy) if grad_cy is None else _f32(grad_cy)
    tanh_cy = jnp.tanh(cy)
    grad_o = grad_hy * tanh_cy * o * (1 - o)
    grad_c = grad_hy * o * (1 - tanh_cy * tanh_cy) + grad_cy
    grad_i = grad_c * g * i * (1 - i)
    grad_f = grad_c * cx * f * (1 - f)
    grad_g = grad_c * i * (1 - g * g)
    grad_gates = jnp.concatenate([grad_i, grad_f, grad_g, grad_o], axis=-1)
    grad_cx = grad_c * f
    grad_bias = grad_gates.sum(axis=0) if has_bias else None
    return (
        grad_gates.astype(dtype),
        grad_cx.astype(dtype),
        None if grad_bias is None else grad_bias.astype(dtype),
    )


@lowers("aten::_thnn_fused_gru_cell")
def thnn_fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    dtype = input_gates.dtype
    ig, hg = _f32(input_gates), _f32(hidden_gates)
    if input_bias is not None:
        ig, hg = ig + _f32(input_bias), hg + _f32(hidden_bias)
    ir, ii, in_ = jnp.split(ig, 3, axis=-1)
    hr, hi, hn = jnp.split(hg, 3, axis=-1)
    r = jax.nn.sigmoid(ir + hr)
    z = jax.nn.sigmoid(ii + hi)
    n = jnp.tanh(in_ + r * hn)
    hx = _f32(hx)
    hy = n + z * (hx - n)
    workspace = jnp.concatenate([r, z, n, hx, hn], axis=-1)
    return hy.astype(dtype), workspace.astype(dtype)


@lowers("aten::_thnn_fused_gru_cell_backward")
def thnn_fused_gru_cell_backward(grad_hy, workspace, has_bias):
    dtype = workspace.dtype
    r, z, n, hx, hn = jnp.split(_f32(workspace), 5, axis=-1)
    grad_hy = _f32(grad_hy)
    grad_hx = grad_hy * z
    grad_n = grad_hy * (1 - z) * (1 - n * n)
    grad_z = grad_hy * (hx - n) * z * (1 - z)
    grad_r = grad_n * hn * r * (1 - r)
    grad_input_gates = jnp.concatenate([grad_r, grad_z, grad_n], axis=-1)
    grad_hidden_gates = jnp.concatenate([grad_r, grad_z, grad_n * r], axis=-1)
    outs = [grad_input_gates, grad_hidden_gates, grad_hx]
    if has_bias:
        outs += [grad_input_gates.sum(axis=0), grad_hidden_gates.sum(axis=0)]
    else:
        outs += [None, None]
    return tuple(None if x is None else x.astype(dtype) for x in outs)
