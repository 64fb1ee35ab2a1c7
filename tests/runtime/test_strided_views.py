"""Strided views read and written as boxes (slices + transposes) match CPU PyTorch exactly."""

from __future__ import annotations

import pytest
import torch

from hf_tpu.runtime.tensors.strided import box_plan

VIEWS = {
    "t": lambda x: x.flatten(1).t(),
    "transpose_1_2": lambda x: x.transpose(1, 2),
    "permute": lambda x: x.permute(2, 0, 1),
    "select_mid": lambda x: x[:, 1],
    "select_last": lambda x: x[..., 2],
    "narrow": lambda x: x.narrow(2, 1, 3),
    "slice_all_dims": lambda x: x[1:, 1:3, 2:],
    "step": lambda x: x[:, ::2, 1::2],
    "step_then_t": lambda x: x[::2].transpose(0, 2),
    "diagonal": lambda x: x.diagonal(dim1=1, dim2=2),
    "expand": lambda x: x[:, :1, :].expand(3, 4, 5),
    "unsqueeze_permute": lambda x: x.unsqueeze(1).permute(3, 1, 0, 2),
    "scalar_element": lambda x: x[2, 3, 4],
    "offset_tail": lambda x: x.flatten()[-7:],
    "unfold_overlapping": lambda x: x.flatten().unfold(0, 4, 2),
}
NOT_BOXES = {"unfold_overlapping", "diagonal"}  # strides 20 and 6 do not nest: a gather


def _base(dtype=torch.float32):
    return torch.arange(3 * 4 * 5, dtype=torch.float32).reshape(3, 4, 5).to(dtype)


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_read_matches_cpu(name):
    make = VIEWS[name]
    cpu = make(_base())
    dev = make(_base().to("tpu"))
    assert dev.shape == cpu.shape and dev.stride() == cpu.stride()
    torch.testing.assert_close(dev.cpu(), cpu, rtol=0, atol=0)
    torch.testing.assert_close((dev * 2 + 1).cpu(), cpu * 2 + 1, rtol=0, atol=0)
    plan = box_plan(tuple(cpu.shape), cpu.stride())
    assert (plan is None) == (name in NOT_BOXES)


@pytest.mark.parametrize("name", sorted(set(VIEWS) - {"expand", "unfold_overlapping"}))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_write_through_view_matches_cpu(name, dtype):
    make = VIEWS[name]
    cpu_base, dev_base = _base(dtype), _base(dtype).to("tpu")
    cpu_view, dev_view = make(cpu_base), make(dev_base)
    src = (torch.arange(cpu_view.numel(), dtype=torch.float32).reshape(cpu_view.shape) * -3).to(dtype)
    cpu_view.copy_(src)
    dev_view.copy_(src.to("tpu"))
    torch.testing.assert_close(dev_base.cpu(), cpu_base, rtol=0, atol=0)
    cpu_view.mul_(2)
    dev_view.mul_(2)
    torch.testing.assert_close(dev_base.cpu(), cpu_base, rtol=0, atol=0)


def test_views_under_defer_and_fuse_match_cpu():
    cpu_base, dev_base = _base(), _base().to("tpu")
    with torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        for name in ("t", "transpose_1_2", "step", "diagonal", "select_mid", "unfold_overlapping"):
            make = VIEWS[name]
            out = make(dev_base) + 1
            torch.testing.assert_close(out.cpu(), make(cpu_base) + 1, rtol=0, atol=0)
        dev_base[:, 1:3, ::2] = -1.0
        cpu_base[:, 1:3, ::2] = -1.0
        dev_base.transpose(0, 2)[1] *= 4
        cpu_base.transpose(0, 2)[1] *= 4
    torch.testing.assert_close(dev_base.cpu(), cpu_base, rtol=0, atol=0)


def test_linear_through_transposed_weight_matches_cpu():
    torch.manual_seed(0)
    x, w, b = torch.randn(6, 32), torch.randn(16, 32), torch.randn(16)
    out = torch.nn.functional.linear(x.to("tpu"), w.to("tpu"), b.to("tpu"))
    torch.testing.assert_close(out.cpu(), torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "shape,stride,is_box",
    [
        ((4, 4), (1, 4), True),  # transpose
        ((2, 3), (0, 1), True),  # expand
        ((3, 4), (1, 1), False),  # overlapping
        ((2, 2, 2), (2, 4, 1), True),  # interleaved order but nested
        ((3, 3), (2, 3), False),  # strides that do not nest
    ],
)
def test_box_plan_classifies_layouts(shape, stride, is_box):
    assert (box_plan(shape, stride) is not None) == is_box
    if is_box:
        assert box_plan(shape, stride, for_write=True) is None or 0 not in stride
