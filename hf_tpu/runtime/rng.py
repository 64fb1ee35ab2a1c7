"""The device PRNG behind torch.manual_seed for tpu tensors.

`torch.Generator(device="tpu")` cannot be built from Python hooks, so the device keeps its own
counter-based generator: (seed, offset) -> fold_in(key(seed), offset). Every random op takes the next
key, so a seeded program draws the same numbers every run. Ops given a CPU `generator=` draw on CPU.
"""

from __future__ import annotations

import struct
import threading
from functools import cache

import torch

from hf_tpu.runtime import platform

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

    def next_key(self):
        with self.lock:
            seed, offset = self.seed, self.offset
            self.offset += 1
        return _fold(seed, offset)

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


@cache
def _folder():
    jax = platform.jax()

    def fold(seed_hi, seed_lo, offset):
        key = jax.random.key(seed_lo)
        key = jax.random.fold_in(key, seed_hi)
        return jax.random.fold_in(key, offset)

    return jax.jit(fold)


def _fold(seed: int, offset: int):
    import numpy as np

    return _folder()(np.uint32(seed >> 32), np.uint32(seed & 0xFFFFFFFF), np.uint32(offset & 0xFFFFFFFF))


GENERATOR = DevicePRNG()


def next_key():
    return GENERATOR.next_key()
