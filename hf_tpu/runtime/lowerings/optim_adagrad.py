"""The fused Adagrad step: `_fused_adagrad_` (`torch.optim.Adagrad(fused=True)`).

Same scheme as the fused Adam/SGD steps in `optim.py`: the whole step over every parameter is one
`jax.jit`, cached per shapes, dtypes and flags, with lr, lr_decay, weight_decay, eps and the step counters
traced. Math follows PyTorch's Adagrad: the gradient is unscaled by `grad_scale` (and written back),
negated for `maximize`, gets `weight_decay * param` added; then
    clr = lr / (1 + (step - 1) * lr_decay);  state_sum += g * g;  param -= clr * g / (sqrt(state_sum) + eps)
and a `found_inf` of 1 skips the step. Half types compute in float32. The functional `_fused_adagrad`
(what aot_autograd emits) is a graph lowering of the same math.
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import torch

from hf_tpu.runtime import lazy
from hf_tpu.runtime.lowering_table import lowers
from hf_tpu.runtime.lowerings.elementwise import opmath
from hf_tpu.runtime.lowerings.optim import _gradient, _nonzero, _skip_if_inf
from hf_tpu.runtime.tensor import to_jax_lazy, write

_HYPER = ("lr", "lr_decay", "weight_decay", "eps")


def adagrad_math(
    params, grads, state_sums, steps, lr, lr_decay, weight_decay, eps, maximize, grad_scale, found_inf,
    has_decay=True,
):  # fmt: skip
    """One Adagrad step over lists of arrays; returns (params, grads, state_sums).

    `has_decay` is static (weight_decay may be traced): PyTorch skips the decay term when it is 0."""
    outs = ([], [], [])
    step_dtype = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    for p, g, s, step in zip(params, grads, state_sums, steps):
        ct = opmath(p.dtype)
        pf, sf = p.astype(ct), s.astype(ct)
        gf, g_store = _gradient(g, ct, grad_scale, maximize)
        if has_decay:
            gf = gf + weight_decay * pf
        clr = (lr / (1 + (step.astype(step_dtype) - 1) * lr_decay)).astype(ct)
        sf = sf + gf * gf
        std = jnp.sqrt(sf) + eps
        pf = pf - clr * (gf / std)
        outs[0].append(pf.astype(p.dtype))
        outs[1].append(g_store.astype(g.dtype))
        outs[2].append(sf.astype(s.dtype))
    old = (params, grads, state_sums)
    return tuple(_skip_if_inf(found_inf, list(n), list(o)) for n, o in zip(outs, old))


def _compiled_step(lengths: tuple, maximize: bool, has_decay: bool, has_extra: tuple):
    """One jitted step over flat arguments: the four lists, the hyperparameters, grad_scale/found_inf."""
    write_grads = has_extra[0]

    def step(*flat):
        lists, pos = [], 0
        for n in lengths:
            lists.append(list(flat[pos : pos + n]))
            pos += n
        hyper = flat[pos : pos + len(_HYPER)]
        pos += len(_HYPER)
        extra = []
        for present in has_extra:
            extra.append(flat[pos] if present else None)
            pos += present
        params, grads, sums, steps = lists
        out = adagrad_math(params, grads, sums, steps, *hyper, maximize, *extra, has_decay)
        return [a for i, lst in enumerate(out) if i != 1 or write_grads for a in lst]

    return jax.jit(step)


def _eager_kernel():
    """The in-place PrivateUse1 kernel of `_fused_adagrad_` (and `.tensor_lr`)."""
    lock = threading.Lock()
    cache: dict = {}

    def kernel(params, grads, state_sums, state_steps, **kw):
        if not params:
            return None
        maximize = bool(kw["maximize"])
        grad_scale, found_inf = kw.get("grad_scale"), kw.get("found_inf")
        lists = [[to_jax_lazy(t) for t in lst] for lst in (params, grads, state_sums, state_steps)]
        hyper = [to_jax_lazy(kw[n]) if isinstance(kw[n], torch.Tensor) else float(kw[n]) for n in _HYPER]
        extra = [None if t is None else to_jax_lazy(t) for t in (grad_scale, found_inf)]
        has_decay = _nonzero(kw["weight_decay"])
        has_extra = tuple(e is not None for e in extra)
        key = (
            tuple(tuple((a.shape, a.dtype) for a in lst) for lst in lists),
            tuple("f" if isinstance(h, float) else (h.shape, h.dtype) for h in hyper),
            has_extra,
            has_decay,
            maximize,
        )
        fn = cache.get(key)
        if fn is None:
            fn = _compiled_step(tuple(len(lst) for lst in lists), maximize, has_decay, has_extra)
            with lock:
                cache[key] = fn
        flat = [a for lst in lists for a in lst] + hyper + [e for e in extra if e is not None]
        results = lazy.maybe_call(fn, tuple(flat))
        written = [params, state_sums] if grad_scale is None else [params, grads, state_sums]
        for dest, value in zip((t for lst in written for t in lst), results):
            write(dest, value)
        return None

    kernel.cache = cache
    return kernel


_eager = _eager_kernel()
lowers("aten::_fused_adagrad_.default", "aten::_fused_adagrad_.tensor_lr", kind="host")(_eager)


@lowers("aten::_fused_adagrad.default", "aten::_fused_adagrad.tensor_lr", graph=True)
def fused_adagrad(
    params, grads, state_sums, state_steps, lr, lr_decay, weight_decay, eps, maximize, grad_scale=None,
    found_inf=None,
):  # fmt: skip
    """The functional step inside traced graphs: (params, grads, state_sums, state_steps) updated."""
    p, g, s = adagrad_math(
        list(params), list(grads), list(state_sums), list(state_steps), lr, lr_decay, weight_decay, eps,
        maximize, grad_scale, found_inf, _nonzero(weight_decay),
    )  # fmt: skip
    return [p, g, s, list(state_steps)]
