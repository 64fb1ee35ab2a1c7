"""Activation checkpointing's RNG wrappers in compiled graphs and op by op.

aot_autograd (`functionalize_rng_ops`) wraps a random op that checkpointing recomputes: the forward
runs it through `run_and_save_rng_state` (returning the RNG state and the result), the backward through
`run_with_rng_state(state, ...)`, which must draw the very same numbers. The saved state is the device
generator's state at the draw, in `torch.tpu.get_rng_state()`'s format, so a compiled forward pairs with
an op-by-op backward and the other way round.
"""

from __future__ import annotations

import torch
from torch._prims import rng_prims

from hf_tpu.runtime.buffers import platform
from hf_tpu.runtime.launch import rng

# activation checkpointing's RNG wrappers (aot_autograd's `functionalize_rng_ops`)
SAVE_RNG = rng_prims.run_and_save_rng_state
WITH_RNG = rng_prims.run_with_rng_state
GRAPHSAFE_RNG = rng_prims.graphsafe_run_with_rng_state


_BYTE_SHIFTS = (0, 8, 16, 24)


def state_of_draw(material, index: int):
    """The device generator's state just before draw `index` of `material`, in
    `torch.tpu.get_rng_state()`'s format (little-endian uint64 seed, then offset): a generator set to it
    draws that same key next, in a compiled graph (`key_of_state`) or op by op."""
    jnp = platform.jax().numpy
    words = jnp.stack([material[1], material[0], material[2] + jnp.uint32(index), jnp.uint32(0)])
    shifts = jnp.asarray(_BYTE_SHIFTS, jnp.uint32)
    return ((words[:, None] >> shifts) & jnp.uint32(0xFF)).astype(jnp.uint8).reshape(16)


def key_of_state(state):
    """The key of the next draw of a generator set to `state` (the inverse of `state_of_draw`)."""
    jnp = platform.jax().numpy
    if tuple(state.shape) != (16,) or state.dtype != jnp.uint8:
        raise RuntimeError(
            f"hf_tpu compile: run_with_rng_state needs a tpu RNG state (16 uint8 values, as "
            f"torch.tpu.get_rng_state() gives), got shape {tuple(state.shape)} {state.dtype}"
        )
    shifts = jnp.asarray(_BYTE_SHIFTS, jnp.uint32)
    words = (state.reshape(4, 4).astype(jnp.uint32) << shifts).sum(axis=1, dtype=jnp.uint32)
    return rng.key_from(jnp.stack([words[1], words[0], words[2]]))


def _on_tpu(args, kwargs) -> bool:
    return any(isinstance(a, torch.Tensor) and a.device.type == "tpu" for a in (*args, *kwargs.values()))


def eager_run_and_save_rng_state(op, *args, **kwargs):
    """`run_and_save_rng_state` op by op: the tpu generator's state, then `op`'s result."""
    if not _on_tpu(args, kwargs):
        return SAVE_RNG(op, *args, **kwargs)
    return rng.GENERATOR.get_state(), op(*args, **kwargs)


def eager_run_with_rng_state(state, op, *args, **kwargs):
    """`run_with_rng_state` op by op: `op` drawing from `state`, the generator left as it was."""
    if not _on_tpu(args, kwargs):
        return WITH_RNG(state, op, *args, **kwargs)
    current = rng.GENERATOR.get_state()
    rng.GENERATOR.set_state(state)
    try:
        return op(*args, **kwargs)
    finally:
        rng.GENERATOR.set_state(current)
