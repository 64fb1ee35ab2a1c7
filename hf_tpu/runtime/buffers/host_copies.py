"""Asynchronous tpu -> host copies, CUDA's pinned-memory contract: `dst.copy_(src, non_blocking=True)`.

On CUDA a non-blocking device-to-host copy into pinned memory returns at once, and the data is there
after the stream or an event recorded behind the copy is synchronized. That is what lets a decode loop
queue step N+1 while step N runs (transformers' `DeferredStopCheck` reads its stop flag one step late
this way). Here a host tensor becomes such a target through `Tensor.pin_memory()` (see `pinned.py`) or
`mark_async_target`; a non-blocking copy into it starts the device-to-host transfer
(`copy_to_host_async`) and writes the host memory when it completes: on `Event.synchronize()`,
`torch.tpu.synchronize()`, the next synchronous copy to host, or whenever a later copy finds it ready.
Copies into any other host tensor stay synchronous (CUDA also blocks for pageable memory).
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections import deque

import numpy as np
import torch

from hf_tpu.runtime.buffers.dtypes import torch_from_numpy

# id(tensor) -> weak reference to it (a WeakSet would compare tensors with ==)
_targets: dict[int, weakref.ref] = {}
_pending: deque = deque()  # (ticket, dst, array), oldest first
_tickets = itertools.count(1)
_lock = threading.Lock()
_MAX_PENDING = 64  # a loop that never synchronizes still lands its copies, and holds few arrays


def mark_async_target(t: torch.Tensor) -> torch.Tensor:
    """Let non-blocking copies from tpu into host tensor `t` return before the data lands (returns `t`)."""
    if t.device.type != "cpu":
        raise ValueError(f"hf_tpu: only host (cpu) tensors can be async copy targets, not {t.device}")
    key = id(t)
    _targets[key] = weakref.ref(t, lambda _, key=key: _targets.pop(key, None))
    return t


def is_async_target(t: torch.Tensor) -> bool:
    """Marked by `mark_async_target`, or in pinned memory (the C++ extension's pinned allocator)."""
    ref = _targets.get(id(t))
    return (ref is not None and ref() is t) or t.is_pinned()


def copy_async(dst: torch.Tensor, array) -> None:
    """Start copying device `array` into host tensor `dst` (broadcast and cast like `copy_`)."""
    array.copy_to_host_async()
    with _lock:
        _pending.append((next(_tickets), dst, array))
        _land(lambda entry: len(_pending) > _MAX_PENDING or entry[2].is_ready())


def newest_pending() -> int | None:
    """The ticket of the newest copy still in flight, or None."""
    with _lock:
        return _pending[-1][0] if _pending else None


def complete(upto: int | None = None) -> None:
    """Wait for the copies up to ticket `upto` (all when None) and write them into their host tensors."""
    if not _pending:
        return
    with _lock:
        _land(lambda entry: upto is None or entry[0] <= upto)


def is_complete(ticket: int) -> bool:
    """Whether the copies up to `ticket` are done; the ones that are get written now (a poll that says
    yes must find the data in place, as `Event.query()` does on CUDA)."""
    with _lock:
        if not all(entry[2].is_ready() for entry in _pending if entry[0] <= ticket):
            return False
        _land(lambda entry: entry[0] <= ticket)
        return True


def complete_into(t: torch.Tensor) -> None:
    """Before host tensor `t` is read (copied to tpu, used as a scalar): land the copies pending into its
    storage, as CUDA's stream order would have."""
    if not _pending:
        return
    ptr = t.untyped_storage().data_ptr()
    last = max((e[0] for e in list(_pending) if e[1].untyped_storage().data_ptr() == ptr), default=None)
    if last is not None:
        complete(last)


def _land(should_land) -> None:
    """Write the oldest pending copies while `should_land(entry)` (in order: a later copy wins)."""
    while _pending and should_land(_pending[0]):
        _, dst, array = _pending.popleft()
        dst.copy_(torch_from_numpy(np.asarray(array)))
