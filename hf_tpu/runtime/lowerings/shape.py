"""Shape ops: cat/stack, padding, flip/roll/repeat, tril/triu, diagonals, the *_scatter ops and the
*_copy variants of view ops that functionalized and compiled graphs contain.

Eager view ops (view, permute, slice, ...) are metadata kernels that alias storage (see views.py); their
`*_copy` forms here compute a fresh array in one jitted call (traced graphs use graph_views.py for the
view ops themselves).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from hf_tpu.runtime.buffers.dtypes import to_jax_dtype, to_torch_dtype
from hf_tpu.runtime.lowerings.table import lowers


def _norm_dim(dim: int, ndim: int) -> int:
    return dim % ndim if ndim else 0


def _promote(arrays):
    """Cast arrays to PyTorch's promoted dtype (JAX's promotion differs, e.g. int64 + float32)."""
    dtype = to_torch_dtype(arrays[0].dtype)
    for a in arrays[1:]:
        dtype = torch.promote_types(dtype, to_torch_dtype(a.dtype))
    jdt = to_jax_dtype(dtype)
    return [a.astype(jdt) for a in arrays]


# -- cat / stack ------------------------------------------------------------------------------------
@lowers("aten::cat")
def cat(tensors, dim=0):
    tensors = _promote(tensors)
    # legacy: 1-D empty tensors are skipped whatever the rank of the others
    kept = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)] or tensors[:1]
    return jnp.concatenate(kept, axis=_norm_dim(dim, kept[0].ndim))


@lowers("aten::stack")
def stack(tensors, dim=0):
    tensors = _promote(tensors)
    return jnp.stack(tensors, axis=_norm_dim(dim, tensors[0].ndim + 1))


# -- padding ----------------------------------------------------------------------------------------
def _pad_widths(ndim: int, pad) -> list[tuple[int, int]]:
    """ATen pads list (last dim first: left, right, top, bottom, ...) -> per-dim (low, high)."""
    widths = [(0, 0)] * ndim
    for i in range(len(pad) // 2):
        widths[ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    return widths


@lowers("aten::constant_pad_nd")
def constant_pad_nd(x, pad, value=0):
    """lax.pad takes negative widths too, which crop as in PyTorch."""
    config = [(lo, hi, 0) for lo, hi in _pad_widths(x.ndim, pad)]
    return jax.lax.pad(x, jnp.asarray(value, x.dtype), config)


def _pad_mode(mode: str):
    def forward(x, padding):
        """Reflect/replicate about the input's own edges, then crop where a width is negative."""
        widths = _pad_widths(x.ndim, padding)
        out = jnp.pad(x, [(max(lo, 0), max(hi, 0)) for lo, hi in widths], mode=mode)
        crop = tuple(slice(max(-lo, 0), n - max(-hi, 0)) for (lo, hi), n in zip(widths, out.shape))
        return out[crop]

    def backward(grad, x, padding):
        _, pull = jax.vjp(lambda a: forward(a, padding), x)
        return pull(grad.astype(x.dtype))[0]

    return forward, backward


reflection_pad, reflection_pad_backward = _pad_mode("reflect")
replication_pad, replication_pad_backward = _pad_mode("edge")
lowers("aten::reflection_pad1d", "aten::reflection_pad2d", "aten::reflection_pad3d")(reflection_pad)
lowers("aten::replication_pad1d", "aten::replication_pad2d", "aten::replication_pad3d")(replication_pad)
lowers(
    "aten::reflection_pad1d_backward", "aten::reflection_pad2d_backward", "aten::reflection_pad3d_backward"
)(reflection_pad_backward)
lowers(
    "aten::replication_pad1d_backward",
    "aten::replication_pad2d_backward",
    "aten::replication_pad3d_backward",
)(replication_pad_backward)


# -- flip / roll / repeat / tril / triu -------------------------------------------------------------
@lowers("aten::flip")
def flip(x, dims):
    if x.ndim == 0:
        return x
    return jnp.flip(x, axis=tuple(_norm_dim(d, x.ndim) for d in dims))


@lowers("aten::roll")
def roll(x, shifts, dims=()):
    if not dims:
        return jnp.roll(x.reshape(-1), shifts[0]).reshape(x.shape)
    return jnp.roll(x, tuple(shifts), axis=tuple(dims))


@lowers("aten::repeat")
def repeat(x, repeats):
    return jnp.tile(x, tuple(repeats))


@lowers("aten::tril")
def tril(x, diagonal=0):
    return jnp.tril(x, k=diagonal)


@lowers("aten::triu")
def triu(x, diagonal=0):
    return jnp.triu(x, k=diagonal)


# -- diagonals --------------------------------------------------------------------------------------
def _diag_coords(length: int, offset: int):
    i = jnp.arange(length)
    return i + max(-offset, 0), i + max(offset, 0)


@lowers("aten::diagonal_copy")
def diagonal_copy(x, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(x, offset, _norm_dim(dim1, x.ndim), _norm_dim(dim2, x.ndim))


@lowers("aten::diag_embed")
def diag_embed(x, offset=0, dim1=-2, dim2=-1):
    n = x.shape[-1] + abs(offset)
    rows, cols = _diag_coords(x.shape[-1], offset)
    out = jnp.zeros(x.shape[:-1] + (n, n), x.dtype).at[..., rows, cols].set(x)
    ndim = x.ndim + 1
    return jnp.moveaxis(out, (-2, -1), (_norm_dim(dim1, ndim), _norm_dim(dim2, ndim)))


@lowers("aten::diagonal_scatter")
def diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    dims = (_norm_dim(dim1, x.ndim), _norm_dim(dim2, x.ndim))
    moved = jnp.moveaxis(x, dims, (-2, -1))
    rows, cols = _diag_coords(src.shape[-1], offset)
    moved = moved.at[..., rows, cols].set(src.astype(x.dtype))
    return jnp.moveaxis(moved, (-2, -1), dims)


# -- slices -----------------------------------------------------------------------------------------
def _slice_bounds(size: int, start, end) -> tuple[int, int]:
    """PyTorch's slice normalization: None -> ends, negatives wrap once, then clamp into [0, size]."""
    start = 0 if start is None else start
    end = size if end is None else end
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    return start, end


def _slice_index(x, dim, start, end, step) -> tuple:
    dim = _norm_dim(dim, x.ndim)
    start, end = _slice_bounds(x.shape[dim], start, end)
    return (slice(None),) * dim + (slice(start, end, step),)


@lowers("aten::slice_copy.Tensor")
def slice_copy(x, dim=0, start=None, end=None, step=1):
    return x[_slice_index(x, dim, start, end, step)]


@lowers("aten::slice_scatter")
def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    return x.at[_slice_index(x, dim, start, end, step)].set(src.astype(x.dtype))


def _select_index(x, dim, index) -> tuple:
    dim = _norm_dim(dim, x.ndim)
    index = index + x.shape[dim] if index < 0 else index
    return (slice(None),) * dim + (index,)


@lowers("aten::select_copy.int")
def select_copy(x, dim, index):
    return x[_select_index(x, dim, index)]


@lowers("aten::select_scatter")
def select_scatter(x, src, dim, index):
    return x.at[_select_index(x, dim, index)].set(src.astype(x.dtype))


@lowers("aten::narrow_copy")
def narrow_copy(x, dim, start, length):
    dim = _norm_dim(dim, x.ndim)
    start = start + x.shape[dim] if start < 0 else start
    return jax.lax.slice_in_dim(x, start, start + length, axis=dim)


def _strided_positions(size, stride, offset):
    """Flat storage positions of an as_strided view over a contiguous buffer."""
    pos = jnp.full(tuple(size), offset or 0, dtype=jnp.int64)
    for d, (n, st) in enumerate(zip(size, stride)):
        pos = pos + (jnp.arange(n, dtype=jnp.int64) * st).reshape(
            (1,) * d + (n,) + (1,) * (len(size) - d - 1)
        )
    return pos


@lowers("aten::as_strided_copy")
def as_strided_copy(x, size, stride, storage_offset=None):
    return x.reshape(-1)[_strided_positions(size, stride, storage_offset)]


@lowers("aten::as_strided_scatter")
def as_strided_scatter(x, src, size, stride, storage_offset=None):
    flat = x.reshape(-1).at[_strided_positions(size, stride, storage_offset)].set(src.astype(x.dtype))
    return flat.reshape(x.shape)


# -- split / unbind ---------------------------------------------------------------------------------
@lowers("aten::split_with_sizes_copy")
def split_with_sizes_copy(x, split_sizes, dim=0):
    dim = _norm_dim(dim, x.ndim)
    out, start = [], 0
    for n in split_sizes:
        out.append(jax.lax.slice_in_dim(x, start, start + n, axis=dim))
        start += n
    return out


@lowers("aten::split_copy.Tensor")
def split_copy(x, split_size, dim=0):
    dim = _norm_dim(dim, x.ndim)
    size = x.shape[dim]
    if split_size == 0:
        return [x]
    sizes = [min(split_size, size - s) for s in range(0, size, split_size)] or [0]
    return split_with_sizes_copy(x, sizes, dim)


@lowers("aten::unbind_copy.int")
def unbind_copy(x, dim=0):
    dim = _norm_dim(dim, x.ndim)
    return [jax.lax.index_in_dim(x, i, axis=dim, keepdims=False) for i in range(x.shape[dim])]


# -- the *_copy forms of view ops -------------------------------------------------------------------
@lowers("aten::view_copy", "aten::_reshape_copy")
def view_copy(x, size):
    return x.reshape(tuple(size))


@lowers("aten::view_copy.dtype")
def view_copy_dtype(x, dtype):
    """Reinterpret the bytes as another dtype (last dim scales by the itemsize ratio)."""
    target = to_jax_dtype(dtype)
    src_size, dst_size = x.dtype.itemsize, target.itemsize
    if x.dtype == jnp.bool_ or target == jnp.bool_:
        raise NotImplementedError("view(dtype) to or from bool")
    if src_size == dst_size:
        return jax.lax.bitcast_convert_type(x, target)
    if src_size > dst_size:
        y = jax.lax.bitcast_convert_type(x, target)  # adds a trailing dim of src/dst
        return y.reshape(x.shape[:-1] + (x.shape[-1] * (src_size // dst_size),))
    ratio = dst_size // src_size
    y = x.reshape(x.shape[:-1] + (x.shape[-1] // ratio, ratio))
    return jax.lax.bitcast_convert_type(y, target)


@lowers("aten::unsqueeze_copy")
def unsqueeze_copy(x, dim):
    return jnp.expand_dims(x, _norm_dim(dim, x.ndim + 1))


@lowers("aten::squeeze_copy", "aten::squeeze_copy.dim", "aten::squeeze_copy.dims")
def squeeze_copy(x, dim=None):
    if dim is None:
        return jnp.squeeze(x)
    dims = [dim] if isinstance(dim, int) else list(dim)
    axes = tuple(
        sorted({_norm_dim(d, x.ndim) for d in dims if x.ndim and x.shape[_norm_dim(d, x.ndim)] == 1})
    )
    return jnp.squeeze(x, axis=axes) if axes else x


@lowers("aten::t_copy")
def t_copy(x):
    return x.T if x.ndim == 2 else x


@lowers("aten::transpose_copy.int")
def transpose_copy(x, dim0, dim1):
    if x.ndim < 2:
        return x
    return jnp.swapaxes(x, _norm_dim(dim0, x.ndim), _norm_dim(dim1, x.ndim))


@lowers("aten::permute_copy")
def permute_copy(x, dims):
    return jnp.transpose(x, tuple(_norm_dim(d, x.ndim) for d in dims))


@lowers("aten::expand_copy")
def expand_copy(x, size, implicit=False):
    lead = len(size) - x.ndim
    shape = tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(size))
    return jnp.broadcast_to(x, shape)


@lowers("aten::alias_copy", "aten::detach_copy", "aten::lift_fresh_copy")
def alias_copy(x):
    return x


@lowers("aten::unfold_copy")
def unfold_copy(x, dimension, size, step):
    """Sliding windows along `dimension`, window elements on a new last dim."""
    if x.ndim == 0:
        return x.reshape(1)
    dim = _norm_dim(dimension, x.ndim)
    count = (x.shape[dim] - size) // step + 1
    windows = jnp.arange(count)[:, None] * step + jnp.arange(size)[None, :]
    return jnp.moveaxis(jnp.take(x, windows, axis=dim), dim + 1, -1)


@lowers("aten::unfold_backward")
def unfold_backward(grad, input_sizes, dim, size, step):
    """The adjoint of unfold: overlapping windows sum back (a scatter-add of the windows).

    Not `jax.vjp` of the gather: JAX does not differentiate integer arrays, so an int64 `unfold_backward`
    (what functionalization writes for an in-place op through an unfold view, in compiled graphs) came
    back all zeros (found by tests/fuzz)."""
    input_sizes = tuple(input_sizes)
    if not input_sizes:
        return grad.reshape(())
    dim = _norm_dim(dim, len(input_sizes))
    count = (input_sizes[dim] - size) // step + 1
    windows = jnp.arange(count)[:, None] * step + jnp.arange(size)[None, :]
    index = (slice(None),) * dim + (windows,)
    # grad: input_sizes with `dim` -> count, plus the window dim last; move it next to `count`
    values = jnp.moveaxis(grad, -1, dim + 1)
    zeros = jnp.zeros(input_sizes, grad.dtype)
    if grad.dtype == jnp.bool_:
        return zeros.at[index].max(values)  # a sum of bools that stays bool: any window's True
    return zeros.at[index].add(values)


# -- clone: share the (immutable) buffer instead of copying it --------------------------------------
@lowers("aten::clone", kind="host")
def clone(x: torch.Tensor, *, memory_format=None) -> torch.Tensor:
    from hf_tpu.runtime.tensors.tensor import new_tensor, to_jax_lazy

    if memory_format == torch.contiguous_format or (
        memory_format in (None, torch.preserve_format) and x.is_contiguous()
    ):
        return new_tensor(x.shape, x.dtype, to_jax_lazy(x))  # lazy: no sync under DeferAndFuse
    out = torch.empty_like(x, memory_format=memory_format or torch.preserve_format)
    out.copy_(x)
    return out
