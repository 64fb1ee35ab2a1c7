"""N-D view reads and writes (tensors/nd_views.py) against PyTorch's own strided views, on random views.

With several chips every view of a storage is read and written this way (a sharded dim stays sharded);
here the planner itself is checked on one device: whatever chain of view ops makes a view, its N-D read
equals torch's view of the same base, and a write through it changes exactly what torch's would.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_tpu.runtime.buffers import platform
from hf_tpu.runtime.tensors import nd_views

jax = platform.jax()  # 64-bit types on, as the runtime runs them
jnp = jax.numpy

SIZES = st.sampled_from([1, 2, 3, 4, 6, 8])
OPS = st.sampled_from(["transpose", "permute", "narrow", "select", "view", "unsqueeze", "expand", "step"])


def _apply(v: torch.Tensor, op: str, data) -> torch.Tensor:
    d = v.dim()
    if op == "transpose" and d >= 2:
        a, b = data.draw(st.permutations(range(d)))[:2]
        return v.transpose(a, b)
    if op == "permute" and d >= 1:
        return v.permute(data.draw(st.permutations(range(d))))
    if op == "narrow" and d >= 1:
        dim = data.draw(st.integers(0, d - 1))
        n = v.shape[dim]
        start = data.draw(st.integers(0, n - 1))
        return v.narrow(dim, start, data.draw(st.integers(1, n - start)))
    if op == "select" and d >= 2:
        dim = data.draw(st.integers(0, d - 1))
        return v.select(dim, data.draw(st.integers(0, v.shape[dim] - 1)))
    if op == "view" and v.is_contiguous() and v.numel() > 1:
        n = v.numel()
        first = data.draw(st.sampled_from([f for f in range(1, n + 1) if n % f == 0]))
        return v.view(first, n // first)
    if op == "unsqueeze":
        return v.unsqueeze(data.draw(st.integers(0, d)))
    if op == "expand" and d >= 1:
        ones = [i for i, s in enumerate(v.shape) if s == 1]
        if ones:
            shape = list(v.shape)
            shape[data.draw(st.sampled_from(ones))] = 3
            return v.expand(shape)
    if op == "step" and d >= 1:
        index = [slice(None)] * d
        index[data.draw(st.integers(0, d - 1))] = slice(None, None, 2)
        return v[tuple(index)]
    return v


def _plan(base: torch.Tensor, view: torch.Tensor):
    plan = nd_views.nd_plan(tuple(base.shape), tuple(view.shape), tuple(view.stride()))
    starts = None if plan is None else nd_views.starts(plan, tuple(base.shape), view.storage_offset())
    return plan, starts


@settings(max_examples=80, deadline=None)
@given(
    shape=st.lists(SIZES, min_size=1, max_size=4), ops=st.lists(OPS, min_size=1, max_size=4), data=st.data()
)
def test_nd_reads_and_writes_equal_torchs_strided_views(shape, ops, data):
    base = torch.randn(shape, dtype=torch.float64)
    view = base
    for op in ops:
        view = _apply(view, op, data)
    plan, starts = _plan(base, view)
    if starts is None:
        return  # no N-D plan: the flat path reads it (covered by the rest of the suite)
    got = np.asarray(nd_views.read(jax, jnp.asarray(base.numpy()), starts, plan))
    np.testing.assert_array_equal(got, view.numpy())
    if nd_views.writable(plan):
        value = torch.randn(view.shape, dtype=torch.float64)
        expected = base.clone()
        expected.as_strided(view.shape, view.stride(), view.storage_offset()).copy_(value)
        out = nd_views.write(jax, jnp.asarray(base.numpy()), jnp.asarray(value.numpy()), starts, plan)
        np.testing.assert_array_equal(np.asarray(out), expected.numpy())


@pytest.mark.parametrize(
    "make",
    [
        lambda w: w.t(),  # every linear layer's weight
        lambda x: x.view(2, 3, 4, 4).transpose(1, 2),  # attention heads split and transposed
        lambda x: x[:, -1, :],  # the last token's logits
        lambda x: x[..., 4:12],  # half of a rotary embedding
        lambda x: x.view(2, 3, 16)[:, 1:],  # a contiguous sub-block
        lambda x: x.view(6, 16),  # a reshape merging dims
    ],
    ids=["t", "heads", "last_token", "rotary_half", "rows", "merge"],
)
def test_the_views_models_make_have_nd_plans(make):
    base = (
        torch.randn(8, 4, dtype=torch.float64)
        if make.__code__.co_varnames[0] == "w"
        else torch.randn(2, 3, 16)
    )
    view = make(base)
    plan, starts = _plan(base, view)
    assert starts is not None, (
        f"no N-D plan for {tuple(view.shape)} {view.stride()} at {view.storage_offset()}"
    )
    got = np.asarray(nd_views.read(jax, jnp.asarray(base.numpy()), starts, plan))
    np.testing.assert_array_equal(got, view.numpy())


def test_a_view_that_wraps_around_a_dim_has_no_plan():
    base = torch.randn(2, 3, 16)
    view = base.view(-1)[5:20]  # crosses from one row of 16 into the next
    plan, starts = _plan(base, view)
    assert starts is None
