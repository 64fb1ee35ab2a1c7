"""`torch.accelerator.*` for tpu: the C++ paths need a C++ allocator/guard we do not have, so the
functions that would raise are routed to `torch.tpu` while tpu is the current accelerator."""

from __future__ import annotations

import functools

import torch

_ROUTED = {
    "synchronize": "synchronize",
    "empty_cache": "empty_cache",
    "memory_allocated": "memory_allocated",
    "max_memory_allocated": "max_memory_allocated",
    "memory_reserved": "memory_reserved",
    "max_memory_reserved": "max_memory_reserved",
    "reset_peak_memory_stats": "reset_peak_memory_stats",
    "reset_accumulated_memory_stats": "reset_accumulated_memory_stats",
    "memory_stats": "memory_stats",
    "get_memory_info": "mem_get_info",
    "current_stream": "current_stream",
    "set_stream": "set_stream",
    "get_device_capability": "get_device_capability",
}
_installed = False


def _is_tpu_current() -> bool:
    acc = torch.accelerator.current_accelerator()
    return acc is not None and acc.type == "tpu"


def _route(name: str, original):
    @functools.wraps(original)
    def routed(*args, **kwargs):
        if _is_tpu_current():
            return getattr(torch.tpu, _ROUTED[name])(*args, **kwargs)
        return original(*args, **kwargs)

    routed.__hf_tpu_routed__ = True
    return routed


def _device_count(original):
    """In a multi-process tpu_dist job `tpu:local_rank` names this process's device (see
    `distributed.registration.local_device_names`): count those indices, as CUDA counts a host's GPUs."""

    @functools.wraps(original)
    def device_count(*args, **kwargs):
        if _is_tpu_current():
            from hf_tpu.runtime.buffers import platform
            from hf_tpu.runtime.distributed import registration

            # mp.spawn: init_process_group(world_size=N, device_id=tpu:rank) asks while it runs
            aliases = max(registration.local_device_names(), registration.world_size_being_initialized())
            if aliases:  # counting chips would start JAX, which must wait for the job's coordinator
                return max(aliases, len(platform.devices()) if platform.is_initialized() else 1)
        return original(*args, **kwargs)

    device_count.__hf_tpu_routed__ = True
    return device_count


def install() -> None:
    global _installed
    if _installed:
        return
    original = torch.accelerator.device_count
    if not getattr(original, "__hf_tpu_routed__", False):
        torch.accelerator.device_count = _device_count(original)
    for name in _ROUTED:
        for module in (torch.accelerator, getattr(torch.accelerator, "memory", None)):
            original = getattr(module, name, None) if module is not None else None
            if original is None or getattr(original, "__hf_tpu_routed__", False):
                continue
            setattr(module, name, _route(name, original))
    _installed = True
