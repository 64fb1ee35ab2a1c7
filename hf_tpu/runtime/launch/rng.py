"""The device PRNG behind torch.manual_seed for tpu tensors.

A real `torch.Generator(device="tpu")` cannot be built from Python hooks (it gives a CPU generator:
`generator.py`), so the device keeps its own counter-based generator: (seed, offset) ->
fold_in(key(seed), offset). Every random op takes the next offset, so a seeded program draws the same
numbers every run. Ops given a CPU `generator=` draw on CPU.

What travels to an executable is the key *material*, a host uint32 triple (seed_hi, seed_lo, offset):
the key itself is derived inside the executable (`key_from`), so a random op or a compiled graph pays
no separate JAX dispatch per draw (that cost ~25 us per key).
"""

from __future__ import annotations

import struct
import threading
from functools import cache

import numpy as np
import torch

from hf_tpu.runtime.buffers import platform

_DEFAULT_SEED = 67280421310721


class DevicePRNG:
    def __init__(self) -> None:
        self.seed = _DEFAULT_SEED
        self.offset = 0
        self.lock = threading.Lock()

    def manual_seed(self, seed: int) -> None:
        with self.lock:
            self.seed = int(seed) & ((1 << 64) - 1)
            self.offset = 0

    def next_material(self, count: int = 1):
        """Key material for `count` consecutive draws (offsets offset .. offset+count-1)."""
        with self.lock:
            seed, offset = self.seed, self.offset
            self.offset += count
        return np.array((seed >> 32, seed & 0xFFFFFFFF, offset & 0xFFFFFFFF), dtype=np.uint32)

    def get_state(self) -> torch.Tensor:
        return torch.frombuffer(
            bytearray(struct.pack("<QQ", self.seed, self.offset)), dtype=torch.uint8
        ).clone()

    def set_state(self, state: torch.Tensor) -> None:
        data = bytes(state.to("cpu", torch.uint8).numpy().tobytes())
        if len(data) != 16:
            raise ValueError(
                f"tpu RNG state must be 16 bytes (from torch.tpu.get_rng_state()), got {len(data)}"
            )
        with self.lock:
            self.seed, self.offset = struct.unpack("<QQ", data)


def key_from(material, index: int = 0):
    """The `jax.random` key of draw `index` of `material` (traceable: runs inside executables)."""
    jax = platform.jax()
    key = jax.random.fold_in(jax.random.key(material[1]), material[0])
    return jax.random.fold_in(key, material[2] + jax.numpy.uint32(index))


@cache
def _eager_key_from():
    return platform.jax().jit(key_from)


GENERATOR = DevicePRNG()


def next_material(count: int = 1):
    return GENERATOR.next_material(count)


def next_key():
    """A concrete key now (host-side code; executables take `next_material()` instead)."""
    return _eager_key_from()(next_material())
