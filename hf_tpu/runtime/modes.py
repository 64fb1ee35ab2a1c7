"""Eager modes, named as in TorchTPU: Strict (default), Debug (launch blocking), DeferAndFuse."""

from __future__ import annotations

import contextlib
import enum
import os


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
        from hf_tpu.runtime import lazy

        lazy.set_enabled(True)
        return EagerMode.DEFER_AND_FUSE
    return EagerMode.DEFER_NEVER


class _State:
    mode: EagerMode = _initial_mode()
    launch_blocking: bool = mode is EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING


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
    from hf_tpu.runtime import lazy

    lazy.set_enabled(mode is EagerMode.DEFER_AND_FUSE)  # leaving the mode flushes pending work
    _State.mode = mode
    _State.launch_blocking = mode is EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING


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
