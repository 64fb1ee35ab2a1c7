"""Views fold into the ops that read them: one executable per op, results equal to CPU PyTorch.

An op given a view (`weight.t()`, a head transpose, a slice at an offset) passes its storage's whole
array to the op's executable, which reads the view inside. These tests check the results against CPU
torch in Strict and DeferAndFuse, that no separate view-read executable runs, and that a view whose
offset changes every call reuses one executable in Strict (the offset is a traced input there).
"""

from __future__ import annotations

import pytest
import torch

from hf_tpu.runtime.execution import dispatch
from hf_tpu.runtime.tensors import tensor
from hf_tpu.runtime.tensors.tensor import View, op_input


@pytest.fixture
def view_reads(monkeypatch):
    """Counts view reads that run as an executable of their own (tensor._call)."""
    calls = []
    original = tensor._call

    def counting(fn, *args, **kwargs):
        calls.append(fn)
        return original(fn, *args, **kwargs)

    monkeypatch.setattr(tensor, "_call", counting)
    return calls


def test_linear_reads_transposed_weight_inside_its_executable(view_reads):
    torch.manual_seed(0)
    x, w = torch.randn(8, 32), torch.randn(24, 32)
    dx, dw = x.to("tpu"), w.to("tpu")
    out = torch.nn.functional.linear(dx, dw)
    assert not view_reads, "a separate executable read the transposed weight"
    torch.testing.assert_close(out.cpu(), x @ w.t(), rtol=1e-5, atol=1e-5)


def test_op_input_describes_views():
    base = torch.arange(24.0).reshape(4, 6).to("tpu")
    array, view, offset = op_input(base, bake_offset=False)
    assert view is None and offset is None and array.shape == (4, 6)
    _, view, offset = op_input(base.t(), bake_offset=False)
    assert view == View((4, 6), (6, 4), (1, 6), 0) and offset is None
    _, view, offset = op_input(base[1], bake_offset=False)
    assert view == View((4, 6), (6,), None, None) and offset == 6  # traced in Strict
    _, view, offset = op_input(base[1], bake_offset=True)
    assert view == View((4, 6), (6,), None, 6) and offset is None  # a constant under DeferAndFuse


VIEWED_OPS = {
    "add_t": lambda a, b: a.t() + b,
    "mul_offset_row": lambda a, b: a[2] * b[0],
    "where_slices": lambda a, b: torch.where(a[:, ::2] > 0, a[:, ::2], b[:, 1::2]),
    "cat_views": lambda a, b: torch.cat([a[:, :3], b.t()[:, 2:5], a[1:2, 2:5]], dim=0),
    "matmul_transposes": lambda a, b: a.t() @ b,
    "expand_mul": lambda a, b: a[:1].expand(6, 6) * b,
    "unfold_gather": lambda a, b: a.flatten().unfold(0, 4, 2).sum(-1),
    "in_place_on_view": lambda a, b: a.t().mul_(b[0]),
}


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
@pytest.mark.parametrize("name", sorted(VIEWED_OPS))
def test_ops_on_views_match_cpu(name, mode):
    torch.manual_seed(1)
    a, b = torch.randn(6, 6), torch.randn(6, 6)
    fn = VIEWED_OPS[name]
    da, db = a.to("tpu"), b.to("tpu")
    if mode == "strict":
        out = fn(da, db)
    else:
        with torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
            out = fn(da, db)
    ref = fn(a, b)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(da.cpu(), a)  # in-place ops wrote through their views the same way


def test_changing_offsets_reuse_one_executable_in_strict():
    x = torch.randn(16, 8)
    dx = x.to("tpu")
    kernel = dispatch.OpKernel(torch.ops.aten.mul.Tensor, dispatch.TABLE[torch.ops.aten.mul.Tensor])
    for i in range(1, 12):
        row = kernel(dx[i], 2.0)
        torch.testing.assert_close(row.cpu(), x[i] * 2.0)
    assert len(kernel.cache) == 1, "each offset compiled its own executable"


def test_sdpa_on_transposed_heads_matches_cpu(view_reads):
    torch.manual_seed(2)
    q, k, v = (torch.randn(2, 5, 3, 8) for _ in range(3))  # (batch, seq, heads, dim): heads transposed

    def attend(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )

    out = attend(*(t.to("tpu") for t in (q, k, v)))
    assert not view_reads
    torch.testing.assert_close(out.cpu(), attend(q, k, v), rtol=1e-5, atol=1e-5)


def test_sdpa_on_views_under_defer_and_fuse_matches_cpu():
    torch.manual_seed(3)
    qkv = torch.randn(2, 6, 3 * 16)  # a fused projection, split into heads: views at three offsets

    def attend(qkv):
        q, k, v = (t.unflatten(-1, (2, 8)).transpose(1, 2) for t in qkv.split(16, dim=-1))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    with torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        out = attend(qkv.to("tpu"))
    torch.testing.assert_close(out.cpu(), attend(qkv), rtol=1e-5, atol=1e-5)
