"""Indexing: advanced indexing and index_put, gather/scatter, index_* ops, masked ops, embedding(_bag), take.

PyTorch index semantics map onto NumPy-style JAX indexing: a `None` entry in an ATen index list means
"whole dimension" (not a new axis), negative indices wrap, and separated advanced indices move to the
front exactly as in NumPy. Writes use `.at[...]` scatters with `mode="drop"`, so the padded slots of a
statically sized `nonzero` (bool masks in `index_put`) fall off the end instead of being written.

Boolean masks in `index.Tensor` give a data-dependent shape; its kernel is a host kernel that turns the
masks into integer indices (one scalar sync, as on CUDA) and then runs the jitted gather. CPU index
tensors are accepted for tpu tensors, as CUDA accepts them.
"""

from __future__ import annotations

from functools import cache

import jax
import jax.numpy as jnp
import torch

from hf_tpu.runtime.lowerings.table import Lowering, eager_kernel, lowers
from hf_tpu.runtime.tensors.tensor import to_jax, wrap

_MASK_DTYPES = (jnp.bool_, jnp.uint8)
_LOW_PRECISION = (jnp.bfloat16, jnp.float16)


# -- small helpers ----------------------------------------------------------------------------------
def _is_mask(index) -> bool:
    return index is not None and index.dtype in _MASK_DTYPES


def _wrap_negative(index, size):
    """PyTorch accepts index -k for size - k in most index ops; JAX clamps, so normalize first."""
    return jnp.where(index < 0, index + size, index)


def _along(dim: int, index) -> tuple:
    """The index tuple selecting `index` along `dim` and everything along the other dims."""
    return (slice(None),) * dim + (index,)


def _at_least_1d(*arrays):
    """0-d tensors behave as 1-element vectors in the index_* / gather / scatter ops."""
    return tuple(a.reshape(1) if hasattr(a, "ndim") and a.ndim == 0 else a for a in arrays)


def _as_array(value, dtype):
    return value.astype(dtype) if hasattr(value, "astype") else jnp.asarray(value, dtype)


def _lowest(dtype):
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.array(-jnp.inf, dtype)
    if dtype == jnp.bool_:
        return jnp.array(False)
    return jnp.array(jnp.iinfo(dtype).min, dtype)


def _highest(dtype):
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.array(jnp.inf, dtype)
    if dtype == jnp.bool_:
        return jnp.array(True)
    return jnp.array(jnp.iinfo(dtype).max, dtype)


def _scatter_reduce(x, idx, src, reduce: str, include_self: bool = True):
    """x with `src` combined into x[idx] by `reduce` (sum/add, prod/multiply, mean, amax, amin).

    Sums accumulate in x's own dtype, as PyTorch's scatter kernels do (bf16 rounds at every add); bools
    combine as 0/1 integers (sum is a logical or, prod a logical and).
    """
    if x.dtype == jnp.bool_:
        as_int = _scatter_reduce(x.astype(jnp.int32), idx, src.astype(jnp.int32), reduce, include_self)
        return as_int != 0
    src = src.astype(x.dtype)
    if reduce in ("sum", "add"):
        base = x if include_self else x.at[idx].set(0)
        return base.at[idx].add(src)
    if reduce in ("prod", "multiply"):
        base = x if include_self else x.at[idx].set(1)
        return base.at[idx].multiply(src)
    if reduce == "amax":
        base = x if include_self else x.at[idx].set(_lowest(x.dtype))
        return base.at[idx].max(src)
    if reduce == "amin":
        base = x if include_self else x.at[idx].set(_highest(x.dtype))
        return base.at[idx].min(src)
    if reduce == "mean":
        base = x if include_self else x.at[idx].set(0)
        total = base.at[idx].add(src)
        count = jnp.zeros(x.shape, jnp.int32).at[idx].add(1) + (1 if include_self else 0)
        count = jnp.maximum(count, 1)
        if jnp.issubdtype(x.dtype, jnp.integer):
            return jnp.floor_divide(total, count.astype(x.dtype))
        return total / count.astype(total.dtype)
    raise ValueError(f"reduce argument must be sum, prod, mean, amax or amin, got {reduce!r}")


# -- index / index_put ------------------------------------------------------------------------------
def _index_tuple(indices) -> tuple:
    return tuple(slice(None) if i is None else i for i in indices)


@lowers("aten::index.Tensor", graph=True)
def _index(x, indices):
    """x[indices] for integer index arrays (bool masks were turned into integers by the host kernel)."""
    return x[_index_tuple(indices)]


@lowers("aten::_unsafe_index.Tensor")
def _unsafe_index(x, indices):
    return _index(x, indices)


def _advanced_layout(x, indices):
    """Where the advanced-index block lands in x[indices], with every mask expanded to its dims.

    Returns (slots, adv, adjacent, int_shape): the first x dim each entry consumes, the x dims taken by
    advanced indices, whether those are adjacent (then the block stays in place, else it moves to the
    front, as in NumPy), and the broadcast shape of the integer (non-mask) index arrays.
    """
    slots, adv = [], []
    dim = 0
    for i in indices:
        width = i.ndim if _is_mask(i) else 1
        slots.append(dim)
        if i is not None:
            adv.extend(range(dim, dim + width))
        dim += width
    ints = [i.shape for i in indices if i is not None and not _is_mask(i)]
    int_shape = jnp.broadcast_shapes(*ints) if ints else ()
    adjacent = not adv or adv == list(range(adv[0], adv[-1] + 1))
    return slots, adv, adjacent, tuple(int_shape)


def _mask_count_from_shapes(x, indices, values):
    """The number of selected elements when the shapes fix it statically (else None).

    A mask selects `nnz` elements; another index array or the values' matching dimension must then
    have size nnz (or 1, broadcasting). When neither says, `values` broadcasts over the selection.
    """
    _, adv, adjacent, int_shape = _advanced_layout(x, indices)
    if not adv:
        return None
    if int_shape and int_shape[-1] != 1:
        return int_shape[-1]
    block = max(len(int_shape), 1)
    result_rank = x.ndim - len(adv) + block
    pos = (adv[0] if adjacent else 0) + block - 1
    vdim = pos - (result_rank - values.ndim)
    if vdim >= 0 and values.shape[vdim] != 1:
        return values.shape[vdim]
    return None


def _put_indices(x, indices, values) -> tuple:
    """Index tuple for a scatter into x: each mask becomes its (statically sized) nonzero coordinates.

    Unused padded slots point one past the end of their dimension and are dropped by `mode="drop"`.
    """
    if not any(_is_mask(i) for i in indices):
        return _index_tuple(indices)
    count = _mask_count_from_shapes(x, indices, values)
    slots, *_ = _advanced_layout(x, indices)
    out = []
    for i, dim in zip(indices, slots):
        if i is None:
            out.append(slice(None))
        elif _is_mask(i):
            oob = tuple(x.shape[dim : dim + i.ndim])
            out.extend(jnp.nonzero(i, size=count if count is not None else i.size, fill_value=oob))
        else:
            out.append(i)
    return tuple(out)


def _single_mask_put(x, indices, values, accumulate: bool):
    """x[mask] = v (or +=) with v broadcast over the selection: a `where`, no scatter needed."""
    entries = [(n, i) for n, i in enumerate(indices) if i is not None]
    if len(entries) != 1 or not _is_mask(entries[0][1]):
        return None
    if _mask_count_from_shapes(x, indices, values) is not None:
        return None
    first, mask = entries[0]
    k = mask.ndim
    rest = x.ndim - first - k
    m = mask.astype(jnp.bool_).reshape((1,) * first + mask.shape + (1,) * rest)
    rank = x.ndim - k + 1  # rank of x[mask]
    v = values.reshape((1,) * (rank - values.ndim) + values.shape)
    v = v.reshape(v.shape[:first] + (1,) * k + v.shape[first + 1 :])
    if accumulate:
        v = (x | v) if x.dtype == jnp.bool_ else x + v
    return jnp.where(m, v, x)


@lowers("aten::index_put", "aten::_unsafe_index_put")
def index_put(x, indices, values, accumulate=False):
    values = _as_array(values, x.dtype)
    fast = _single_mask_put(x, indices, values, accumulate)
    if fast is not None:
        return fast
    idx = _put_indices(x, indices, values)
    if not accumulate:
        return x.at[idx].set(values, mode="drop")
    if x.dtype == jnp.bool_:  # accumulating bools is a logical or
        return x.astype(jnp.int32).at[idx].add(values.astype(jnp.int32), mode="drop") != 0
    return x.at[idx].add(values, mode="drop")


@lowers("aten::_index_put_impl")
def _index_put_impl(x, indices, values, accumulate=False, unsafe=False):
    return index_put(x, indices, values, accumulate)


@lowers("aten::_unsafe_masked_index")
def _unsafe_masked_index(x, mask, indices, fill):
    """x[indices] where mask, else fill (upsampling decompositions use it with clamped indices)."""
    clamped = [None if i is None else jnp.clip(i, -x.shape[d], x.shape[d] - 1) for d, i in enumerate(indices)]
    return jnp.where(mask, _index(x, clamped), _as_array(fill, x.dtype))


@lowers("aten::_unsafe_masked_index_put_accumulate")
def _unsafe_masked_index_put_accumulate(x, mask, indices, values):
    clamped = [None if i is None else jnp.clip(i, -x.shape[d], x.shape[d] - 1) for d, i in enumerate(indices)]
    values = jnp.where(mask, values, 0).astype(x.dtype)
    return _scatter_reduce(x, _index_tuple(clamped), values, "sum")


# Host kernels: accept CPU index tensors and turn bool masks into integer indices before jitting.
@cache
def _mask_coords(shape: tuple, dtype):
    def padded(mask):
        coords = jnp.nonzero(mask, size=mask.size, fill_value=0)
        return coords, jnp.count_nonzero(mask)

    return jax.jit(padded)


def _mask_to_indices(mask: torch.Tensor) -> list[torch.Tensor]:
    if mask.device.type != "tpu":
        return [c.to("tpu") for c in mask.nonzero().unbind(1)]
    m = to_jax(mask)
    coords, count = _mask_coords(m.shape, m.dtype)(m)
    n = int(count)
    return [wrap(c[:n], torch.int64) for c in coords]


def _device_indices(indices, expand_masks: bool) -> list:
    out = []
    for i in indices:
        if i is None:
            out.append(None)
        elif expand_masks and i.dtype in (torch.bool, torch.uint8):
            out.extend(_mask_to_indices(i))
        elif i.device.type != "tpu" and i.dim() > 0:
            out.append(i.to("tpu"))
        else:
            out.append(i)
    return out


def _check_masks(x: torch.Tensor, indices) -> None:
    """CPU's shape check of boolean masks (a mask indexes as many dims as it has, and must match them):
    XLA would read a mismatched mask as out-of-range integer indices and clamp."""
    dim = 0
    for i in indices:
        if i is not None and i.dtype in (torch.bool, torch.uint8):
            for k, size in enumerate(i.shape):
                if dim + k >= x.dim() or size != x.shape[dim + k]:
                    raise IndexError(
                        f"The shape of the mask {list(i.shape)} at index {k} does not match the shape of "
                        f"the indexed tensor {list(x.shape)} at index {dim + k}"
                    )
            dim += i.dim()
        else:
            dim += 1


def _needs_host_pass(indices, masks: bool) -> bool:
    for i in indices:
        if i is not None and (
            (i.device.type != "tpu" and i.dim() > 0) or (masks and i.dtype in (torch.bool, torch.uint8))
        ):
            return True
    return False


@lowers("aten::index.Tensor", kind="host")
def index(x: torch.Tensor, indices) -> torch.Tensor:
    _check_masks(x, indices)
    if _needs_host_pass(indices, masks=True):
        indices = _device_indices(indices, expand_masks=True)
    return eager_kernel("aten::index.Tensor", Lowering(_index))(x, indices)


@lowers("aten::index_put_", kind="host")
def index_put_(x: torch.Tensor, indices, values, accumulate: bool = False) -> torch.Tensor:
    _check_masks(x, indices)
    if _needs_host_pass(indices, masks=False):
        indices = _device_indices(indices, expand_masks=False)
    return eager_kernel("aten::index_put_", Lowering(index_put), inplace_of="aten::index_put")(
        x, indices, values, accumulate
    )


@lowers("aten::_index_put_impl_", kind="host")
def _index_put_impl_(x, indices, values, accumulate=False, unsafe=False) -> torch.Tensor:
    _check_masks(x, indices)
    if _needs_host_pass(indices, masks=False):
        indices = _device_indices(indices, expand_masks=False)
    return eager_kernel(
        "aten::_index_put_impl_", Lowering(_index_put_impl), inplace_of="aten::_index_put_impl"
    )(x, indices, values, accumulate, unsafe)


# -- index_select / index_copy / index_add / index_fill / index_reduce ------------------------------
@lowers("aten::index_select")
def index_select(x, dim, index):
    (x,) = _at_least_1d(x)
    dim %= x.ndim
    index = _wrap_negative(index.reshape(-1), x.shape[dim])
    return jnp.take(x, index, axis=dim, mode="clip")


@lowers("aten::index_copy")
def index_copy(x, dim, index, source):
    x, index, source = _at_least_1d(x, index, source)
    dim %= x.ndim
    index = _wrap_negative(index, x.shape[dim])
    return x.at[_along(dim, index)].set(source.astype(x.dtype), mode="drop")


@lowers("aten::index_add")
def index_add(x, dim, index, source, alpha=1):
    x, index, source = _at_least_1d(x, index, source)
    dim %= x.ndim
    index = _wrap_negative(index, x.shape[dim])
    scaled = source if isinstance(alpha, int) and alpha == 1 else source * alpha
    return _scatter_reduce(x, _along(dim, index), scaled, "sum")


@lowers("aten::index_fill.int_Scalar", "aten::index_fill.int_Tensor")
def index_fill(x, dim, index, value):
    x, index = _at_least_1d(x, index)
    dim %= x.ndim
    index = _wrap_negative(index, x.shape[dim])
    return x.at[_along(dim, index)].set(_as_array(value, x.dtype), mode="drop")


@lowers("aten::index_reduce")
def index_reduce(x, dim, index, source, reduce, include_self=True):
    x, index, source = _at_least_1d(x, index, source)
    dim %= x.ndim
    index = _wrap_negative(index, x.shape[dim])
    return _scatter_reduce(x, _along(dim, index), source, reduce, include_self)


# -- gather / scatter -------------------------------------------------------------------------------
def _gather_indices(index, dim: int) -> tuple:
    """For gather/scatter: position p of `index` addresses x[p[0], ..., index[p], ..., p[n-1]]."""
    grid = list(jnp.indices(index.shape, sparse=True))
    grid[dim] = index
    return tuple(grid)


@lowers("aten::gather")
def gather(x, dim, index, sparse_grad=False):
    if index.size == 0:
        return jnp.zeros(index.shape, x.dtype)
    x, index = _at_least_1d(x, index)
    dim %= x.ndim
    index = _wrap_negative(index, x.shape[dim])
    return x[_gather_indices(index, dim)]


def _scatter_args(x, dim, index, src):
    """(x, index tuple, src shaped like index): src may be larger than index, or a scalar value."""
    x, index = _at_least_1d(x, index)
    dim %= x.ndim
    index = _wrap_negative(index, x.shape[dim])
    if hasattr(src, "ndim") and src.ndim == index.ndim:
        src = src[tuple(slice(0, n) for n in index.shape)]
    src = jnp.broadcast_to(_as_array(src, x.dtype), index.shape)
    return x, _gather_indices(index, dim), src


@lowers("aten::scatter.src", "aten::scatter.value")
def scatter(x, dim, index, src):
    x, idx, src = _scatter_args(x, dim, index, src)
    return x.at[idx].set(src)


@lowers("aten::scatter.reduce", "aten::scatter.value_reduce")
def scatter_with_reduce(x, dim, index, src, reduce):
    x, idx, src = _scatter_args(x, dim, index, src)
    return _scatter_reduce(x, idx, src, reduce)


@lowers("aten::scatter_add")
def scatter_add(x, dim, index, src):
    x, idx, src = _scatter_args(x, dim, index, src)
    return _scatter_reduce(x, idx, src, "sum")


@lowers("aten::scatter_reduce.two")
def scatter_reduce(x, dim, index, src, reduce, include_self=True):
    x, idx, src = _scatter_args(x, dim, index, src)
    return _scatter_reduce(x, idx, src, reduce, include_self)


# -- masked ops -------------------------------------------------------------------------------------
@lowers("aten::masked_fill.Scalar", "aten::masked_fill.Tensor")
def masked_fill(x, mask, value):
    return jnp.where(mask, _as_array(value, x.dtype), x)


@lowers("aten::masked_scatter")
def masked_scatter(x, mask, source):
    """Fill the True positions of mask, in row-major order, with consecutive elements of source."""
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    m = jnp.broadcast_to(mask, shape).reshape(-1).astype(jnp.bool_)
    flat = jnp.broadcast_to(x, shape).reshape(-1)
    src = source.reshape(-1).astype(x.dtype)
    if src.size == 0:
        return flat.reshape(shape)
    position = jnp.clip(jnp.cumsum(m, dtype=jnp.int32) - 1, 0, src.size - 1)
    return jnp.where(m, src[position], flat).reshape(shape)


@lowers("aten::masked_scatter_backward", graph=True)
def masked_scatter_backward(grad, mask, sizes):
    """The source's gradient: `grad.masked_select(mask)` zero-padded to `sizes`' element count.

    Static-shaped (the size is the source's), so graphs (a VLM merging image features into its text
    embeddings) compile whole; eager keeps PyTorch's masked_select kernel and its size check."""
    shape = jnp.broadcast_shapes(grad.shape, mask.shape)
    m = jnp.broadcast_to(mask, shape).reshape(-1).astype(jnp.bool_)
    g = jnp.broadcast_to(grad, shape).reshape(-1)
    numel = 1
    for s in sizes:
        numel *= int(s)
    position = jnp.where(m, jnp.cumsum(m, dtype=jnp.int32) - 1, numel)  # unselected: off the end
    return jnp.zeros((numel,), grad.dtype).at[position].set(g, mode="drop").reshape(tuple(sizes))


# -- embedding / take -------------------------------------------------------------------------------
@lowers("aten::embedding")
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return jnp.take(weight, indices, axis=0, mode="clip")


@lowers("aten::embedding_dense_backward")
def embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    """Sum the output gradients into the rows they came from (padding row gets none)."""
    dim = grad.shape[-1]
    rows = indices.reshape(-1)
    acc = jnp.float32 if grad.dtype in _LOW_PRECISION else grad.dtype
    g = grad.reshape(-1, dim).astype(acc)
    g = jnp.where((rows == padding_idx)[:, None], 0, g)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), acc).at[rows].add(1)
        g = g / counts[rows][:, None]
    return jnp.zeros((num_weights, dim), acc).at[rows].add(g).astype(grad.dtype)


@lowers("aten::embedding_renorm")
def embedding_renorm(weight, indices, max_norm, norm_type):
    """Rows looked up by `indices` whose p-norm exceeds max_norm are scaled down to it (max_norm=)."""
    acc = jnp.float32 if weight.dtype in _LOW_PRECISION else weight.dtype
    w = weight.astype(acc)
    touched = jnp.zeros(weight.shape[0], jnp.bool_).at[indices.reshape(-1)].set(True)
    if norm_type == float("inf"):
        norms = jnp.max(jnp.abs(w), axis=1)
    else:
        norms = jnp.sum(jnp.abs(w) ** norm_type, axis=1) ** (1.0 / norm_type)
    scale = jnp.where(touched & (norms > max_norm), max_norm / (norms + 1e-7), 1.0)
    return (w * scale[:, None].astype(acc)).astype(weight.dtype)


# -- embedding_bag (nn.EmbeddingBag): per-bag sum / mean / max of looked-up rows ----------------------
# Bag b holds indices[offsets[b]:offsets[b + 1]] (the last bag runs to the end; include_last_offset
# drops the extra final offset). Entries equal to padding_idx are skipped and not counted; empty bags
# give zeros. The auxiliary outputs follow PyTorch's device (meta/CUDA) layout: offset2bag (bag of each
# index), bag_size (non-padding entries per bag, padded to len(offsets)), max_indices (bags, D) in max
# mode (-1 for an empty bag, else the weight row of the first maximum), else empty.
_BAG_SUM, _BAG_MEAN, _BAG_MAX = 0, 1, 2


def _offset2bag(offsets, n: int, num_bags: int):
    """The bag of each of n indices: the last bag whose offset is <= its position (-1 before bag 0)."""
    if num_bags == 0:
        return jnp.full((n,), -1, offsets.dtype)
    position = jnp.arange(n, dtype=offsets.dtype)
    return jnp.searchsorted(offsets[:num_bags], position, side="right").astype(offsets.dtype) - 1


def _bag_targets(bag, indices, padding_idx: int, num_bags: int):
    """(valid, segment): entries that count, and their bag (num_bags, i.e. dropped, for the others)."""
    valid = (bag >= 0) & (bag < num_bags) & (indices != padding_idx)
    return valid, jnp.where(valid, bag, num_bags)


def _bag_max(rows, indices, bag, valid, segment, num_bags: int):
    """Per-bag, per-feature max of `rows` and the weight row of its first occurrence (-1: empty bag)."""
    n, dim = rows.shape
    best = jnp.full((num_bags, dim), -jnp.inf, rows.dtype).at[segment].max(rows, mode="drop")
    if n == 0:
        return jnp.zeros_like(best), jnp.full((num_bags, dim), -1, indices.dtype)
    at_max = valid[:, None] & (rows == best[jnp.clip(bag, 0, max(num_bags - 1, 0))])
    position = jnp.where(at_max, jnp.arange(n)[:, None], n)
    first = jnp.full((num_bags, dim), n).at[segment].min(position, mode="drop")
    found = first < n
    max_indices = jnp.where(found, indices[jnp.minimum(first, n - 1)], -1)
    return jnp.where(found, best, 0), max_indices


@lowers("aten::_embedding_bag", "aten::_embedding_bag_forward_only")
def _embedding_bag(
    weight,
    indices,
    offsets,
    scale_grad_by_freq=False,
    mode=_BAG_SUM,
    sparse=False,
    per_sample_weights=None,
    include_last_offset=False,
    padding_idx=-1,
):
    """(output, offset2bag, bag_size, max_indices) of nn.EmbeddingBag over 1-D indices and offsets."""
    n, dim = indices.shape[0], weight.shape[1]
    num_bags = offsets.shape[0] - 1 if include_last_offset else offsets.shape[0]
    acc = jnp.float32 if weight.dtype in _LOW_PRECISION else weight.dtype
    bag = _offset2bag(offsets, n, num_bags)
    valid, segment = _bag_targets(bag, indices, padding_idx, num_bags)
    rows = jnp.take(weight, indices, axis=0, mode="clip").astype(acc)
    count = jnp.zeros((num_bags,), jnp.int32).at[segment].add(1, mode="drop")
    if mode == _BAG_MAX:
        output, max_indices = _bag_max(rows, indices, bag, valid, segment, num_bags)
    else:
        if per_sample_weights is not None:
            rows = rows * per_sample_weights.astype(acc)[:, None]
        output = jnp.zeros((num_bags, dim), acc).at[segment].add(rows, mode="drop")
        if mode == _BAG_MEAN:
            output = output / jnp.maximum(count, 1).astype(acc)[:, None]
        max_indices = jnp.zeros((0,), indices.dtype)
    bag_size = jnp.zeros((offsets.shape[0],), jnp.int32).at[:num_bags].set(count)
    return output.astype(weight.dtype), bag, bag_size, max_indices


@lowers("aten::_embedding_bag_dense_backward")
def _embedding_bag_dense_backward(
    grad,
    indices,
    offset2bag,
    bag_size,
    maximum_indices,
    num_weights,
    scale_grad_by_freq,
    mode,
    per_sample_weights,
    padding_idx=-1,
):
    """d weight: each counted entry's bag gradient (times its sample weight, over the bag size in mean
    mode, over its index's frequency with scale_grad_by_freq) added to its row; max mode routes each
    bag's gradient to the rows that held the maxima."""
    num_bags, dim = grad.shape
    acc = jnp.float32 if grad.dtype in _LOW_PRECISION else grad.dtype
    g = grad.astype(acc)
    if mode == _BAG_MAX:
        taken = (bag_size[:num_bags] > 0)[:, None] & (maximum_indices >= 0)
        rows = jnp.where(taken, maximum_indices, num_weights)
        columns = jnp.broadcast_to(jnp.arange(dim), rows.shape)
        return jnp.zeros((num_weights, dim), acc).at[rows, columns].add(g, mode="drop").astype(grad.dtype)
    valid, _ = _bag_targets(offset2bag, indices, padding_idx, num_bags)
    bag = jnp.clip(offset2bag, 0, max(num_bags - 1, 0))
    scale = jnp.ones(indices.shape, acc)
    if per_sample_weights is not None:
        scale = scale * per_sample_weights.astype(acc)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), acc).at[indices].add(1)
        scale = scale / counts[indices]
    if mode == _BAG_MEAN:
        size = bag_size[bag].astype(acc)
        scale = jnp.where(size != 0, scale / size, scale)
    contrib = g[bag] * scale[:, None] if num_bags else jnp.zeros((indices.shape[0], dim), acc)
    target = jnp.where(valid, indices, num_weights)
    return jnp.zeros((num_weights, dim), acc).at[target].add(contrib, mode="drop").astype(grad.dtype)


@lowers("aten::_embedding_bag_backward")
def _embedding_bag_backward(
    grad,
    indices,
    offsets,
    offset2bag,
    bag_size,
    maximum_indices,
    num_weights,
    scale_grad_by_freq,
    mode,
    sparse,
    per_sample_weights,
    padding_idx=-1,
):
    """Dense weight gradient of _embedding_bag (sparse=True gradients are not supported on tpu)."""
    if sparse:
        raise NotImplementedError("embedding_bag(sparse=True): sparse gradients are not supported on tpu")
    if offset2bag.shape[0] != indices.shape[0]:  # CPU's fast sum path leaves it empty: rebuild it
        offset2bag = _offset2bag(offsets, indices.shape[0], grad.shape[0])
    return _embedding_bag_dense_backward(
        grad,
        indices,
        offset2bag,
        bag_size,
        maximum_indices,
        num_weights,
        scale_grad_by_freq,
        mode,
        per_sample_weights,
        padding_idx,
    )


@lowers("aten::_embedding_bag_per_sample_weights_backward")
def _embedding_bag_per_sample_weights_backward(
    grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1
):
    """d per_sample_weights (sum mode): the bag gradient dotted with the entry's weight row."""
    acc = jnp.float32 if grad.dtype in _LOW_PRECISION else grad.dtype
    num_bags = grad.shape[0]
    if offset2bag.shape[0] != indices.shape[0]:
        offset2bag = _offset2bag(offsets, indices.shape[0], num_bags)
    valid, _ = _bag_targets(offset2bag, indices, padding_idx, num_bags)
    if num_bags == 0:
        return jnp.zeros(indices.shape, grad.dtype)
    g = grad.astype(acc)[jnp.clip(offset2bag, 0, num_bags - 1)]
    rows = jnp.take(weight, indices, axis=0, mode="clip").astype(acc)
    return jnp.where(valid, jnp.sum(g * rows, axis=1), 0).astype(grad.dtype)


@lowers("aten::take")
def take(x, index):
    flat = x.reshape(-1)
    return flat[_wrap_negative(index, flat.size)]


@lowers("aten::put")
def put(x, index, source, accumulate=False):
    """x.flatten()[index] = source (or +=), treating x as 1-D whatever its shape."""
    flat = x.reshape(-1)
    idx = (_wrap_negative(index.reshape(-1), flat.size),)
    src = source.reshape(-1)
    out = _scatter_reduce(flat, idx, src, "sum") if accumulate else flat.at[idx].set(src.astype(x.dtype))
    return out.reshape(x.shape)


# -- repeat_interleave with a repeats tensor: the output length is data-dependent ---------------------
@cache
def _repeat_interleave_jit(total: int):
    def run(repeats):
        return jnp.repeat(
            jnp.arange(repeats.shape[0], dtype=repeats.dtype), repeats, total_repeat_length=total
        )

    return jax.jit(run)


@lowers("aten::repeat_interleave.Tensor", kind="host")
def repeat_interleave(repeats: torch.Tensor, *, output_size=None) -> torch.Tensor:
    r = to_jax(repeats).reshape(-1)
    if output_size is None:  # this sync reads the repeats anyway: check them as CPU does
        if r.size and int(jnp.min(r)) < 0:
            raise RuntimeError("repeats can not be negative")
        total = int(jnp.sum(r))
    else:
        total = int(output_size)
    return wrap(_repeat_interleave_jit(total)(r), repeats.dtype)
