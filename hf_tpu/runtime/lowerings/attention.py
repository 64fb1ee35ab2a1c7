"""Scaled dot-product attention that arrives whole on tpu, forward and backward.

PyTorch picks an SDPA backend through a C++ DispatchStub (`_fused_sdp_choice_stub`) that only C++ can
fill for PrivateUse1, so a Python `_fused_sdp_choice` kernel is never consulted by
`F.scaled_dot_product_attention` and the call would decompose into the slow math path (a dozen ops,
bf16 softmax). Instead we give the composite op `aten::scaled_dot_product_attention` tpu kernels
(PrivateUse1 and AutogradPrivateUse1) that call `aten::_scaled_dot_product_fused_attention_overrideable`
— the entry PyTorch reserves for out-of-tree backends, whose derivative formula calls
`..._overrideable_backward`. Both are lowered here as one fused JAX computation each, in float32 for
bf16/fp16 inputs. `_fused_sdp_choice` still answers OVERRIDEABLE for callers that ask the op.

Dropout draws its mask's seed from the device generator; the seed/offset it used are returned in the
`philox_seed`/`philox_offset` slots so the backward regenerates the same mask.
"""

from __future__ import annotations

import math
from functools import cache

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch.nn.attention import SDPBackend

from hf_tpu.runtime import arg_checks
from hf_tpu.runtime.buffers import placement, platform
from hf_tpu.runtime.launch import lazy, rng
from hf_tpu.runtime.lowerings.linalg import operands, precision
from hf_tpu.runtime.lowerings.table import lowers
from hf_tpu.runtime.tensors.strided import inverse_order, memory_order
from hf_tpu.runtime.tensors.tensor import op_inputs, read_input, wrap

_HALF = (jnp.bfloat16, jnp.float16)


def _repeat_kv(q, k, v):
    """Grouped-query attention: each group of query heads shares one key/value head."""
    if q.ndim < 3 or k.shape[-3] == q.shape[-3]:
        return k, v
    groups = q.shape[-3] // k.shape[-3]
    return jnp.repeat(k, groups, axis=-3), jnp.repeat(v, groups, axis=-3)


def _scores(q, k, bias, is_causal, scale, row0=0):
    """Scaled, masked logits in float32 (or float64): (..., L, S); query row i is row `row0 + i`."""
    acc = jnp.float32 if q.dtype in _HALF else q.dtype
    qa, ka = operands(q, k)
    s = jnp.einsum("...le,...se->...ls", qa, ka, precision=precision(), preferred_element_type=acc)
    s = s * jnp.asarray(scale, acc)
    if is_causal:  # top-left aligned, as PyTorch's tril(ones(L, S))
        lq, lk = s.shape[-2], s.shape[-1]
        keep = (row0 + jnp.arange(lq))[:, None] >= jnp.arange(lk)[None, :]
        s = jnp.where(keep, s, -jnp.inf)
    if bias is not None:
        s = jnp.where(bias, s, -jnp.inf) if bias.dtype == jnp.bool_ else s + bias.astype(acc)
    return s


# Long sequences on the CPU platform: queries in blocks whose (block, S) logits fit ~8 MB, one block at a
# time (`lax.map`), so the softmax works in cache instead of streaming an (L, S) matrix through memory
# several times. Same math and bit-identical results; 2,4x1024x1024 attention: 25 ms -> 3.6 ms (torch
# CPU: 5.3 ms). Not used with dropout (its mask is drawn over the whole matrix) nor on TPU/GPU, where
# it was not measured.
_BLOCKED_MIN_BYTES = 16 << 20
_BLOCK_TARGET_BYTES = 8 << 20


def _row_block(q, k, dropout_p) -> int | None:
    """Rows per block for blocked attention, or None for the one-shot path."""
    if dropout_p > 0 or q.ndim < 2 or platform.platform_name() != "cpu":
        return None
    rows, keys = q.shape[-2], k.shape[-2]
    batch = math.prod(q.shape[:-2])
    logits_bytes = batch * rows * keys * 4
    if logits_bytes < _BLOCKED_MIN_BYTES:
        return None
    block = 1 << max(4, int(math.log2(max(1, _BLOCK_TARGET_BYTES // (batch * keys * 4)))))
    while block >= 16 and rows % block:
        block //= 2
    return block if 16 <= block < rows else None


def _attention(q, k, v, bias, dropout_key, dropout_p, is_causal, scale):
    """(output in the input dtype, logsumexp in float32); rows with every key masked give 0."""
    k, v = _repeat_kv(q, k, v)
    block = _row_block(q, k, dropout_p if dropout_key is not None else 0.0)
    if block is not None:
        return _blocked_attention(q, k, v, bias, is_causal, scale, block)
    return _attend(q, k, v, bias, dropout_key, dropout_p, is_causal, scale)


def _blocked_attention(q, k, v, bias, is_causal, scale, block):
    rows = q.shape[-2]
    per_row_bias = bias is not None and bias.ndim >= 2 and bias.shape[-2] == rows and rows > 1

    def one(i):
        start = i * block
        qb = jax.lax.dynamic_slice_in_dim(q, start, block, axis=q.ndim - 2)
        bb = jax.lax.dynamic_slice_in_dim(bias, start, block, axis=bias.ndim - 2) if per_row_bias else bias
        return _attend(qb, k, v, bb, None, 0.0, is_causal, scale, row0=start)

    outs, lses = jax.lax.map(one, jnp.arange(rows // block))
    out = jnp.moveaxis(outs, 0, -3).reshape(q.shape[:-2] + (rows, v.shape[-1]))
    lse = jnp.moveaxis(lses, 0, -2).reshape(q.shape[:-2] + (rows,))
    return out, lse


def _attend(q, k, v, bias, dropout_key, dropout_p, is_causal, scale, row0=0):
    """Attention of these query rows (the first one being row `row0` of the whole matrix)."""
    s = _scores(q, k, bias, is_causal, scale, row0)
    row_max = jnp.max(s, axis=-1, keepdims=True)
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0)
    e = jnp.exp(s - row_max)
    total = jnp.sum(e, axis=-1, keepdims=True)
    probs = jnp.where(total > 0, e / jnp.where(total > 0, total, 1), 0)
    lse = (jnp.log(total) + row_max)[..., 0]
    if dropout_key is not None and dropout_p > 0:
        keep = jax.random.bernoulli(dropout_key, 1.0 - dropout_p, probs.shape)
        probs = jnp.where(keep, probs / (1.0 - dropout_p), 0)
    pa, va = operands(probs.astype(v.dtype) if v.dtype in _HALF else probs, v)
    out = jnp.einsum("...ls,...se->...le", pa, va, precision=precision(), preferred_element_type=probs.dtype)
    return out.astype(q.dtype), lse.astype(jnp.float32)


def _dropout_key(seed, offset):
    """The dropout mask's key: RBG (the TPU's hardware generator; compiles ~5x faster than threefry)."""
    return jax.random.fold_in(jax.random.key(seed, impl="rbg"), offset)


def _default_scale(q, scale):
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale


@jax.jit
def _draw_seed(rng_key):
    """A dropout seed/offset pair from the device generator, kept on device (no host sync)."""
    bits = jax.random.bits(rng_key, (2,), jnp.uint32).astype(jnp.int64)
    return bits[0], bits[1]


@cache
def _no_seed():
    """The (seed, offset) slots without dropout: two shared zeros (arrays are immutable; a write into
    the returned tensors replaces their storage's array, never this one)."""
    zero = placement.numpy_to_jax(np.zeros((), np.int64))
    return zero, zero


@cache
def _forward_fn(dropout_p: float, is_causal: bool, scale: float, views: tuple, layout: tuple | None = None):
    """One jitted attention per static configuration and input layout (a stable function identity
    for DeferAndFuse). `views`: per input (q, k, v[, bias]), None or the `View` read inside, so the
    heads' `transpose(1, 2)` fuses into the attention instead of running as its own executable.
    `layout`: the output's dims in memory order when it is not row-major (`_output_layout`)."""

    def run(seed, offset, *leaves):
        it = iter(leaves)
        q, k, v, *bias = (read_input(jax, view, it) for view in views)
        key = _dropout_key(seed, offset) if dropout_p > 0 else None
        out, lse = _attention(q, k, v, bias[0] if bias else None, key, dropout_p, is_causal, scale)
        return (out if layout is None else jnp.transpose(out, layout)), lse

    return jax.jit(run)


@cache
def _output_layout(shape: tuple, stride: tuple) -> tuple | None:
    """The attention output's memory order as PyTorch lays it out (its meta kernel follows the query's
    layout: a (B, S, H, D) buffer viewed as (B, H, S, D) when the heads were transposed out of the
    sequence), or None when row-major. Matching it keeps strides what traced graphs assume (they `view`
    the output after `transpose(1, 2)`), and makes that transpose free."""
    meta = torch.empty_strided(shape, stride, device="meta")
    out = torch.ops.aten._scaled_dot_product_fused_attention_overrideable(meta, meta, meta)[0]
    return memory_order(tuple(out.shape), out.stride())


@lowers("aten::_fused_sdp_choice", kind="host")
def _fused_sdp_choice(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False
):
    # the fused kernel's schema takes (B, S, D) or (B, H, S, D); other ranks take the math path, as on CPU
    if query.dim() not in (3, 4):
        return int(SDPBackend.MATH)
    return int(SDPBackend.OVERRIDEABLE)


@lowers("aten::_scaled_dot_product_fused_attention_overrideable", kind="host")
def _scaled_dot_product_fused_attention_overrideable(
    query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None
):
    """Host kind: the schema returns Python ints (max_q, max_k) and undefined tensors next to arrays.

    The computation itself goes through `lazy.maybe_call`, so under DeferAndFuse it is recorded rather
    than forcing a flush.
    """
    seed, offset = _draw_seed(rng.next_key()) if dropout_p > 0 else _no_seed()
    tensors = (query, key, value) if attn_bias is None else (query, key, value, attn_bias)
    leaves, views = op_inputs(tensors, lazy.enabled())
    layout = _output_layout(tuple(query.shape), query.stride())
    fn = _forward_fn(float(dropout_p), bool(is_causal), float(_default_scale(query, scale)), views, layout)
    out, lse = lazy.maybe_call(fn, (seed, offset, *leaves))
    philox_seed, philox_offset = wrap(seed, torch.int64), wrap(offset, torch.int64)
    lq, lk = query.shape[-2], key.shape[-2]
    out = wrap(out, query.dtype)
    return (
        out if layout is None else out.permute(inverse_order(layout)),
        wrap(lse, torch.float32),
        None,
        None,
        lq,
        lk,
        philox_seed,
        philox_offset,
        None,
    )


@lowers("aten::_scaled_dot_product_fused_attention_overrideable", graph=True, random=True)
def _overrideable_graph(
    rng_key,
    query,
    key,
    value,
    attn_bias=None,
    dropout_p=0.0,
    is_causal=False,
    return_debug_mask=False,
    scale=None,
):
    """Inside traced graphs: the same computation, the dropout seed drawn from the graph's key."""
    seed, offset = _draw_seed(rng_key) if dropout_p > 0 else (jnp.int64(0), jnp.int64(0))
    key_ = _dropout_key(seed, offset) if dropout_p > 0 else None
    out, lse = _attention(
        query, key, value, attn_bias, key_, dropout_p, is_causal, _default_scale(query, scale)
    )
    return out, lse, None, None, query.shape[-2], key.shape[-2], seed, offset, None


@lowers("aten::_scaled_dot_product_fused_attention_overrideable_backward")
def _scaled_dot_product_fused_attention_overrideable_backward(
    grad_out,
    query,
    key,
    value,
    attn_bias,
    grad_input_mask,
    out,
    logsumexp,
    cum_seq_q,
    cum_seq_k,
    max_q,
    max_k,
    dropout_p,
    is_causal,
    philox_seed,
    philox_offset,
    scale=None,
):
    """Gradients by differentiating the forward (recomputed, as flash attention does)."""
    scale = _default_scale(query, scale)
    dkey = _dropout_key(philox_seed, philox_offset) if dropout_p > 0 else None
    float_bias = attn_bias is not None and attn_bias.dtype != jnp.bool_
    want_bias = float_bias and grad_input_mask[3]

    def fn(q, k, v, b):
        return _attention(q, k, v, b if want_bias else attn_bias, dkey, dropout_p, is_causal, scale)[0]

    primal_bias = attn_bias if want_bias else jnp.zeros(())
    _, vjp = jax.vjp(fn, query, key, value, primal_bias)
    gq, gk, gv, gb = vjp(grad_out.astype(query.dtype))
    # PyTorch's meta kernel always defines the q/k/v grads, and the bias grad whenever a bias was given
    if attn_bias is not None and not want_bias:
        gb = jnp.zeros(attn_bias.shape, attn_bias.dtype)
    return gq, gk, gv, gb if attn_bias is not None else None


# -- routing F.scaled_dot_product_attention to the overrideable entry --------------------------------
def _check_heads(query, key, value, enable_gqa):
    if query.dim() < 3:
        return
    hq, hk, hv = query.shape[-3], key.shape[-3], value.shape[-3]
    if hq == hk == hv:
        return
    if hk == hv == 1:
        return  # a single key/value head broadcasts over the query heads, as on CPU (multi-query attention)
    if not enable_gqa or hk != hv or hq % hk != 0:
        raise RuntimeError(
            "scaled_dot_product_attention: query heads must equal key/value heads, or be a multiple of them "
            f"with enable_gqa=True (got query {hq}, key {hk}, value {hv} heads, enable_gqa={enable_gqa})"
        )


def scaled_dot_product_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False
):
    """The tpu kernel of `F.scaled_dot_product_attention`: one fused op (with autograd) instead of ~12."""
    checks = arg_checks.for_op(torch.ops.aten.scaled_dot_product_attention.default)
    if checks is not None:  # a host kernel: CPU's argument checks run here, not in an OpKernel
        for check in checks[0]:
            check(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if is_causal and attn_mask is not None:
        raise RuntimeError(
            "_scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True"
        )
    if not 0.0 <= dropout_p <= 1.0:
        raise RuntimeError(f"scaled_dot_product_attention: dropout_p must be in [0, 1], got {dropout_p}")
    if query.dim() not in (
        3,
        4,
    ):  # the fused kernel's schema takes (B, S, D) or (B, H, S, D): CPU's math path
        return torch.ops.aten._scaled_dot_product_attention_math(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
        )[0]
    _check_heads(query, key, value, enable_gqa)
    out = torch.ops.aten._scaled_dot_product_fused_attention_overrideable(
        query, key, value, attn_mask, dropout_p, is_causal, False, scale=scale
    )
    return out[0]


def graph_decomposition(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False
):
    """`aten::scaled_dot_product_attention` met by graph tracing below autograd (the body of a compiled
    scan, while_loop or map: the kernels above are not consulted there) is the tpu kernel's one fused op,
    not CPU's math path, which materializes the whole (L, S) matrix (a whole-loop UNet's 2x8x1024x1024
    softmax: ~44 ms a step, where the blocked attention takes a few). Other devices: torch's own."""
    if query.device.type != "tpu":
        return NotImplemented
    return scaled_dot_product_attention(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
    )


_library = None


def register_sdpa_kernels() -> None:
    """Give `aten::scaled_dot_product_attention` tpu kernels (idempotent).

    Both keys are needed: a backend kernel on a composite op hides the composite from that backend's
    autograd key too, and our autograd kernel relies on the overrideable op's derivative formula.
    """
    global _library
    if _library is not None:
        return
    lib = torch.library.Library("aten", "IMPL")
    for key in ("PrivateUse1", "AutogradPrivateUse1"):
        lib.impl("scaled_dot_product_attention", scaled_dot_product_attention, key)
    _library = lib


register_sdpa_kernels()
