"""Filling and creating values: fill_, zero_, arange."""

from __future__ import annotations

import jax.numpy as jnp

from hf_tpu.runtime.lowering_table import lowers


@lowers("aten::fill.Scalar")
def fill(x, value):
    return jnp.full(x.shape, value, dtype=x.dtype)


@lowers("aten::fill.Tensor")
def fill_tensor(x, value):
    return jnp.broadcast_to(value.astype(x.dtype), x.shape)


@lowers("aten::zero")
def zero(x):
    return jnp.zeros(x.shape, dtype=x.dtype)
