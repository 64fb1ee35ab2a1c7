"""Which Python threads use tpu tensors, and the locks that keep their updates of shared buffers whole.

A storage's payload array is replaced, never mutated, except when XLA is given it to overwrite
(donation). With one thread that is safe by construction; with several, a donor holds DONATION_LOCK
from its check until the payload holds the result, readers take it to read a payload's array
(`array_of`), and a read-modify-store of a buffer runs under it (`update_lock`), so no thread's update
is lost and no reader gets a buffer being donated.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable

# called when a second live thread starts using tpu tensors (a deferral scoped to one thread ends)
_on_another_thread: list[Callable[[], None]] = []


def on_another_thread(callback: Callable[[], None]) -> None:
    """Call `callback` whenever a thread starts using tpu tensors while another one does."""
    _on_another_thread.append(callback)


_get_ident = threading.get_ident
# threads that have read or written tpu payloads (ident -> a weak reference to its `threading.Thread`),
# and the one that did last: with more than one, payload arrays are read under DONATION_LOCK
# (`array_of`). Never pruned: a thread Python's `threading` does not list (started by C code or
# `_thread`) may still be alive and reading. The Thread object, not the ident alone, tells whether it
# still lives: CPython reuses the ident of an ended thread for the next one (a tqdm monitor would pass
# for a device thread forever, keeping generate from deferring and compiled executables from unloading).
_device_threads: dict = {}
_device_thread = [None]
# held from a donation's check until the payload has the new array, and, with several threads, around a
# read-modify-store of a buffer; a thread using tpu tensors for the first time waits for it (it may have
# read a payload's array without the lock just before)
DONATION_LOCK = threading.RLock()
_NO_LOCK = contextlib.nullcontext()


class _ForgetOnExit:
    """Held in a thread-local by each device thread; freed when that thread ends, it stops its ident from
    passing for the last device thread, so a new thread given the same ident is noted as one."""

    __slots__ = ("ident",)

    def __init__(self, ident: int) -> None:
        self.ident = ident

    def __del__(self) -> None:
        last = _device_thread  # None once the interpreter is tearing this module down
        if last is not None and last[0] == self.ident:
            last[0] = None


_this_thread = threading.local()


def note_device_thread() -> None:
    _device_thread[0] = ident = _get_ident()
    current = threading.current_thread()
    seen = _device_threads.get(ident)
    before = None if seen is None else seen()
    if before is current:
        return
    with DONATION_LOCK:  # a donation started before this thread was seen finishes first
        _device_threads[ident] = weakref.ref(current)
    _this_thread.marker = _ForgetOnExit(ident)
    # a thread C code started may get a new _DummyThread on each call into Python (3.12+): the same
    # thread again, not another one
    again = (
        seen is not None
        and isinstance(current, threading._DummyThread)
        and (before is None or isinstance(before, threading._DummyThread))
    )
    if not again and len(_device_threads) > 1:
        for callback in _on_another_thread:
            callback()


def one_device_thread() -> bool:
    """Whether only the calling thread (or no other live Python thread) uses tpu tensors."""
    if _get_ident() != _device_thread[0]:
        note_device_thread()
    return _one_device_thread()


def _one_device_thread() -> bool:
    """Whether a single live Python thread uses tpu tensors. Threads that ended are forgotten, and so
    are threads C++ started (autograd's device threads run backward while the Python thread that
    called it, which counts, waits)."""
    if len(_device_threads) <= 1:
        return True
    live = 0
    for ref in list(_device_threads.values()):
        thread = ref()
        live += thread is not None and thread.is_alive() and not isinstance(thread, threading._DummyThread)
    return live <= 1


def update_lock():
    """What a read-modify-store of a buffer holds: DONATION_LOCK while several threads use tpu tensors
    (so no thread's update is lost), nothing while one does. The calling thread is counted first: its
    first in-place op, deciding on no lock before its inputs noted it, would compute from the buffer
    unlocked, wait for the lock to store, and overwrite every update another thread made meanwhile."""
    if _get_ident() != _device_thread[0]:
        note_device_thread()
    return DONATION_LOCK if len(_device_threads) > 1 else _NO_LOCK


def array_of(p):
    """Payload `p`'s array, read while no donation is under way: with several threads using tpu tensors,
    a donor holds DONATION_LOCK from its check until the payload holds the result, so a reader gets
    either the old array before the check (its reference then stops the donation) or the new one."""
    with DONATION_LOCK:
        return p.array
