"""Pointwise arithmetic: binary ops with PyTorch's alpha/rounding conventions, unary math."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hf_tpu.runtime.lowering_table import lowers


@lowers("aten::add.Tensor", "aten::add.Scalar")
def add(x, other, alpha=1):
    return x + other * alpha if not (isinstance(alpha, int) and alpha == 1) else x + other


@lowers("aten::sub.Tensor", "aten::sub.Scalar")
def sub(x, other, alpha=1):
    return x - other * alpha if not (isinstance(alpha, int) and alpha == 1) else x - other


@lowers("aten::mul.Tensor", "aten::mul.Scalar")
def mul(x, other):
    return x * other


@lowers("aten::neg")
def neg(x):
    return -x


@lowers("aten::exp")
def exp(x):
    return jnp.exp(x)


__all__ = ["add", "sub", "mul", "neg", "exp", "jax"]
