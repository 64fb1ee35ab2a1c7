"""The device PRNG behind torch.manual_seed for tpu tensors.

A counter-based generator: (seed, offset) -> fold_in(key(seed), offset). Every random op takes the
next offset, so a seeded program draws the same numbers every run. With the C++ extension
(`hf_tpu.runtime.native`) the state lives in tpu's default `torch.Generator` and any
`torch.Generator(device="tpu")` drives draws the same way (`material_of`); on the pure-Python path the
device keeps the state here and `torch.Generator("tpu")` is a CPU generator (`hf_tpu/integrations/torch_generator.py`).
Ops given a CPU `generator=` draw on CPU.

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

from hf_tpu.runtime import native
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
        return _material(seed, offset)

    def get_state(self) -> torch.Tensor:
        return torch.frombuffer(
            bytearray(struct.pack("<QQ", self.seed, self.offset)), dtype=torch.uint8
        ).clone()

    def set_state(self, state: torch.Tensor) -> None:
        data = _state_bytes(state)
        with self.lock:
            self.seed, self.offset = struct.unpack("<QQ", data)


class NativePRNG:
    """The same generator, its state held by tpu's default `torch.Generator` (C++): `torch.tpu`'s RNG
    functions, `torch.Generator` methods and the draws all see one (seed, offset)."""

    def __init__(self, ext) -> None:
        self._ext = ext
        self.generator = ext.default_generator()

    @property
    def seed(self) -> int:
        return self.generator.initial_seed()

    @property
    def offset(self) -> int:
        return self.generator.get_offset()

    def manual_seed(self, seed: int) -> None:
        self.generator.manual_seed(int(seed) & ((1 << 64) - 1))

    def next_material(self, count: int = 1):
        return _material(*self._ext.draw_default(count))

    def get_state(self) -> torch.Tensor:
        return self.generator.get_state()

    def set_state(self, state: torch.Tensor) -> None:
        data = _state_bytes(state)
        self.generator.set_state(torch.frombuffer(bytearray(data), dtype=torch.uint8))


def _state_bytes(state: torch.Tensor) -> bytes:
    data = bytes(state.to("cpu", torch.uint8).numpy().tobytes())
    if len(data) != 16:
        raise ValueError(f"tpu RNG state must be 16 bytes (from torch.tpu.get_rng_state()), got {len(data)}")
    return data


def _material(seed: int, offset: int):
    return np.array((seed >> 32, seed & 0xFFFFFFFF, offset & 0xFFFFFFFF), dtype=np.uint32)


def material_of(generator: torch.Generator, count: int = 1):
    """Key material for `count` draws from a tpu `torch.Generator` (native path only)."""
    return _material(*native.load().draw(generator, count))


def key_from(material, index: int = 0):
    """The `jax.random` key of draw `index` of `material` (traceable: runs inside executables)."""
    jax = platform.jax()
    key = jax.random.fold_in(jax.random.key(material[1]), material[0])
    return jax.random.fold_in(key, material[2] + jax.numpy.uint32(index))


@cache
def _eager_key_from():
    return platform.jax().jit(key_from)


_ext = native.load()
GENERATOR = DevicePRNG() if _ext is None else NativePRNG(_ext)
del _ext


def next_material(count: int = 1):
    return GENERATOR.next_material(count)


def next_key():
    """A concrete key now (host-side code; executables take `next_material()` instead)."""
    return _eager_key_from()(next_material())
