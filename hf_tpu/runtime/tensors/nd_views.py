"""Views as N-D operations on their base's logical shape: reshape (split), slice, transpose, broadcast.

The flat path (`strided.py`) reads a view as a segment of the base's flattened buffer. That is right on
one chip, but a buffer sharded over chips along a non-leading dim (`weight.t()` of a row-sharded weight,
the head split of a column-sharded projection) has no sharding XLA can keep through a flatten: GSPMD
gathers it whole to every chip first. Read in N-D instead — the base reshaped so that each view dim is
one dim of it, sliced, transposed into the view's order — a sharded dim stays sharded, and XLA moves
only what the consumer needs.

A plan depends on (base shape, view shape, view strides) only; where the view starts (its storage
offset) becomes one start per refined dim (`starts`), checked against the plan on the host: an offset
at which the view would wrap around a dim of the base has no N-D plan (None), and the flat path reads it.
"""

from __future__ import annotations

import math
from functools import cache
from typing import NamedTuple


class NdPlan(NamedTuple):
    refined: tuple  # the base reshaped to this shape (base dims split into factors)
    radices: tuple  # per base dim, its factors (their product is the dim's size)
    sizes: tuple  # per refined dim, how many elements the view takes (1: a fixed index)
    steps: tuple  # per refined dim, the step between them (> 1 only for a dim that is not split)
    kept: tuple  # refined dims that are view sub-dims, in refined order
    perm: tuple  # transposes the kept dims into view order (each view dim's sub-dims outer to inner)
    real_shape: tuple  # the view's dims with size > 1 and a stride, in view order
    unbroadcast: tuple  # the view's shape with its stride-0 dims as 1 (the read before broadcasting)
    shape: tuple  # the view's shape
    broadcast: bool  # the view has stride-0 dims of size > 1
    strided: bool  # some refined dim is read with a step (no N-D write)


def _contiguous(shape: tuple) -> tuple:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return tuple(reversed(strides))


@cache
def nd_plan(base_shape: tuple, shape: tuple, stride: tuple) -> NdPlan | None:
    """The N-D plan of view (shape, stride) of a contiguous base of `base_shape`, or None."""
    if 0 in base_shape or 0 in shape or len(shape) != len(stride):
        return None
    if _row_major(shape, stride) and math.prod(shape) == math.prod(base_shape):
        return _reshape_plan(base_shape, shape)  # `x.view(b, s, h, d)`, `x.view(b, s, h * d)`: a reshape
    bstrides = _contiguous(base_shape)
    dims = [j for j, b in enumerate(base_shape) if b > 1]  # size-1 base dims never carry a view dim
    per_base: dict[int, list] = {j: [] for j in range(len(base_shape))}  # base dim -> [(step, size, id)]
    view_subdims: list[list] = []  # per real view dim: its sub-dims' ids, outer to inner
    real_shape = []
    unbroadcast = []
    broadcast = False
    next_id = 0
    for size, st in zip(shape, stride):
        if size == 1:
            unbroadcast.append(1)
            continue
        if st == 0:
            broadcast = True
            unbroadcast.append(1)
            continue
        if st < 0:
            return None
        real_shape.append(size)
        unbroadcast.append(size)
        subs = []
        s, t = size, st
        while True:
            j = next((d for d in dims if bstrides[d] <= t), None)
            if j is None or t % bstrides[j]:
                return None
            f = t // bstrides[j]
            if f * (s - 1) < base_shape[j]:
                subs.append((j, f, s))
                break
            if f != 1 or s % base_shape[j]:  # spans several base dims: only whole inner dims merge
                return None
            subs.append((j, 1, base_shape[j]))
            s //= base_shape[j]
            t *= base_shape[j]
        ids = []
        for j, f, s in reversed(subs):  # outer to inner
            per_base[j].append((f, s, next_id))
            ids.append(next_id)
            next_id += 1
        view_subdims.append(ids)
    refined, radices, sizes, steps, position = [], [], [], [], {}
    for j, b in enumerate(base_shape):
        subs = sorted(per_base[j], key=lambda x: -x[0])
        for (fa, _, _), (fb, sb, _) in zip(subs, subs[1:]):
            if fa == fb or fa % fb or fa // fb < sb:
                return None  # overlapping or interleaved
        if not subs:
            factors = [(b, 1, 1, None)]
        elif b % subs[0][0] == 0:
            factors = []
            outer = b
            for f, s, k in subs:
                factors.append((outer // f, s, 1, k))
                outer = f
            if outer > 1:
                factors.append((outer, 1, 1, None))  # the digit below the innermost step: fixed
        elif len(subs) == 1:
            f, s, k = subs[0]
            factors = [(b, s, f, k)]  # one strided slice of the dim
        else:
            return None
        radices.append(tuple(f[0] for f in factors))
        for radix, take, step, k in factors:
            if k is not None:
                position[k] = len(refined)
            refined.append(radix)
            sizes.append(take)
            steps.append(step)
    kept = tuple(sorted(position.values()))
    order = [position[k] for ids in view_subdims for k in ids]
    perm = tuple(kept.index(r) for r in order)
    return NdPlan(
        tuple(refined),
        tuple(radices),
        tuple(sizes),
        tuple(steps),
        kept,
        perm,
        tuple(real_shape),
        tuple(unbroadcast),
        tuple(shape),
        broadcast,
        any(step > 1 for step in steps),
    )


def _row_major(shape: tuple, stride: tuple) -> bool:
    expected = 1
    for size, st in zip(reversed(shape), reversed(stride)):
        if size != 1 and st != expected:
            return False
        expected *= size
    return True


def _reshape_plan(base_shape: tuple, shape: tuple) -> NdPlan:
    n = len(base_shape)
    kept = tuple(j for j, b in enumerate(base_shape) if b > 1)
    return NdPlan(
        tuple(base_shape),
        tuple((b,) for b in base_shape),
        tuple(base_shape),
        (1,) * n,
        kept,
        tuple(range(len(kept))),
        tuple(s for s in shape if s > 1),
        tuple(shape),
        tuple(shape),
        False,
        False,
    )


def starts(plan: NdPlan, base_shape: tuple, offset: int) -> tuple | None:
    """Where the view at storage `offset` starts in each refined dim, or None when it wraps there."""
    numel = math.prod(base_shape)
    if not 0 <= offset < numel:
        return None
    digits = []
    rest = offset
    for b in reversed(base_shape):
        digits.append(rest % b)
        rest //= b
    digits.reverse()
    out = []
    r = 0
    for d, radix in zip(digits, plan.radices):
        sub = []
        for factor in reversed(radix):
            sub.append(d % factor)
            d //= factor
        for start in reversed(sub):
            size, step, extent = plan.sizes[r], plan.steps[r], plan.refined[r]
            if start + step * (size - 1) >= extent:
                return None
            out.append(start)
            r += 1
    return tuple(out)


def read(jax, base, starts_: tuple, plan: NdPlan):
    """Traceable: the view's values from `base` (its storage's array) at `starts_` (static or traced)."""
    lax = jax.lax
    x = base.reshape(plan.refined)
    spans = tuple((size - 1) * step + 1 for size, step in zip(plan.sizes, plan.steps))
    if all(type(s) is int for s in starts_):  # static: a plain slice (along a split dim, GSPMD moves
        # only the view's rows between chips; a dynamic slice there gathers the whole buffer first)
        if spans != plan.refined or plan.strided:
            x = lax.slice(x, starts_, tuple(a + b for a, b in zip(starts_, spans)), plan.steps)
    else:
        if spans != plan.refined:
            x = lax.dynamic_slice(x, starts_, spans)
        if plan.strided:
            x = lax.slice(x, (0,) * len(spans), spans, plan.steps)
    x = x.reshape(tuple(plan.sizes[r] for r in plan.kept))
    if plan.perm != tuple(range(len(plan.perm))):
        x = x.transpose(plan.perm)
    x = x.reshape(plan.unbroadcast)
    if plan.broadcast:
        x = jax.numpy.broadcast_to(x, plan.shape)
    return x


def writable(plan: NdPlan | None) -> bool:
    """Whether a write through the view can use `write` (no repeated elements, no steps)."""
    return plan is not None and not plan.broadcast and not plan.strided


def write(jax, base, value, starts_: tuple, plan: NdPlan):
    """Traceable: `base` with the view at `starts_` replaced by `value` (the view's shape); for plans
    that are `writable`."""
    order = [plan.kept[p] for p in plan.perm]  # the kept refined dims, in view order
    v = value.reshape(tuple(plan.sizes[r] for r in order))
    inverse = [0] * len(plan.perm)
    for i, p in enumerate(plan.perm):
        inverse[p] = i
    if tuple(inverse) != tuple(range(len(inverse))):
        v = v.transpose(inverse)
    v = v.reshape(plan.sizes).astype(base.dtype)
    x = base.reshape(plan.refined)
    return jax.lax.dynamic_update_slice(x, v, starts_).reshape(base.shape)
