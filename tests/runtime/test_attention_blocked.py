"""Long-sequence attention runs in query blocks on the CPU platform and still matches PyTorch."""

from __future__ import annotations

import jax.numpy as jnp
import pytest
import torch
import torch.nn.functional as F

from hf_tpu.runtime.lowerings import attention

# (batch, heads, 1024 queries, 1024 keys) float32 logits = 16 MiB: the blocked path's threshold
B, H, L, E = 2, 2, 1024, 8


def _qkv(dtype=torch.float32, kv_heads=H, keys=L):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, L, E, generator=g).to(dtype)
    k = torch.randn(B, kv_heads, keys, E, generator=g).to(dtype)
    v = torch.randn(B, kv_heads, keys, E, generator=g).to(dtype)
    return q, k, v


def test_long_attention_takes_the_blocked_path():
    q = jnp.zeros((B, H, L, E))
    assert attention._row_block(q, q, 0.0) == 512
    assert attention._row_block(q, q, 0.1) is None  # dropout: one shot
    assert attention._row_block(jnp.zeros((B, H, 64, E)), jnp.zeros((B, H, 64, E)), 0.0) is None


@pytest.mark.parametrize(
    "case",
    ["plain", "causal", "bool_mask_per_row", "float_bias_broadcast", "gqa", "fewer_keys_causal"],
)
def test_blocked_attention_matches_cpu(case):
    kwargs = {}
    q, k, v = _qkv()
    if case == "causal":
        kwargs["is_causal"] = True
    elif case == "bool_mask_per_row":
        kwargs["attn_mask"] = torch.rand(L, L, generator=torch.Generator().manual_seed(1)) > 0.3
    elif case == "float_bias_broadcast":
        kwargs["attn_mask"] = torch.randn(B, 1, 1, L, generator=torch.Generator().manual_seed(2))
    elif case == "gqa":
        q = torch.cat([q, q], dim=1)  # 4 query heads over 2 key/value heads
        kwargs["enable_gqa"] = True
    elif case == "fewer_keys_causal":
        q, k, v = _qkv(keys=L // 2)
        q = torch.cat([q, q], dim=0)  # keep the logits at 16 MiB
        k, v = torch.cat([k, k], dim=0), torch.cat([v, v], dim=0)
        kwargs["is_causal"] = True
    want = F.scaled_dot_product_attention(q, k, v, **kwargs)
    dev_kwargs = {n: (t.to("tpu") if isinstance(t, torch.Tensor) else t) for n, t in kwargs.items()}
    got = F.scaled_dot_product_attention(q.to("tpu"), k.to("tpu"), v.to("tpu"), **dev_kwargs)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


def test_blocked_attention_backward_matches_cpu():
    q, k, v = _qkv()
    leaves_cpu = [t.clone().requires_grad_() for t in (q, k, v)]
    leaves_dev = [t.to("tpu").requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*leaves_cpu, is_causal=True).square().sum().backward()
    F.scaled_dot_product_attention(*leaves_dev, is_causal=True).square().sum().backward()
    for c, d in zip(leaves_cpu, leaves_dev):
        torch.testing.assert_close(d.grad.cpu(), c.grad, rtol=1e-4, atol=1e-4)


def test_blocked_attention_in_bf16_matches_cpu():
    q, k, v = _qkv(torch.bfloat16)
    want = F.scaled_dot_product_attention(q, k, v).float()
    got = F.scaled_dot_product_attention(q.to("tpu"), k.to("tpu"), v.to("tpu")).cpu().float()
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_output_is_laid_out_like_the_query_as_on_cpu():
    """Heads transposed out of the sequence dim give an output PyTorch lays out (B, S, H, D) in memory:
    code (and traced graphs) may then `view` it after `transpose(1, 2)`, which needs those strides."""
    q = torch.randn(2, 16, 4, 8).transpose(1, 2)  # (B, H, S, D) view of a (B, S, H, D) buffer
    k, v = torch.randn_like(q), torch.randn_like(q)
    want = F.scaled_dot_product_attention(q, k, v)
    got = F.scaled_dot_product_attention(q.to("tpu"), k.to("tpu"), v.to("tpu"))
    assert got.stride() == want.stride()
    merged = got.transpose(1, 2).view(2, 16, 32)  # a view on CPU; raises for a row-major output
    torch.testing.assert_close(merged.cpu(), want.transpose(1, 2).reshape(2, 16, 32), rtol=1e-5, atol=1e-5)
    row_major = F.scaled_dot_product_attention(q.contiguous().to("tpu"), k.to("tpu"), v.to("tpu"))
    assert row_major.is_contiguous()
