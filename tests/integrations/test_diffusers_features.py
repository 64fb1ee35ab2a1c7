"""diffusers features beyond plain pipelines, on tpu against CPU."""

from __future__ import annotations

import pytest
import torch


def test_diffusers_flex_attention_backend_on_tpu_matches_cpu():
    """`set_attention_backend("flex")` runs `flex_attention` eagerly; PyTorch's device check refused tpu."""
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 16, 2, 8) for _ in range(3))  # (batch, sequence, heads, head_dim)
    expected = dispatch_attention_fn(q, k, v, backend="flex")
    got = dispatch_attention_fn(q.to("tpu"), k.to("tpu"), v.to("tpu"), backend="flex")
    assert got.device.type == "tpu"
    torch.testing.assert_close(got.cpu(), expected, atol=1e-5, rtol=1e-5)


def test_flex_attention_with_a_block_mask_on_tpu_matches_masked_sdpa_forward_and_backward():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch.manual_seed(0)
    q = torch.randn(1, 2, 16, 8)
    mask = create_block_mask(lambda b, h, i, j: i >= j, None, None, 16, 16, device="tpu")
    x = q.to("tpu").requires_grad_()
    out = flex_attention(x, x, x, block_mask=mask)
    out.sum().backward()
    ref_x = q.clone().requires_grad_()
    ref = torch.nn.functional.scaled_dot_product_attention(ref_x, ref_x, ref_x, is_causal=True)
    ref.sum().backward()
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(x.grad.cpu(), ref_x.grad, atol=1e-5, rtol=1e-5)


def test_flex_attention_still_refuses_what_pytorch_refuses():
    from torch.nn.attention.flex_attention import flex_attention

    q = torch.randn(1, 2, 16, 8, requires_grad=True)
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        flex_attention(q, q, q)
