"""Counting distributions drawn from the device PRNG: `poisson` and `binomial`
(`torch.distributions.Poisson/Binomial.sample()`).

Like every device random op they draw other numbers than CPU PyTorch (other generator, other sampling
algorithm: JAX's Knuth / transformed-rejection and BTRS samplers), with the same distribution and the
same edge cases as ATen's CPU samplers: rate 0 gives 0; binomial gives 0 for count <= 0 or p <= 0 and
`count` for p >= 1. Half types draw in float32. CPU raises on a negative Poisson rate; a traced kernel
cannot raise on values, so a negative rate gives NaN instead.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hf_tpu.runtime.lowerings.random import _check_generator_free, _compute_dtype
from hf_tpu.runtime.lowerings.table import lowers


def _count_dtype():
    return jnp.int64 if jax.config.jax_enable_x64 else jnp.int32


@lowers("aten::poisson", random=True)
def poisson(key, rates, generator=None):
    """Poisson(rate) counts in the rates' shape and dtype."""
    _check_generator_free(generator)
    if not jnp.issubdtype(rates.dtype, jnp.floating):
        raise RuntimeError(f'"poisson_cpu" not implemented for {rates.dtype}')
    ct = _compute_dtype(rates.dtype)
    lam = rates.astype(ct)
    safe = jnp.where(lam > 0, lam, 0)  # jax's sampler wants lam >= 0
    draws = jax.random.poisson(key, safe, rates.shape, dtype=_count_dtype()).astype(ct)
    draws = jnp.where(lam >= 0, draws, jnp.nan)
    return draws.astype(rates.dtype)


@lowers("aten::binomial", random=True)
def binomial(key, count, prob, generator=None):
    """Binomial(count, prob) successes, count and prob broadcast together, in count's dtype."""
    _check_generator_free(generator)
    if not jnp.issubdtype(count.dtype, jnp.floating):
        raise RuntimeError(f"binomial only supports floating-point dtypes for count, got: {count.dtype}")
    shape = jnp.broadcast_shapes(count.shape, prob.shape)
    ct = _compute_dtype(count.dtype)
    n = jnp.broadcast_to(count.astype(ct), shape)
    p = jnp.broadcast_to(prob.astype(ct), shape)
    valid = (n > 0) & (p > 0) & (p < 1)
    draws = jax.random.binomial(key, jnp.where(valid, n, 1), jnp.where(valid, p, 0.5), shape, dtype=ct)
    draws = jnp.where(valid, draws, jnp.where((n > 0) & (p >= 1), n, 0))
    draws = jnp.where(jnp.isnan(p) | jnp.isnan(n), jnp.nan, draws)
    return draws.astype(count.dtype)
