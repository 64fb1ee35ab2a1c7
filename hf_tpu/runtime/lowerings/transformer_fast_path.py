"""The inference fast paths of `nn.MultiheadAttention` and `nn.TransformerEncoderLayer`.

In eval mode without autograd, both modules call a fused op (`_native_multi_head_attention`,
`_transformer_encoder_layer_fwd`) on CPU, CUDA and PrivateUse1 devices. Here each is the same math written
with torch ops on the tpu tensors (projection, scaled dot products, masked softmax, output projection;
layer norms and the feed-forward block), following PyTorch's CPU kernels: a query that is also the key
and value is projected with one matmul, masks are boolean (non-zero = masked; float masks from the
module are 0/-inf), a fully masked row attends to nothing (zeros, not NaN), and the weights come back
averaged over heads when asked. Nested-tensor inputs (TransformerEncoder's padding fast path) are not
supported.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from hf_tpu.runtime.lowerings.table import lowers


def _project(query, key, value, embed_dim, qkv_weight, qkv_bias):
    if query is key and key is value:
        return F.linear(query, qkv_weight, qkv_bias).chunk(3, dim=-1)
    w_q, w_k, w_v = qkv_weight.split(embed_dim, dim=0)
    b_q, b_k, b_v = qkv_bias.split(embed_dim, dim=0)
    return F.linear(query, w_q, b_q), F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)


def _masked(scores, mask, mask_type):
    """scores (B, H, L, S) with masked positions at -inf; mask_type 0: (L, S), 1: (B, S) key padding,
    2: (B, H, L, S) (or anything that broadcasts)."""
    if mask is None:
        return scores, None
    masked = mask if mask.dtype == torch.bool else mask != 0
    if mask_type == 1 or (mask_type is None and masked.dim() == 2 and masked.shape[0] == scores.shape[0]):
        masked = masked[:, None, None, :]
    masked = masked.expand(scores.shape)
    return scores.masked_fill(masked, float("-inf")), masked


@lowers("aten::_native_multi_head_attention", kind="host")
def native_multi_head_attention(
    query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias,
    mask=None, need_weights=True, average_attn_weights=True, mask_type=None,
):  # fmt: skip
    if query.is_nested:
        raise NotImplementedError(
            "hf_tpu: nested tensors are not supported on tpu (MultiheadAttention fast path)"
        )
    batch, tgt, _ = query.shape
    src = key.shape[1]
    head_dim = embed_dim // num_head
    q, k, v = _project(query, key, value, embed_dim, qkv_weight, qkv_bias)

    def heads(x, length):
        return x.reshape(batch, length, num_head, head_dim).transpose(1, 2)

    q, k, v = heads(q, tgt), heads(k, src), heads(v, src)
    scores = (q / math.sqrt(head_dim)) @ k.transpose(-2, -1)
    scores, masked = _masked(scores, mask, mask_type)
    weights = torch.softmax(scores, dim=-1)
    if masked is not None:  # a row with every key masked: zeros, as PyTorch's masked softmax
        weights = weights.masked_fill(masked.all(dim=-1, keepdim=True), 0.0)
    out = (weights @ v).transpose(1, 2).reshape(batch, tgt, embed_dim)
    out = F.linear(out, proj_weight, proj_bias)
    if not need_weights:
        return out, torch.empty(0, dtype=query.dtype, device=query.device)
    return out, weights.mean(dim=1) if average_attn_weights else weights


@lowers("aten::_transformer_encoder_layer_fwd", kind="host")
def transformer_encoder_layer_fwd(
    src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu, norm_first, eps,
    norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2,
    ffn_bias_2, mask=None, mask_type=None,
):  # fmt: skip
    if src.is_nested:
        raise NotImplementedError(
            "hf_tpu: nested tensors are not supported on tpu (TransformerEncoder's padding fast path); "
            "pass enable_nested_tensor=False to nn.TransformerEncoder"
        )
    shape = (embed_dim,)
    x = F.layer_norm(src, shape, norm_weight_1, norm_bias_1, eps) if norm_first else src
    attn, _ = native_multi_head_attention(
        x,
        x,
        x,
        embed_dim,
        num_heads,
        qkv_weight,
        qkv_bias,
        proj_weight,
        proj_bias,
        mask,
        False,
        True,
        mask_type,
    )
    x = src + attn
    if not norm_first:
        x = F.layer_norm(x, shape, norm_weight_1, norm_bias_1, eps)
    h = F.layer_norm(x, shape, norm_weight_2, norm_bias_2, eps) if norm_first else x
    h = F.linear(h, ffn_weight_1, ffn_bias_1)
    h = F.gelu(h) if use_gelu else F.relu(h)
    x = x + F.linear(h, ffn_weight_2, ffn_bias_2)
    if not norm_first:
        x = F.layer_norm(x, shape, norm_weight_2, norm_bias_2, eps)
    return x
