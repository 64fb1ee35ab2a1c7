"""Fused optimizer steps: `_fused_adam_`, `_fused_adamw_`, `_fused_sgd_`, `_fused_adagrad_` (`torch.optim.*(fused=True)`).

PyTorch lists PrivateUse1 among the devices with fused optimizer kernels, and transformers' Trainer
defaults to `adamw_torch_fused`. The whole step over every parameter is one `jax.jit` (cached per
shapes, dtypes and flags); hyperparameters and the per-parameter step counters are traced, so a learning
rate schedule does not recompile. Math follows PyTorch's CPU kernels: grads are unscaled by
`grad_scale` (and written back, as PyTorch does), a `found_inf` of 1 skips the step, AdamW decays the
parameter, Adam adds the decay to the gradient, half types compute in float32. The functional
overloads (`_fused_adamw`, ...) that aot_autograd emits are graph lowerings of the same math.
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import torch

from hf_tpu.runtime.launch import lazy
from hf_tpu.runtime.lowerings.elementwise import opmath
from hf_tpu.runtime.lowerings.table import lowers
from hf_tpu.runtime.tensors.tensor import to_jax_lazy, write


def _gradient(g, ct, grad_scale, maximize):
    """(the gradient the step uses, the unscaled gradient written back) in compute type `ct`."""
    g = g.astype(ct)
    if grad_scale is not None:
        g = g / grad_scale.astype(ct)
    return (-g if maximize else g), g


def _skip_if_inf(found_inf, new, old):
    if found_inf is None:
        return new
    return [jnp.where(found_inf == 1, o, n) for n, o in zip(new, old)]


def adam_math(
    params, grads, exp_avgs, exp_avg_sqs, max_sqs, steps, lr, beta1, beta2, weight_decay, eps,
    amsgrad, maximize, grad_scale, found_inf, decoupled, has_decay=True,
):  # fmt: skip
    """One Adam/AdamW step over lists of arrays; returns the five updated lists (PyTorch's order).

    `has_decay` is static (weight_decay may be traced): PyTorch skips the decay term when it is 0."""
    outs = ([], [], [], [], [])
    for i, (p, g, m, v) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs)):
        ct = opmath(p.dtype)
        pf, mf, vf = (x.astype(ct) for x in (p, m, v))
        gf, g_store = _gradient(g, ct, grad_scale, maximize)
        if has_decay:
            if decoupled:
                pf = pf * (1 - lr * weight_decay)
            else:
                gf = gf + weight_decay * pf
        mf = mf + (gf - mf) * (1 - beta1)
        vf = vf * beta2 + gf * gf * (1 - beta2)
        step = steps[i].astype(jnp.float64 if jax.config.jax_enable_x64 else jnp.float32)
        bias1 = 1 - beta1**step
        bias2_sqrt = jnp.sqrt(1 - beta2**step)
        step_size = (lr / bias1).astype(ct)
        if amsgrad:
            vmax = jnp.maximum(max_sqs[i].astype(ct), vf)
            denom = jnp.sqrt(vmax) / bias2_sqrt.astype(ct) + eps
            outs[4].append(vmax.astype(max_sqs[i].dtype))
        else:
            denom = jnp.sqrt(vf) / bias2_sqrt.astype(ct) + eps
            if max_sqs:
                outs[4].append(max_sqs[i])
        pf = pf - step_size * mf / denom
        outs[0].append(pf.astype(p.dtype))
        outs[1].append(g_store.astype(g.dtype))
        outs[2].append(mf.astype(m.dtype))
        outs[3].append(vf.astype(v.dtype))
    old = (params, grads, exp_avgs, exp_avg_sqs, max_sqs)
    return tuple(_skip_if_inf(found_inf, list(n), list(o)) for n, o in zip(outs, old))


def sgd_math(
    params, grads, bufs, weight_decay, momentum, lr, dampening, nesterov, maximize, is_first_step,
    grad_scale, found_inf, has_decay=True, has_momentum=True,
):  # fmt: skip
    """One SGD step over lists of arrays; returns (params, grads, momentum buffers).

    `has_decay`/`has_momentum` are static (the values may be traced): PyTorch branches on them."""
    outs = ([], [], [])
    for i, (p, g) in enumerate(zip(params, grads)):
        ct = opmath(p.dtype)
        pf = p.astype(ct)
        gf, g_store = _gradient(g, ct, grad_scale, maximize)
        if has_decay:
            gf = gf + weight_decay * pf
        if has_momentum:
            if is_first_step:
                buf = gf
            else:
                buf = bufs[i].astype(ct) * momentum + (1 - dampening) * gf
            gf = gf + momentum * buf if nesterov else buf
            outs[2].append(buf.astype(bufs[i].dtype))
        elif bufs:
            outs[2].append(bufs[i])
        pf = pf - lr * gf
        outs[0].append(pf.astype(p.dtype))
        outs[1].append(g_store.astype(g.dtype))
    old = (params, grads, bufs)
    return tuple(_skip_if_inf(found_inf, list(n), list(o)) for n, o in zip(outs, old))


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


_ADAM_FLOATS = ("beta1", "beta2", "weight_decay", "eps")
_SGD_FLOATS = ("weight_decay", "momentum", "dampening")
_ADAGRAD_FLOATS = ("lr_decay", "weight_decay", "eps")


def _eager_kernel(kind: str, decoupled: bool = False):
    """The in-place PrivateUse1 kernel of `_fused_{adam,adamw,sgd}_` (and their `.tensor_lr`)."""
    lock = threading.Lock()
    cache: dict = {}
    names = ("lr", *{"adam": _ADAM_FLOATS, "sgd": _SGD_FLOATS, "adagrad": _ADAGRAD_FLOATS}[kind])
    n_written = 5 if kind == "adam" else 3

    def kernel(params, grads, *lists, **kw):
        if not params:
            return None
        if kind == "adam":
            flags = (bool(kw["amsgrad"]), bool(kw["maximize"]))
        elif kind == "sgd":
            flags = (bool(kw["nesterov"]), bool(kw["maximize"]), bool(kw["is_first_step"]))
        else:
            flags = (bool(kw["maximize"]),)
        all_lists = [params, grads, *lists]
        grad_scale, found_inf = kw.get("grad_scale"), kw.get("found_inf")
        arrays = [[to_jax_lazy(t) for t in lst] for lst in all_lists]
        hyper = [to_jax_lazy(kw[n]) if isinstance(kw[n], torch.Tensor) else float(kw[n]) for n in names]
        extra = [None if t is None else to_jax_lazy(t) for t in (grad_scale, found_inf)]
        nonzero = tuple(_nonzero(kw[n]) for n in ("weight_decay", "momentum") if n in kw)
        lengths = tuple(len(lst) for lst in arrays)
        has_extra = tuple(e is not None for e in extra)
        key = (
            tuple(tuple((a.shape, a.dtype) for a in lst) for lst in arrays),
            tuple("f" if isinstance(h, float) else (h.shape, h.dtype) for h in hyper),
            has_extra,
            nonzero,
            flags,
        )
        fn = cache.get(key)
        if fn is None:
            fn = _compiled_step(kind, decoupled, flags, nonzero, lengths, len(hyper), has_extra)
            with lock:
                cache[key] = fn
        flat = [a for lst in arrays for a in lst] + hyper + [e for e in extra if e is not None]
        results = lazy.maybe_call(fn, tuple(flat))
        # grads change only when unscaled by grad_scale: otherwise they are not written
        written = [lst for i, lst in enumerate(all_lists[:n_written]) if i != 1 or grad_scale is not None]
        for dest, value in zip((t for lst in written for t in lst), results):
            write(dest, value)
        return None

    kernel.cache = cache  # one executable per (shapes, dtypes, flags): what tests check for recompiles
    return kernel


def _compiled_step(kind, decoupled, flags, nonzero, lengths, n_hyper, has_extra):
    write_grads = has_extra[0]

    def step(*flat):
        lists, pos = [], 0
        for n in lengths:
            lists.append(list(flat[pos : pos + n]))
            pos += n
        hyper = flat[pos : pos + n_hyper]
        pos += n_hyper
        extra = []
        for present in has_extra:
            extra.append(flat[pos] if present else None)
            pos += present
        out = _math(kind, decoupled, lists, hyper, flags, nonzero, extra)
        return [a for i, lst in enumerate(out) if i != 1 or write_grads for a in lst]

    return jax.jit(step)


def _math(kind, decoupled, lists, hyper, flags, nonzero, extra):
    grad_scale, found_inf = extra
    if kind == "adam":
        params, grads, exp_avgs, exp_avg_sqs, max_sqs, steps = lists
        lr, beta1, beta2, weight_decay, eps = hyper
        amsgrad, maximize = flags
        return adam_math(
            params, grads, exp_avgs, exp_avg_sqs, max_sqs, steps, lr, beta1, beta2, weight_decay, eps,
            amsgrad, maximize, grad_scale, found_inf, decoupled, nonzero[0],
        )  # fmt: skip
    if kind == "adagrad":
        params, grads, state_sums, steps = lists
        lr, lr_decay, weight_decay, eps = hyper
        (maximize,) = flags
        return adagrad_math(
            params, grads, state_sums, steps, lr, lr_decay, weight_decay, eps, maximize, grad_scale,
            found_inf, nonzero[0],
        )  # fmt: skip
    params, grads, bufs = lists
    lr, weight_decay, momentum, dampening = hyper
    nesterov, maximize, is_first_step = flags
    return sgd_math(
        params, grads, bufs, weight_decay, momentum, lr, dampening, nesterov, maximize, is_first_step,
        grad_scale, found_inf, nonzero[0], nonzero[1],
    )  # fmt: skip


class _FunctionalStep:
    """Graph lowering of a functional `_fused_*` overload: the updated lists. (PyTorch keeps Dynamo out of
    fused optimizers, so `torch.compile` runs them with the eager kernel above; this serves exported or
    hand-built graphs that hold the functional op.)"""

    def __init__(self, kind: str, decoupled: bool = False) -> None:
        self.kind, self.decoupled = kind, decoupled

    def __call__(self, params, grads, *rest):
        n_lists = 4 if self.kind == "adam" else 1
        lists = [list(params), list(grads), *[list(x) for x in rest[:n_lists]]]
        if self.kind == "adam":
            lr, beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale, found_inf = rest[n_lists:]
            hyper = (lr, beta1, beta2, weight_decay, eps)
            flags = (amsgrad, maximize)
            nonzero = (_nonzero(weight_decay),)
        else:
            (
                weight_decay,
                momentum,
                lr,
                dampening,
                nesterov,
                maximize,
                is_first_step,
                grad_scale,
                found_inf,
            ) = rest[n_lists:]
            hyper = (lr, weight_decay, momentum, dampening)
            flags = (nesterov, maximize, is_first_step)
            nonzero = (_nonzero(weight_decay), _nonzero(momentum))
        return [
            list(x)
            for x in _math(self.kind, self.decoupled, lists, hyper, flags, nonzero, [grad_scale, found_inf])
        ]


def _nonzero(value) -> bool:
    """Whether a decay/momentum term is present (a tensor or traced value may be anything)."""
    return not isinstance(value, int | float) or value != 0


for _name, _kind, _decoupled in (("adam", "adam", False), ("adamw", "adam", True), ("sgd", "sgd", False)):
    lowers(f"aten::_fused_{_name}_.default", f"aten::_fused_{_name}_.tensor_lr", kind="host")(
        _eager_kernel(_kind, _decoupled)
    )
    lowers(f"aten::_fused_{_name}.default", f"aten::_fused_{_name}.tensor_lr", graph=True)(
        _FunctionalStep(_kind, _decoupled)
    )


lowers("aten::_fused_adagrad_.default", "aten::_fused_adagrad_.tensor_lr", kind="host")(
    _eager_kernel("adagrad")
)


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
