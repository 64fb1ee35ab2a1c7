"""Strided views as XLA slices and transposes instead of gathers.

A view is (shape, stride, offset) over its storage's flat buffer. Almost every view a model makes —
`weight.t()` in each linear layer, `transpose(1, 2)` of attention heads, `x[:, 0]`, `narrow`, `x[::2]`,
`expand` — is a *box*: its dims, ordered by decreasing stride, nest (each stride a multiple of the next
one's stride times its size). A box is read as one contiguous segment of the flat buffer, reshaped,
sliced, transposed and broadcast; it is written the same way in reverse. XLA fuses those; the generic
path (a gather/scatter over computed flat indices) costs ~1 ms per 512K elements on CPU and does not.
Views that are not boxes (overlapping strides) keep the generic path.

Writes prefer `grid_starts`/`write_grid`: the whole buffer reshaped so the box is a rectangle of it,
updated with one dynamic_update_slice, which XLA does in place on a donated buffer (the cost of the
view). The segment path reads and rewrites every element between the box's first and last one, and pads
the whole buffer when the segment's last row runs past its end: `mask[:, :, :8, :100].fill_()` on a
512 MB mask took ~200 ms that way, a column write `m[:, 7] = v` as long.
"""

from __future__ import annotations

from typing import NamedTuple


class Box(NamedTuple):
    real: tuple  # dims with size > 1 and a non-zero stride, in increasing dim order
    order: tuple  # the same dims, outermost (largest stride) first
    box_shape: tuple  # the segment reshaped: (n_0, m_1, ..., m_k-1, step)
    take: tuple  # per box dim, how many to keep (n_0, n_1, ..., n_k-1, 1)
    length: int  # elements in the segment
    pad: int  # zeros appended to the flat buffer so the segment never runs past its end


def box_plan(shape: tuple, stride: tuple, for_write: bool = False) -> Box | None:
    """How to read/write view (shape, stride) as a box; None when the view is not one (or, for a
    write, when it repeats elements through a broadcast dim)."""
    if 0 in shape:
        return None
    if for_write and any(n > 1 and st == 0 for n, st in zip(shape, stride)):
        return None
    real = tuple(d for d in range(len(shape)) if shape[d] > 1 and stride[d] != 0)
    if any(stride[d] < 0 for d in real):
        return None
    order = tuple(sorted(real, key=lambda d: -stride[d]))
    for outer, inner in zip(order, order[1:]):
        if stride[outer] % stride[inner] or stride[outer] // stride[inner] < shape[inner]:
            return None  # overlapping or interleaved dims
    if not order:
        return Box(real, order, (1,), (1,), 1, 0)
    step = stride[order[-1]]
    box_shape = (shape[order[0]],)
    box_shape += tuple(stride[o] // stride[i] for o, i in zip(order, order[1:]))
    box_shape += (step,)
    take = tuple(shape[d] for d in order) + (1,)
    length = shape[order[0]] * stride[order[0]]
    span = 1 + sum((shape[d] - 1) * stride[d] for d in real)
    return Box(real, order, box_shape, take, length, length - span)


def read_box(jax, base, offset, shape: tuple, plan: Box):
    """The view's values from `base` (any shape; read flat) at storage `offset` (traced or static)."""
    lax = jax.lax
    flat = base.reshape(-1)
    if plan.pad:
        flat = jax.numpy.pad(flat, (0, plan.pad))
    seg = lax.dynamic_slice(flat, (offset,), (plan.length,)).reshape(plan.box_shape)
    if plan.take != plan.box_shape:
        seg = lax.slice(seg, (0,) * len(plan.take), plan.take)
    vals = seg.reshape(plan.take[:-1])
    perm = tuple(plan.order.index(d) for d in plan.real)
    if perm != tuple(range(len(perm))):
        vals = vals.transpose(perm)
    kept = tuple(shape[d] if d in plan.real else 1 for d in range(len(shape)))
    vals = vals.reshape(kept)
    if kept != tuple(shape):
        vals = jax.numpy.broadcast_to(vals, shape)
    return vals


def write_box(jax, base, value, offset, plan: Box):
    """`base` with the view's elements replaced by `value` (the view's shape); same shape as `base`."""
    lax = jax.lax
    flat = base.reshape(-1)
    size = flat.shape[0]
    if plan.pad:
        flat = jax.numpy.pad(flat, (0, plan.pad))
    seg = lax.dynamic_slice(flat, (offset,), (plan.length,)).reshape(plan.box_shape)
    vals = value.reshape(tuple(value.shape[d] for d in plan.real))
    perm = tuple(plan.real.index(d) for d in plan.order)
    if perm != tuple(range(len(perm))):
        vals = vals.transpose(perm)
    vals = vals.reshape(plan.take).astype(seg.dtype)
    seg = lax.dynamic_update_slice(seg, vals, (0,) * len(plan.take))
    flat = lax.dynamic_update_slice(flat, seg.reshape(-1), (offset,))
    if plan.pad:
        flat = flat[:size]
    return flat.reshape(base.shape)


def grid_starts(numel: int, shape: tuple, stride: tuple, offset: int, plan: Box) -> tuple | None:
    """Where box `plan` of view (shape, stride) at storage `offset` starts in the buffer's grid (the
    flat buffer of `numel` elements reshaped to `grid_shape`), or None when it is no rectangle of that
    grid (the grid does not divide the buffer, or the view wraps around a grid row)."""
    if not plan.order:
        return None
    outer = stride[plan.order[0]]
    if numel % outer:
        return None
    grid = grid_shape(numel, stride, plan)
    starts = [offset // outer]
    rest = offset % outer
    for d in plan.order[1:]:
        starts.append(rest // stride[d])
        rest %= stride[d]
    starts.append(rest)
    for start, size, n in zip(starts, plan.take, grid):
        if start + size > n:
            return None
    return tuple(starts)


def grid_shape(numel: int, stride: tuple, plan: Box) -> tuple:
    return (numel // stride[plan.order[0]],) + plan.box_shape[1:]


def write_grid(jax, base, value, starts, plan: Box, grid: tuple):
    """`base` with box `plan` (the view's shape in `value`) replaced, written at `starts` of the grid
    (`grid_starts`): one dynamic_update_slice of the view's size."""
    vals = value.reshape(tuple(value.shape[d] for d in plan.real))
    perm = tuple(plan.real.index(d) for d in plan.order)
    if perm != tuple(range(len(perm))):
        vals = vals.transpose(perm)
    vals = vals.reshape(plan.take).astype(base.dtype)
    return jax.lax.dynamic_update_slice(base.reshape(grid), vals, starts).reshape(base.shape)


def memory_order(shape: tuple, stride: tuple) -> tuple | None:
    """The dims of a dense, non-overlapping layout in memory order (outermost first), or None when it is
    row-major or not such a permutation. A copy laid out this way keeps PyTorch's strides: its buffer
    holds the value transposed into this order, and the tensor is that buffer permuted back."""
    n = len(shape)
    order = tuple(sorted(range(n), key=lambda d: (-stride[d], d)))
    if order == tuple(range(n)) or _row_major(shape, stride):
        return None
    expected = 1
    for d in reversed(order):
        if shape[d] > 1 and stride[d] != expected:
            return None
        expected *= shape[d]
    return order


def inverse_order(order: tuple) -> tuple:
    inverse = [0] * len(order)
    for i, d in enumerate(order):
        inverse[d] = i
    return tuple(inverse)


def _row_major(shape: tuple, stride: tuple) -> bool:
    """Contiguous as PyTorch defines it (the stride of a size-1 dim does not matter)."""
    expected = 1
    for size, st in zip(reversed(shape), reversed(stride)):
        if size != 1 and st != expected:
            return False
        expected *= size
    return True
