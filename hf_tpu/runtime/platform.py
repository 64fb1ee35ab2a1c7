"""Which JAX platform backs the `tpu` device, initialized lazily on first use.

The autoload hook runs at every `import torch`, so nothing here touches JAX until a tensor needs it.
"""

from __future__ import annotations

import os
import threading
from functools import cache

VALID_PLATFORMS = ("tpu", "gpu", "cuda", "rocm", "cpu")
_lock = threading.Lock()


class PlatformError(RuntimeError):
    """The requested JAX platform is unknown or unavailable."""


def requested_platform() -> str | None:
    """The platform forced through `HF_TPU_PLATFORM`, validated (None: let JAX choose)."""
    value = os.environ.get("HF_TPU_PLATFORM", "").strip().lower()
    if not value:
        return None
    if value not in VALID_PLATFORMS:
        raise PlatformError(
            f"HF_TPU_PLATFORM={value!r} is not a known JAX platform; valid values: {', '.join(VALID_PLATFORMS)} "
            "(or unset it to let JAX pick TPU, then GPU, then CPU)."
        )
    return value


@cache
def jax():
    """Import and configure JAX once: 64-bit types on (PyTorch semantics need int64/float64)."""
    with _lock:
        import jax as _jax

        _jax.config.update("jax_enable_x64", True)
        return _jax


@cache
def devices() -> tuple:
    """The local chips behind `tpu:0` (one logical device spanning all of them)."""
    j = jax()
    forced = requested_platform()
    try:
        devs = j.devices(forced) if forced else j.devices()
    except RuntimeError as exc:
        raise PlatformError(
            f"HF_TPU_PLATFORM={forced!r}: JAX has no such backend on this machine ({exc}). "
            f"Unset HF_TPU_PLATFORM or choose one of: {', '.join(VALID_PLATFORMS)}."
        ) from exc
    return tuple(devs)


def default_device():
    """The first chip: where unsharded buffers live."""
    return devices()[0]


def platform_name() -> str:
    """'tpu', 'gpu' or 'cpu' — the JAX platform of the chips."""
    return default_device().platform


def is_initialized() -> bool:
    return jax.cache_info().currsize > 0 and devices.cache_info().currsize > 0


def supports_float64() -> bool:
    """XLA on TPU has no float64; CPU and GPU do."""
    return platform_name() != "tpu"


# The most recently launched executable's results, kept alive so `torch.tpu.synchronize()` can wait for
# work whose outputs were already dropped (a benchmark's discarded forward): later work mostly depends
# on earlier work, so waiting on the newest results waits on the queue behind them.
last_launched: list = [None]
