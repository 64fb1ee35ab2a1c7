"""Device storages: one JAX buffer per torch storage, keyed by the storage's (fake) data pointer.

A tpu tensor is a real PrivateUse1 TensorImpl whose storage carries a unique fake pointer that no CPU
kernel ever dereferences; its payload lives here as a `jax.Array` in the base tensor's logical shape
and dtype (DESIGN §3.2). Views share the storage natively, so (storage, offset, sizes, strides) is
exactly PyTorch's model. Payloads of dead storages are dropped by a sweep that runs as allocations
accumulate, so memory does not grow over a long loop.
"""

from __future__ import annotations

import math
import threading

import torch

from hf_tpu.runtime import native
from hf_tpu.runtime.buffers.pending import LazyValue

DEVICE = torch.device("tpu", 0)
_ALIGN = 64
_FIRST_PTR = 1 << 44


_weak_ref = torch.UntypedStorage._weak_ref
_expired = torch.UntypedStorage._expired
_free_weak_ref = torch.UntypedStorage._free_weak_ref
_construct = torch._C._construct_storage_from_data_pointer
_native = native.load()
_new_device_tensor = None if _native is None else _native.new_device_tensor
# op outputs the C++ recorder made (DeferAndFuse) have pointers from here up, and no payload until
# Python is handed its trace (`drain_native`)
NATIVE_FIRST_PTR = None if _native is None else _native.FIRST_RECORDED_PTR
_native_pending = None if _native is None else _native.pending
_note_failed = None if _native is None else getattr(_native, "note_failed_storages", None)


class Payload:
    """What one storage holds: `array` (None until first written) in `shape`/`dtype` (row-major).

    `weak` is a raw weak reference to the storage (torch's `StorageWeakRef` minus the Python object:
    this is created once per op output, so it is kept cheap); the registry frees it with the payload.
    """

    __slots__ = ("weak", "array", "shape", "dtype", "nbytes", "counted")

    def __init__(
        self, weak: int, array, shape: tuple, dtype: torch.dtype, nbytes: int, counted: bool
    ) -> None:
        self.weak = weak
        self.array = array
        self.shape = shape
        self.dtype = dtype
        self.nbytes = nbytes
        self.counted = counted  # its bytes are in `allocated` (a real buffer, not a pending LazyValue)

    def expired(self) -> bool:
        return _expired(self.weak)


class StorageRegistry:
    """All live tpu storages; thread-safe (transformers copies weights from 4 threads)."""

    def __init__(self) -> None:
        self._payloads: dict[int, Payload] = {}
        self._lock = threading.Lock()
        self._next_ptr = _FIRST_PTR
        self._since_sweep = 0
        self._bytes_since_sweep = 0
        self._live_after_sweep = 0
        self.allocated = 0
        self.peak = 0
        # pointers of payloads that were given a pending LazyValue (materialized at the next flush);
        # pointers, not payloads, so a storage that dies before the flush does not keep its value live
        self._pending: list[int] = []
        # takes over the C++ recorder's trace (execution.native_recording), installed with its kernels
        self.drain = None

    def drain_native(self) -> None:
        """Record what the C++ recorder holds into Python's trace: before a payload is written, flushed
        or looked up and missing, so every op is recorded in program order."""
        if self.drain is not None and _native_pending():
            self.drain()

    # -- allocation -------------------------------------------------------------------------------
    def _reserve(self, nbytes: int, counted: bool, ptr: int | None = None) -> tuple[int, bool]:
        """A fresh unique fake pointer for `nbytes` (or `ptr`, one the C++ recorder reserved) and the
        accounting; True when a sweep is due."""
        with self._lock:
            if ptr is None:
                ptr = self._next_ptr
                self._next_ptr += (nbytes + _ALIGN) // _ALIGN * _ALIGN
            self._since_sweep += 1
            self._bytes_since_sweep += nbytes
            if counted:
                self.allocated += nbytes
                if self.allocated > self.peak:
                    self.peak = self.allocated
            # amortized O(1) per allocation (a sweep visits at most twice the allocations since the last
            # one), and dead buffers never outweigh a quarter of the live ones (plus 64 MiB) for long: they
            # hold device memory until swept. Dead payloads kept longer also cost the cyclic GC: they
            # survive into its oldest generation and make its full collections frequent and slow
            due = (self._since_sweep > 256 and self._since_sweep > self._live_after_sweep) or (
                self._bytes_since_sweep > max(1 << 26, self.allocated >> 2)
            )
            return ptr, due

    def new_storage(self, nbytes: int, shape: tuple, dtype: torch.dtype, array=None) -> torch.UntypedStorage:
        """A storage with a fresh unique fake pointer; `array` (if given) is its payload already."""
        counted = _is_buffer(array)
        ptr, sweep = self._reserve(nbytes, counted)
        if sweep:
            self.sweep()
        storage = _construct(ptr, DEVICE, nbytes)
        self._payloads[ptr] = Payload(_weak_ref(storage), array, shape, dtype, nbytes, counted)
        if type(array) is LazyValue:
            self._pending.append(ptr)
        return storage

    def adopt(
        self, storage: torch.UntypedStorage, nbytes: int, shape: tuple, dtype: torch.dtype, array
    ) -> None:
        """Give a freshly created tensor's (empty) storage a unique fake pointer and `array` as payload.

        Cheaper than building a storage and `set_`-ing it into the tensor (a boxed redispatch), which
        matters because this runs once per op output.
        """
        lazy = type(array) is LazyValue
        ptr, sweep = self._reserve(nbytes, not lazy and array is not None)
        if sweep:
            self.sweep()
        storage._swap_data_ptr_(_construct(ptr, DEVICE, nbytes))
        self._payloads[ptr] = Payload(
            _weak_ref(storage), array, shape, dtype, nbytes, not lazy and array is not None
        )
        if lazy:
            self._pending.append(ptr)

    def new_tensor(self, shape: tuple, dtype: torch.dtype, nbytes: int, array) -> torch.Tensor:
        """A fresh contiguous tpu tensor with `array` as its payload, made in one C++ call (the native
        path's `adopt`: tensor, storage, fake pointer and weak reference at once)."""
        lazy = type(array) is LazyValue
        counted = not lazy and array is not None
        ptr, sweep = self._reserve(nbytes, counted)
        if sweep:
            self.sweep()
        t, weak = _new_device_tensor(ptr, nbytes, shape, dtype)
        self._payloads[ptr] = Payload(weak, array, shape, dtype, nbytes, counted)
        if lazy:
            self._pending.append(ptr)
        return t

    def adopt_recorded(
        self, ptr: int, weak: int, shape: tuple, dtype: torch.dtype, nbytes: int, array
    ) -> None:
        """Give the storage of an output the C++ recorder made (fake pointer `ptr`, raw weak reference
        `weak`) its payload."""
        lazy = type(array) is LazyValue
        counted = not lazy and array is not None
        _, sweep = self._reserve(nbytes, counted, ptr)
        self._payloads[ptr] = Payload(weak, array, shape, dtype, nbytes, counted)
        if lazy:
            self._pending.append(ptr)
        if sweep:
            self.sweep()

    def resize(
        self, storage: torch.UntypedStorage, nbytes: int, shape: tuple, dtype: torch.dtype, array
    ) -> int:
        """`storage.resize_(nbytes)` in place: the storage (every tensor viewing it) gets `nbytes` bytes
        under a fresh unique fake pointer, as a reallocation gives a new address on CPU (so no two
        storages' byte ranges ever overlap), and its payload, re-keyed, holds `array` in `shape`/`dtype`.
        Returns the new pointer."""
        old_ptr = storage.data_ptr()
        self.drain_native()
        if old_ptr not in self._payloads:
            raise RuntimeError("hf_tpu: cannot resize a tpu storage without a payload")
        counted = _is_buffer(array)
        ptr, sweep = self._reserve(nbytes, counted)
        if sweep:
            self.sweep()
        # torch swaps a storage's data pointer (and size) only with an empty one: empty it, then fill it
        if storage.nbytes():
            storage._swap_data_ptr_(_construct(ptr, DEVICE, 0))
        if nbytes:
            storage._swap_data_ptr_(_construct(ptr, DEVICE, nbytes))
        with self._lock:
            p = self._payloads.pop(old_ptr)
            if p.counted:
                self.allocated -= p.nbytes
            p.array, p.shape, p.dtype, p.nbytes, p.counted = array, shape, dtype, nbytes, counted
            self._payloads[ptr] = p
            if type(array) is LazyValue:
                self._pending.append(ptr)
        return ptr

    def materialize_pending(self) -> None:
        """After a flush: payloads whose LazyValue was computed now hold the array itself."""
        with self._lock:
            pending, self._pending = self._pending, []
        failed = []
        for ptr in pending:
            p = self._payloads.get(ptr)
            if p is not None and type(p.array) is LazyValue:
                if p.array.concrete is not None:
                    self.store(p, p.array.concrete)
                elif p.array.failed_op is not None:
                    failed.append(ptr)
        if failed and _note_failed is not None:  # ops reading these take their Python kernels (they raise)
            _note_failed(failed)

    def payload(self, ptr: int) -> Payload | None:
        p = self._payloads.get(ptr)
        if p is None and NATIVE_FIRST_PTR is not None and ptr >= NATIVE_FIRST_PTR:
            self.drain_native()
            p = self._payloads.get(ptr)
        return p

    def set_array(self, ptr: int, array) -> None:
        if self.drain is not None and _native_pending():
            self.drain()
        p = self._payloads[ptr]
        if type(array) is LazyValue:
            self._pending.append(ptr)
            old = p.array
            if old is not None and type(old) is not LazyValue and array.trace is not None:
                array.trace.note_overwrite(ptr, old)  # restored if the flush cannot compute `array`
        self.store(p, array)

    def store(self, p: Payload, array) -> None:
        """Make `array` the payload's value; its bytes count once a real buffer backs the storage
        (DeferAndFuse values that die before a flush never occupy device memory)."""
        if not p.counted and _is_buffer(array):
            with self._lock:
                p.counted = True
                self.allocated += p.nbytes
                if self.allocated > self.peak:
                    self.peak = self.allocated
        p.array = array

    # -- lifetime ---------------------------------------------------------------------------------
    def sweep(self) -> int:
        """Drop payloads whose storage died; returns how many were freed."""
        with self._lock:
            dead = [ptr for ptr, p in self._payloads.items() if _expired(p.weak)]
            for ptr in dead:
                self._drop(ptr)
            self._since_sweep = 0
            self._bytes_since_sweep = 0
            self._live_after_sweep = len(self._payloads)
        return len(dead)

    def sweep_pending(self) -> None:
        """Drop the payloads of dead storages among those given a pending LazyValue: before a flush
        decides which values are live, so that set does not depend on when the registry last swept
        (a sweep of every payload would cost O(live tensors) per flush)."""
        with self._lock:
            for ptr in self._pending:
                p = self._payloads.get(ptr)
                if p is not None and _expired(p.weak):
                    self._drop(ptr)

    def _drop(self, ptr: int) -> None:
        """Forget dead storage `ptr`'s payload (and its bytes); call holding the lock."""
        p = self._payloads.pop(ptr)
        _free_weak_ref(p.weak)
        if p.counted:
            self.allocated -= p.nbytes

    def live_count(self) -> int:
        self.sweep()
        return len(self._payloads)

    def reset_peak(self) -> None:
        self.sweep()
        self.peak = self.allocated


def _is_buffer(array) -> bool:
    return array is not None and type(array) is not LazyValue


REGISTRY = StorageRegistry()


def nbytes_of(shape, dtype: torch.dtype) -> int:
    return math.prod(shape) * dtype.itemsize
