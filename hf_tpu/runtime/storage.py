"""Device storages: one JAX buffer per torch storage, keyed by the storage's (fake) data pointer.

A tpu tensor is a real PrivateUse1 TensorImpl whose storage carries a unique fake pointer that no CPU
kernel ever dereferences; its payload lives here as a `jax.Array` in the base tensor's logical shape
and dtype (DESIGN §3.2). Views share the storage natively, so (storage, offset, sizes, strides) is
exactly PyTorch's model. Payloads of dead storages are dropped by a sweep that runs as allocations
accumulate, so memory does not grow over a long loop.
"""

from __future__ import annotations

import itertools
import math
import threading
from dataclasses import dataclass

import torch
from torch.multiprocessing.reductions import StorageWeakRef

DEVICE = torch.device("tpu", 0)
_ALIGN = 64
_FIRST_PTR = 1 << 44


@dataclass(slots=True)
class Payload:
    """What one storage holds: `array` (None until first written) in `shape`/`dtype` (row-major)."""

    ref: StorageWeakRef
    array: object
    shape: tuple
    dtype: torch.dtype
    nbytes: int


class StorageRegistry:
    """All live tpu storages; thread-safe (transformers copies weights from 4 threads)."""

    def __init__(self) -> None:
        self._payloads: dict[int, Payload] = {}
        self._lock = threading.Lock()
        self._next_ptr = _FIRST_PTR
        self._since_sweep = 0
        self._ids = itertools.count()
        self.allocated = 0
        self.peak = 0

    # -- allocation -------------------------------------------------------------------------------
    def new_storage(self, nbytes: int, shape: tuple, dtype: torch.dtype, array=None) -> torch.UntypedStorage:
        with self._lock:
            ptr = self._next_ptr
            self._next_ptr += (max(nbytes, 1) + _ALIGN - 1) // _ALIGN * _ALIGN
            self._since_sweep += 1
            sweep = self._since_sweep > max(256, len(self._payloads))
        if sweep:
            self.sweep()
        storage = torch._C._construct_storage_from_data_pointer(ptr, DEVICE, nbytes)
        self._payloads[ptr] = Payload(StorageWeakRef(storage), None, shape, dtype, nbytes)
        if array is not None:
            self.set_array(ptr, array)
        return storage

    def payload(self, ptr: int) -> Payload | None:
        return self._payloads.get(ptr)

    def set_array(self, ptr: int, array) -> None:
        p = self._payloads[ptr]
        if p.array is None:
            with self._lock:
                self.allocated += p.nbytes
                if self.allocated > self.peak:
                    self.peak = self.allocated
        p.array = array

    # -- lifetime ---------------------------------------------------------------------------------
    def sweep(self) -> int:
        """Drop payloads whose storage died; returns how many were freed."""
        with self._lock:
            dead = [ptr for ptr, p in self._payloads.items() if p.ref.expired()]
            for ptr in dead:
                p = self._payloads.pop(ptr)
                if p.array is not None:
                    self.allocated -= p.nbytes
            self._since_sweep = 0
        return len(dead)

    def live_count(self) -> int:
        self.sweep()
        return len(self._payloads)

    def reset_peak(self) -> None:
        self.sweep()
        self.peak = self.allocated


REGISTRY = StorageRegistry()


def nbytes_of(shape, dtype: torch.dtype) -> int:
    return math.prod(shape) * dtype.itemsize
