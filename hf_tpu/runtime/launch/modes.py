"""Eager modes, named as in TorchTPU: Strict (default), Debug (launch blocking), DeferAndFuse."""

from __future__ import annotations

import contextlib
import enum
import os
import threading

from hf_tpu.runtime import native
from hf_tpu.runtime.buffers import threads
from hf_tpu.runtime.launch import lazy


class EagerMode(enum.Enum):
    DEFER_NEVER = "defer_never"  # Strict: op by op, asynchronous (JAX dispatch is async)
    DEFER_NEVER_AND_LAUNCH_BLOCKING = "defer_never_and_launch_blocking"  # Debug: block after each op
    DEFER_AND_FUSE = "defer_and_fuse"  # record ops, run them fused as one jit at sync points


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _initial_mode() -> EagerMode:
    if _truthy("TORCH_TPU_LAUNCH_BLOCKING"):
        return EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
    if _truthy("TORCH_TPU_DEFER_AND_FUSE"):
        lazy.set_enabled(True)
        return EagerMode.DEFER_AND_FUSE
    return EagerMode.DEFER_NEVER


class _State:
    mode: EagerMode = _initial_mode()
    launch_blocking: bool = mode is EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
    scoped_to_thread: int | None = None  # DeferAndFuse set by `deferred_in_this_thread`, for this thread


def set_eager_mode(mode: EagerMode | str) -> None:
    """Select how tpu ops execute (see `EagerMode`)."""
    if isinstance(mode, str):
        try:
            mode = EagerMode[mode.upper()]
        except KeyError:
            raise ValueError(
                f"unknown eager mode {mode!r}; valid: {', '.join(m.name for m in EagerMode)}"
            ) from None
    if not isinstance(mode, EagerMode):
        raise TypeError(f"set_eager_mode expects torch.tpu.EagerMode, got {type(mode).__name__}")

    try:  # leaving DeferAndFuse flushes pending work; when that fails, the error propagates, mode left
        lazy.set_enabled(mode is EagerMode.DEFER_AND_FUSE)
    finally:
        _State.scoped_to_thread = None
        lazy.scoped[0] = False
        _State.mode = mode
        _State.launch_blocking = mode is EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
        sync_native_mode()


_native_module = native.load()


def sync_native_mode() -> None:
    """Tell the C++ kernels whether to run cached ops themselves (Strict; not Debug, which blocks and
    runs the value checks after each op)."""
    if _native_module is not None and hasattr(_native_module, "set_strict"):
        _native_module.set_strict(_State.mode is EagerMode.DEFER_NEVER)


def get_eager_mode() -> EagerMode:
    return _State.mode


def launch_blocking() -> bool:
    return _State.launch_blocking


@contextlib.contextmanager
def eager_mode(mode: EagerMode | str):
    """Temporarily run tpu ops in `mode`."""
    previous = get_eager_mode()
    set_eager_mode(mode)
    try:
        yield
    finally:
        set_eager_mode(previous)


@contextlib.contextmanager
def deferred_in_this_thread(only_thread: bool):
    """DeferAndFuse while the block runs, if the mode is Strict and `only_thread` (this is the one Python
    thread using tpu tensors). The mode is process-wide, so it is scoped to this thread's use: a thread
    that starts using tpu tensors meanwhile ends it (`another_thread_started`), and it is not taken up
    again. Any other mode (Debug, a DeferAndFuse the user chose) is left alone."""
    ident = threading.get_ident()
    took = only_thread and _State.mode is EagerMode.DEFER_NEVER and _State.scoped_to_thread is None
    if took:
        set_eager_mode(EagerMode.DEFER_AND_FUSE)
        _State.scoped_to_thread = ident
        lazy.scoped[0] = True
    try:
        yield
    finally:
        if took and _State.scoped_to_thread == ident:
            set_eager_mode(EagerMode.DEFER_NEVER)


def deferral_is_scoped() -> bool:
    """Whether DeferAndFuse is on only for hf_tpu's own deferral of a loop (`deferred_in_this_thread`),
    not because the user chose it."""
    return _State.scoped_to_thread is not None


def another_thread_started() -> None:
    """A new thread uses tpu tensors: a deferral scoped to one thread goes back to Strict (flushing)."""
    if _State.scoped_to_thread is not None:
        set_eager_mode(EagerMode.DEFER_NEVER)


threads.on_another_thread(another_thread_started)
