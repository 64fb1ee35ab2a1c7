"""CTC loss (`F.ctc_loss`, what Wav2Vec2ForCTC/HuBERT train with): the forward (alpha) recursion in log
space over the blank-extended targets, batched with masks, as one `lax.scan` over time.

The backward differentiates that recursion (JAX's vjp) and adds PyTorch's `exp(log_probs)` term: PyTorch's
kernels return d loss / d logits for log_probs = log_softmax(logits), exp(lp) - exp(log_alpha + log_beta
+ nll - lp), rather than d loss / d log_probs; both give the same gradient through a log_softmax. Steps past
an input's length get no gradient; an infinite loss (no alignment) gets NaN gradients, as on CPU, or
zeros with `zero_infinity`.
Lengths given as tensors are read on the host first (they fix the shapes of the recursion).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from hf_tpu.runtime.lowerings.table import lowers

# "impossible" in log space: a finite stand-in for -inf, so the recursion's gradients stay finite
# (logaddexp of two -inf has a NaN gradient); values below _IMPOSSIBLE come back as -inf / an infinite loss
_NEG_INF = -1e30
_IMPOSSIBLE = -1e29


def _padded_targets(targets, target_lengths, max_len: int):
    """(batch, max_len) targets from 2-D padded or 1-D concatenated ones (zero-padded)."""
    if targets.ndim == 2:
        return targets[:, :max_len] if max_len else jnp.zeros((targets.shape[0], 0), targets.dtype)
    rows, start = [], 0
    for n in target_lengths:
        row = targets[start : start + n]
        rows.append(jnp.pad(row, (0, max_len - n)))
        start += n
    return jnp.stack(rows) if rows else jnp.zeros((0, max_len), targets.dtype)


def _alphas(log_probs, targets, input_lengths, target_lengths, blank: int):
    """(log_alpha (batch, T, 2S+1), nll (batch,)) in float32 (float64 for float64 inputs)."""
    ct = jnp.float64 if log_probs.dtype == jnp.float64 else jnp.float32
    lp = log_probs.astype(ct)  # (T, batch, C)
    steps, batch = lp.shape[0], lp.shape[1]
    max_target = max(target_lengths, default=0)
    width = 2 * max_target + 1
    tgt = _padded_targets(targets, target_lengths, max_target).astype(jnp.int32)
    ext = jnp.full((batch, width), blank, dtype=jnp.int32)  # blank, t1, blank, t2, ..., blank
    ext = ext.at[:, 1::2].set(tgt)
    t_len = jnp.asarray(target_lengths, dtype=jnp.int32).reshape(batch)
    in_len = jnp.asarray(input_lengths, dtype=jnp.int32).reshape(batch)
    s = jnp.arange(width)
    valid = s[None, :] < (2 * t_len[:, None] + 1)
    prev2 = jnp.concatenate([jnp.full((batch, 2), blank, jnp.int32), ext[:, :-2]], axis=1)
    skip = (ext != blank) & (ext != prev2) & (s[None, :] >= 2)
    emit = jnp.take_along_axis(lp, jnp.broadcast_to(ext[None], (steps, batch, width)), axis=2)  # (T, B, W)
    first = jnp.where((s[None, :] < 2) & valid, emit[0], _NEG_INF)

    def step(alpha, e):
        a1 = jnp.concatenate([jnp.full((batch, 1), _NEG_INF, ct), alpha[:, :-1]], axis=1)
        a2 = jnp.concatenate([jnp.full((batch, 2), _NEG_INF, ct), alpha[:, :-2]], axis=1)
        a2 = jnp.where(skip, a2, _NEG_INF)
        nxt = jnp.logaddexp(jnp.logaddexp(alpha, a1), a2) + e
        nxt = jnp.where(valid, nxt, _NEG_INF)
        return nxt, nxt

    _, rest = jax.lax.scan(step, first, emit[1:])
    log_alpha = jnp.concatenate([first[None], rest], axis=0).transpose(1, 0, 2)  # (B, T, W)
    last = jnp.take_along_axis(log_alpha, jnp.clip(in_len - 1, 0)[:, None, None], axis=1)[:, 0]  # (B, W)
    end = 2 * t_len
    final = jnp.take_along_axis(last, end[:, None], axis=1)[:, 0]
    before = jnp.where(
        t_len > 0, jnp.take_along_axis(last, jnp.clip(end - 1, 0)[:, None], axis=1)[:, 0], _NEG_INF
    )
    total = jnp.logaddexp(final, before)
    nll = jnp.where(total < _IMPOSSIBLE, jnp.inf, -total)
    return jnp.where(log_alpha < _IMPOSSIBLE, -jnp.inf, log_alpha), nll


@lowers("aten::_ctc_loss", static_scalars=True)
def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    log_alpha, nll = _alphas(log_probs, targets, list(input_lengths), list(target_lengths), blank)
    if zero_infinity:
        nll = jnp.where(jnp.isinf(nll), 0.0, nll)
    return nll.astype(log_probs.dtype), log_alpha.astype(log_probs.dtype)


@lowers("aten::_ctc_loss_backward", static_scalars=True)
def ctc_loss_backward(
    grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood, log_alpha, blank,
    zero_infinity=False,
):  # fmt: skip
    input_lengths, target_lengths = list(input_lengths), list(target_lengths)
    ct = jnp.float64 if log_probs.dtype == jnp.float64 else jnp.float32

    def nll_of(lp):
        return _alphas(lp, targets, input_lengths, target_lengths, blank)[1]

    nll, pullback = jax.vjp(nll_of, log_probs.astype(ct))
    g = grad.astype(ct).reshape(-1)
    finite = jnp.isfinite(nll)
    g_used = jnp.where(finite, g, 0.0)
    (d_lp,) = pullback(g_used)
    steps = log_probs.shape[0]
    active = jnp.arange(steps)[:, None] < jnp.asarray(input_lengths, jnp.int32)[None, :]  # (T, B)
    scale = jnp.where(active, g_used[None, :], 0.0)[..., None]
    out = d_lp + jnp.exp(log_probs.astype(ct)) * scale
    if zero_infinity:
        out = jnp.where(finite[None, :, None], out, 0.0)
    else:  # an impossible alignment: PyTorch's formula gives NaN at the input's steps
        out = jnp.where(finite[None, :, None] | ~active[..., None], out, jnp.nan)
    return out.astype(log_probs.dtype)


def _lists(*tensors):
    return [t.tolist() if isinstance(t, torch.Tensor) else list(t) for t in tensors]


@lowers("aten::_ctc_loss.Tensor", kind="host")
def ctc_loss_tensor_lengths(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    input_lengths, target_lengths = _lists(input_lengths, target_lengths)
    return torch.ops.aten._ctc_loss.default(
        log_probs, targets, input_lengths, target_lengths, blank, zero_infinity
    )


@lowers("aten::_ctc_loss_backward.Tensor", kind="host")
def ctc_loss_backward_tensor_lengths(
    grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood, log_alpha, blank,
    zero_infinity=False,
):  # fmt: skip
    input_lengths, target_lengths = _lists(input_lengths, target_lengths)
    return torch.ops.aten._ctc_loss_backward.default(
        grad,
        log_probs,
        targets,
        input_lengths,
        target_lengths,
        neg_log_likelihood,
        log_alpha,
        blank,
        zero_infinity,
    )
