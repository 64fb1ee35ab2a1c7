"""Matrix products."""

from __future__ import annotations

import jax.numpy as jnp

from hf_tpu.runtime.lowering_table import lowers


@lowers("aten::mm")
def mm(x, y):
    return jnp.matmul(x, y)


@lowers("aten::sum.dim_IntList")
def sum_dim(x, dim=None, keepdim=False, dtype=None):
    axis = None if dim is None or len(dim) == 0 else tuple(dim)
    return jnp.sum(x, axis=axis, keepdims=keepdim)
