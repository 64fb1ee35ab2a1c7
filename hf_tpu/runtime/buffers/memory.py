"""Device memory: capacity, the numbers behind torch.tpu.memory_allocated & co, and OutOfMemoryError."""

from __future__ import annotations

import math
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
    """Bytes the device can hold: the sum over its chips (what sharding can spread a model over)."""
    return chip_capacity() * len(platform.devices())


def chip_capacity() -> int:
    """Bytes one chip can hold: HF_TPU_MEMORY_LIMIT (per chip), else its `bytes_limit`, else (JAX's CPU
    platform) the host's RAM shared out evenly between the forced host devices."""
    return _capacity_and_source()[0]


_fraction = [1.0]


def set_fraction(value: float) -> None:
    """`torch.tpu.set_per_process_memory_fraction`: tpu tensors may hold at most this share of capacity."""
    _fraction[0] = value


def fraction() -> float:
    return _fraction[0]


def limit() -> int:
    """Bytes tpu tensors may hold: the capacity times the per-process memory fraction."""
    return chip_limit() * len(platform.devices())


def chip_limit() -> int:
    """Bytes tpu tensors may hold on one chip."""
    return int(chip_capacity() * _fraction[0])


def host_backed() -> bool:
    """Whether device memory is the host's RAM without a limit of its own (JAX's CPU platform, no
    HF_TPU_MEMORY_LIMIT): shared with the process and everything else on the machine."""
    return _capacity_and_source()[1] == "host"


@cache
def _capacity_and_source() -> tuple[int, str]:
    env = os.environ.get("HF_TPU_MEMORY_LIMIT")
    if env:
        return _parse_bytes(env), "limit"
    devices = platform.devices()
    limits = [int((dev.memory_stats() or {}).get("bytes_limit", 0)) for dev in devices]
    if all(limits):
        return min(limits), "device"
    import psutil

    return psutil.virtual_memory().total // len(devices), "host"


def allocated_per_chip() -> list[int]:
    """Bytes of live tpu buffers on each chip (a replicated buffer counts on every chip, a sharded one
    its part on each; an unsharded one on the first chip)."""
    from hf_tpu.runtime.buffers.storage import REGISTRY

    n = len(platform.devices())
    if n == 1:
        return [REGISTRY.allocated]
    from hf_tpu.runtime.buffers.placement import chip_bytes

    REGISTRY.sweep()
    per_chip = [0] * n
    for p in list(REGISTRY._payloads.values()):
        array = p.array
        if not p.counted or array is None or not hasattr(array, "sharding"):
            if p.counted and array is not None:  # a computed LazyValue: count where its buffer is
                array = getattr(array, "concrete", None)
            if array is None or not hasattr(array, "sharding"):
                continue
        for chip, nbytes in chip_bytes(array, p.dtype.itemsize):
            per_chip[chip] += nbytes
    return per_chip


def free() -> int:
    """Bytes that can still be allocated, summed over the chips (each chip's limit minus what it holds);
    on host-backed memory no more than the host has available (other processes and this one's CPU
    tensors use it too)."""
    cap = chip_capacity()
    left = sum(max(cap - used, 0) for used in allocated_per_chip())
    if host_backed():
        import psutil

        left = min(left, psutil.virtual_memory().available)
    return left


def allocated() -> int:
    from hf_tpu.runtime.buffers.storage import REGISTRY

    return REGISTRY.allocated


def check_capacity(nbytes: int, array=None) -> None:
    """Refuse a request that cannot fit, the way CUDA does, before anything is half-built. `array`: the
    buffer being adopted, when it exists already (its placement says which chips hold how much)."""
    if nbytes <= (1 << 26) and _fraction[0] == 1.0:
        return
    from hf_tpu.runtime.buffers.storage import REGISTRY

    chips = len(platform.devices())
    if chips == 1:
        cap = limit()
        if nbytes + REGISTRY.allocated > cap:
            REGISTRY.sweep()
            if nbytes + REGISTRY.allocated > cap:
                raise torch.OutOfMemoryError(
                    # "<device> out of memory. Tried to allocate" as CUDA/XPU word it: accelerate's
                    # find_executable_batch_size (Trainer's auto_find_batch_size) retries on " out of memory."
                    f"tpu out of memory. Tried to allocate {_human(nbytes)} ({nbytes} bytes); the device holds "
                    f"{_human(cap)}{_fraction_note()} of which {_human(REGISTRY.allocated)} is allocated by "
                    "tensors. Free tensors, use a smaller batch or dtype, or shard the model (device_map)."
                )
        return
    if nbytes < (1 << 20):  # per chip, small buffers are not worth a count of every live one
        return
    # per chip: an unsharded buffer lands on the first chip, a placed one where its sharding says
    need = [0] * chips
    if array is not None and hasattr(array, "sharding") and getattr(array, "committed", False):
        from hf_tpu.runtime.buffers.placement import chip_bytes

        for chip, n in chip_bytes(array, nbytes // max(math.prod(array.shape), 1)):
            need[chip] = n
    else:
        need[0] = nbytes
    cap = chip_limit()
    used = allocated_per_chip()
    worst = max(range(chips), key=lambda c: need[c] + used[c])
    if need[worst] + used[worst] > cap:
        raise torch.OutOfMemoryError(
            f"tpu out of memory. Tried to allocate {_human(nbytes)} ({nbytes} bytes), {_human(need[worst])} of it on "
            f"chip {worst}, which holds {_human(cap)}{_fraction_note()} of which {_human(used[worst])} is allocated "
            f"by tensors (the device has {chips} chips). Free tensors, use a smaller batch or dtype, or shard the "
            "tensor over the chips (hf_tpu.shard, device_map='tpu')."
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
