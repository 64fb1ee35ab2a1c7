"""`torch.amp.GradScaler("tpu")`: the two fused ops it calls, with the math of PyTorch's CPU kernels.

`_amp_foreach_non_finite_check_and_unscale_` multiplies every gradient by `inv_scale` (in float32 for
half types) and sets `found_inf` to 1 when any gradient holds an inf or NaN; `_amp_update_scale_` backs
the scale off after an overflow, else grows it every `growth_interval` clean steps. Each runs as one
cached `jax.jit` over all the gradients, so the overflow check does not read anything on the host.
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp

from hf_tpu.runtime.launch import lazy
from hf_tpu.runtime.lowerings.elementwise import opmath
from hf_tpu.runtime.lowerings.table import lowers
from hf_tpu.runtime.tensors.tensor import to_jax_lazy, write

_lock = threading.Lock()
_unscale_cache: dict = {}
_update_cache: dict = {}


def _unscale_fn(n: int):
    def unscale(*flat):
        grads, found_inf, inv_scale = flat[:n], flat[n], flat[n + 1]
        any_bad = jnp.zeros((), dtype=bool)
        out = []
        for g in grads:
            ct = opmath(g.dtype)
            any_bad = any_bad | ~jnp.all(jnp.isfinite(g))
            out.append((g.astype(ct) * inv_scale.astype(ct).reshape(())).astype(g.dtype))
        out.append(jnp.where(any_bad, jnp.ones_like(found_inf), found_inf))
        return out

    return jax.jit(unscale)


@lowers("aten::_amp_foreach_non_finite_check_and_unscale_", kind="host")
def amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale) -> None:
    if not grads:
        return None
    arrays = [to_jax_lazy(g) for g in grads] + [to_jax_lazy(found_inf), to_jax_lazy(inv_scale)]
    key = tuple((tuple(a.shape), a.dtype) for a in arrays)
    fn = _unscale_cache.get(key)
    if fn is None:
        fn = _unscale_fn(len(grads))
        with _lock:
            _unscale_cache[key] = fn
    results = lazy.maybe_call(fn, tuple(arrays))
    for dest, value in zip((*grads, found_inf), results):
        write(dest, value)
    return None


def _update_fn(growth_factor: float, backoff_factor: float, growth_interval: int):
    def update(scale, growth_tracker, found_inf):
        overflow = found_inf.reshape(()) != 0
        grown = growth_tracker + 1
        due = grown == growth_interval
        bigger = scale * jnp.asarray(growth_factor, scale.dtype)
        new_scale = jnp.where(
            overflow,
            scale * jnp.asarray(backoff_factor, scale.dtype),
            jnp.where(due & jnp.isfinite(bigger), bigger, scale),
        )
        new_tracker = jnp.where(overflow | due, jnp.zeros_like(growth_tracker), grown)
        return new_scale, new_tracker

    return jax.jit(update)


@lowers("aten::_amp_update_scale_", kind="host")
def amp_update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    arrays = (to_jax_lazy(scale), to_jax_lazy(growth_tracker), to_jax_lazy(found_inf))
    key = (
        tuple((tuple(a.shape), a.dtype) for a in arrays),
        float(growth_factor),
        float(backoff_factor),
        int(growth_interval),
    )
    fn = _update_cache.get(key)
    if fn is None:
        fn = _update_fn(float(growth_factor), float(backoff_factor), int(growth_interval))
        with _lock:
            _update_cache[key] = fn
    new_scale, new_tracker = lazy.maybe_call(fn, arrays)
    write(scale, new_scale)
    write(growth_tracker, new_tracker)
    return scale
