"""View, alias and copy ops as pure JAX, for traced graphs (compiled and fused paths).

Eager runs these through PyTorch's metadata kernels (views alias storage) and the host copy path;
inside one jitted graph values are immutable, so a view is just its value.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from hf_tpu.runtime.buffers.dtypes import convert, to_jax_dtype
from hf_tpu.runtime.lowerings.shape import unfold_copy
from hf_tpu.runtime.lowerings.table import lowers


def _shape(x, size):
    size = list(size)
    if -1 in size:
        known = math.prod(s for s in size if s != -1)
        size[size.index(-1)] = x.size // known if known else 0
    return tuple(size)


@lowers(
    "aten::view",
    "aten::_unsafe_view",
    "aten::reshape",
    "aten::view_copy",
    "aten::_reshape_alias_copy",
    graph=True,
)
def view(x, size, *rest):
    return jnp.reshape(x, _shape(x, size))


@lowers("aten::sym_size.int", graph=True)
def sym_size(x, dim):
    """A size Dynamo left symbolic, read off a value the graph computes: concrete under jit (XLA
    compiles per shape), so the views and factories that use it get a plain int."""
    return x.shape[dim]


@lowers("aten::sym_numel", graph=True)
def sym_numel(x):
    return x.size


@lowers("aten::_reshape_alias", graph=True)
def reshape_alias(x, size, stride):
    return jnp.reshape(x, tuple(size))


@lowers(
    "aten::alias",
    "aten::detach",
    "aten::lift_fresh",
    "aten::alias_copy",
    "aten::detach_copy",
    "aten::lift_fresh_copy",
    "aten::clone",
    "aten::contiguous",
    "aten::resolve_conj",
    "aten::resolve_neg",
    graph=True,
)
def alias(x, *rest, **kw):
    return x


@lowers("aten::_conj", graph=True)
def conj_view(x):
    """A conjugate view's values are the conjugates (eager marks it with a bit that readers resolve);
    an output that is this view of another value is replayed as the view itself (`graph_outputs`)."""
    return jnp.conj(x) if jnp.iscomplexobj(x) else x


@lowers("aten::diagonal", "aten::diagonal_copy", graph=True)
def diagonal(x, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(x, offset, dim1 % x.ndim, dim2 % x.ndim)  # the diagonal becomes the last dim


@lowers("aten::view_as_complex", graph=True)
def view_as_complex(x):
    return jax.lax.complex(x[..., 0], x[..., 1])


@lowers("aten::view_as_real", graph=True)
def view_as_real(x):
    return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)


@lowers("aten::t", "aten::t_copy", graph=True)
def t(x):
    return x.T if x.ndim == 2 else x


@lowers("aten::transpose.int", "aten::transpose_copy.int", graph=True)
def transpose(x, dim0, dim1):
    return jnp.swapaxes(x, dim0, dim1) if x.ndim else x


@lowers("aten::permute", "aten::permute_copy", graph=True)
def permute(x, dims):
    return jnp.transpose(x, [d % max(x.ndim, 1) for d in dims]) if x.ndim else x


@lowers("aten::expand", "aten::expand_copy", graph=True)
def expand(x, size, implicit=False):
    size = list(size)
    lead = len(size) - x.ndim
    shape = [x.shape[i - lead] if s == -1 else s for i, s in enumerate(size)]
    return jnp.broadcast_to(x, tuple(shape))


@lowers("aten::select.int", "aten::select_copy.int", graph=True)
def select(x, dim, index):
    return jnp.take(x, index, axis=dim)


@lowers("aten::slice.Tensor", "aten::slice_copy.Tensor", graph=True)
def slice_(x, dim=0, start=None, end=None, step=1):
    n = x.shape[dim]
    start, end, step = slice(start, end, step).indices(n)
    index = [slice(None)] * x.ndim
    index[dim] = slice(start, end, step)
    return x[tuple(index)]


@lowers("aten::unsqueeze", "aten::unsqueeze_copy", graph=True)
def unsqueeze(x, dim):
    return jnp.expand_dims(x, dim % (x.ndim + 1))


@lowers(
    "aten::squeeze",
    "aten::squeeze.dim",
    "aten::squeeze.dims",
    "aten::squeeze_copy",
    "aten::squeeze_copy.dim",
    "aten::squeeze_copy.dims",
    graph=True,
)
def squeeze(x, dim=None):
    if x.ndim == 0:
        return x
    dims = range(x.ndim) if dim is None else ([dim] if isinstance(dim, int) else dim)
    dims = tuple(d % x.ndim for d in dims if x.shape[d % x.ndim] == 1)
    return jnp.squeeze(x, dims) if dims else x


@lowers("aten::as_strided", "aten::as_strided_copy", graph=True)
def as_strided(x, size, stride, storage_offset=None):
    """Graph inputs are contiguous values, so a strided view gathers from the flattened input."""
    flat = x.reshape(-1)
    idx = jnp.asarray(storage_offset or 0)
    for dim, (n, st) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[dim] = n
        idx = idx + (jnp.arange(n) * st).reshape(shape)
    return flat[jnp.broadcast_to(idx, tuple(size))]


@lowers("aten::unfold", graph=True)
def unfold(x, dimension, size, step):
    return unfold_copy(x, dimension, size, step)  # a graph's views are values: the copy's lowering


@lowers("aten::_to_copy", graph=True)
def to_copy(x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    return x if dtype is None else convert(x, to_jax_dtype(dtype))


@lowers("prims::convert_element_type", graph=True)
def convert_element_type(x, dtype):
    """A cast that decompositions of graphs Dynamo made dynamic leave in (a float size factor)."""
    return convert(jnp.asarray(x), to_jax_dtype(dtype))


@lowers("aten::copy", graph=True)
def copy(x, src, non_blocking=False):
    return jnp.broadcast_to(convert(src, x.dtype), x.shape)


@lowers("aten::view.dtype", graph=True)
def view_dtype(x, dtype):
    import jax

    target = to_jax_dtype(dtype)
    if target.itemsize == x.dtype.itemsize:
        return jax.lax.bitcast_convert_type(x, target)
    raise NotImplementedError("view(dtype) with a different item size inside a compiled graph")


# -- factories and splits inside graphs (eager runs them through the host allocation path) -----------
def _dtype(dtype, default=None):
    import torch

    return to_jax_dtype(dtype if dtype is not None else (default or torch.get_default_dtype()))


@lowers("aten::full", graph=True)
def full(size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    if dtype is None:
        import torch

        dtype = (
            torch.bool
            if isinstance(fill_value, bool)
            else (torch.int64 if isinstance(fill_value, int) else None)
        )
    return jnp.full(tuple(size), fill_value, dtype=_dtype(dtype))


@lowers("aten::scalar_tensor", graph=True)
def scalar_tensor(s, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(s, dtype=_dtype(dtype))


@lowers("aten::zeros", "aten::empty.memory_format", graph=True)
def zeros(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros(tuple(size), dtype=_dtype(dtype))


@lowers("aten::empty_strided", graph=True)
def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), dtype=_dtype(dtype))


@lowers("aten::empty_permuted", graph=True)
def empty_permuted(size, physical_layout, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), dtype=_dtype(dtype))  # a graph's values carry no memory layout


@lowers("aten::ones", graph=True)
def ones(size, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.ones(tuple(size), dtype=_dtype(dtype))


def _like_dtype(x, dtype):
    return x.dtype if dtype is None else to_jax_dtype(dtype)


@lowers("aten::zeros_like", "aten::empty_like", graph=True)
def zeros_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros(x.shape, dtype=_like_dtype(x, dtype))


@lowers("aten::ones_like", graph=True)
def ones_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.ones(x.shape, dtype=_like_dtype(x, dtype))


@lowers("aten::full_like", graph=True)
def full_like(x, fill_value, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.full(x.shape, fill_value, dtype=_like_dtype(x, dtype))


@lowers("aten::new_zeros", "aten::new_empty", graph=True)
def new_zeros(x, size, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), dtype=_like_dtype(x, dtype))


@lowers("aten::new_empty_strided", graph=True)
def new_empty_strided(x, size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), dtype=_like_dtype(x, dtype))


@lowers("aten::new_ones", graph=True)
def new_ones(x, size, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.ones(tuple(size), dtype=_like_dtype(x, dtype))


@lowers("aten::new_full", graph=True)
def new_full(x, size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.full(tuple(size), fill_value, dtype=_like_dtype(x, dtype))


@lowers("aten::split_with_sizes", "aten::split_with_sizes_copy", graph=True)
def split_with_sizes(x, split_sizes, dim=0):
    dim %= x.ndim
    out, start = [], 0
    for size in split_sizes:
        out.append(slice_(x, dim, start, start + size))
        start += size
    return out


@lowers("aten::split.Tensor", "aten::split_copy.Tensor", graph=True)
def split(x, split_size, dim=0):
    n = x.shape[dim % x.ndim]
    sizes = [min(split_size, n - s) for s in range(0, n, split_size)] or [0]
    return split_with_sizes(x, sizes, dim)


@lowers("aten::unbind.int", "aten::unbind_copy.int", graph=True)
def unbind(x, dim=0):
    return [select(x, dim, i) for i in range(x.shape[dim])]


@lowers("aten::index.Tensor", graph=True)
def index(x, indices):
    """Integer advanced indexing (bool masks have data-dependent shapes and never reach a graph)."""
    from hf_tpu.runtime.lowerings.table import TABLE, resolve

    return TABLE[resolve("aten::_unsafe_index.Tensor")].fn(x, indices)
