"""Device memory: capacity, the numbers behind torch.tpu.memory_allocated & co, and OutOfMemoryError."""

from __future__ import annotations

import os
from functools import cache

import torch

from hf_tpu.runtime.buffers import platform


def _parse_bytes(text: str) -> int:
    text = text.strip().upper()
    for suffix, mult in (("GB", 1 << 30), ("G", 1 << 30), ("MB", 1 << 20), ("M", 1 << 20)):
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * mult)
    return int(text)


def capacity() -> int:
    """Bytes the device can hold: HF_TPU_MEMORY_LIMIT, else the chips' bytes_limit, else host RAM (CPU)."""
    return _capacity_and_source()[0]


_fraction = [1.0]


def set_fraction(value: float) -> None:
    """`torch.tpu.set_per_process_memory_fraction`: tpu tensors may hold at most this share of capacity."""
    _fraction[0] = value


def fraction() -> float:
    return _fraction[0]


def limit() -> int:
    """Bytes tpu tensors may hold: the capacity times the per-process memory fraction."""
    return int(capacity() * _fraction[0])


def host_backed() -> bool:
    """Whether device memory is the host's RAM without a limit of its own (JAX's CPU platform, no
    HF_TPU_MEMORY_LIMIT): shared with the process and everything else on the machine."""
    return _capacity_and_source()[1] == "host"


@cache
def _capacity_and_source() -> tuple[int, str]:
    env = os.environ.get("HF_TPU_MEMORY_LIMIT")
    if env:
        return _parse_bytes(env), "limit"
    total = 0
    for dev in platform.devices():
        stats = dev.memory_stats() or {}
        total += int(stats.get("bytes_limit", 0))
    if total:
        return total, "device"
    import psutil

    return psutil.virtual_memory().total, "host"


def free() -> int:
    """Bytes that can still be allocated: capacity minus live tensors, and on host-backed memory no more
    than the host has available (other processes and this one's CPU tensors use it too)."""
    left = max(capacity() - allocated(), 0)
    if host_backed():
        import psutil

        left = min(left, psutil.virtual_memory().available)
    return left


def allocated() -> int:
    from hf_tpu.runtime.buffers.storage import REGISTRY

    return REGISTRY.allocated


def check_capacity(nbytes: int) -> None:
    """Refuse a request that cannot fit, the way CUDA does, before anything is half-built."""
    if nbytes <= (1 << 26) and _fraction[0] == 1.0:
        return
    from hf_tpu.runtime.buffers.storage import REGISTRY

    cap = limit()
    if nbytes + REGISTRY.allocated > cap:
        REGISTRY.sweep()
        if nbytes + REGISTRY.allocated > cap:
            raise torch.OutOfMemoryError(
                # "<device> out of memory. Tried to allocate" as CUDA/XPU word it: accelerate's
                # find_executable_batch_size (Trainer's auto_find_batch_size) retries on " out of memory."
                f"tpu out of memory. Tried to allocate {_human(nbytes)} ({nbytes} bytes); the device holds "
                f"{_human(cap)}{_fraction_note()} of which {_human(REGISTRY.allocated)} is allocated by tensors. "
                "Free tensors, use a smaller batch or dtype, or shard the model (device_map)."
            )


def _fraction_note() -> str:
    return (
        ""
        if _fraction[0] == 1.0
        else f" for this process (set_per_process_memory_fraction({_fraction[0]:g}))"
    )


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.2f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return str(n)


def is_jax_oom(exc: BaseException) -> bool:
    text = str(exc)
    return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or "out of memory" in text


def oom_from_jax(exc: BaseException, what: str) -> torch.OutOfMemoryError:
    return torch.OutOfMemoryError(f"tpu out of memory. It happened while running {what}: {exc}")
