"""`torch.accelerator.*` for tpu: the C++ paths need a C++ allocator/guard we do not have, so the functions
that would raise are routed to `torch.tpu` while tpu is the current accelerator; `device_count` counts a
multi-process job's devices. Applied at `import hf_tpu` through `patching.patch` (table.PATCHES lists each
function); copies imported by value (`from torch.accelerator import memory_allocated`) are rebound.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch

from hf_tpu.integrations.patching import patch

# torch.accelerator function -> the torch.tpu function that answers for tpu
ROUTED = {
    "synchronize": "synchronize",
    "current_stream": "current_stream",
    "set_stream": "set_stream",
    "get_device_capability": "get_device_capability",
}
# torch.accelerator.memory function (re-exported by torch.accelerator) -> the torch.tpu function
ROUTED_MEMORY = {
    "empty_cache": "empty_cache",
    "memory_allocated": "memory_allocated",
    "max_memory_allocated": "max_memory_allocated",
    "memory_reserved": "memory_reserved",
    "max_memory_reserved": "max_memory_reserved",
    "reset_peak_memory_stats": "reset_peak_memory_stats",
    "reset_accumulated_memory_stats": "reset_accumulated_memory_stats",
    "memory_stats": "memory_stats",
    "get_memory_info": "mem_get_info",
}


def _is_tpu_current() -> bool:
    acc = torch.accelerator.current_accelerator()
    return acc is not None and acc.type == "tpu"


def _router(target: str):
    def make(original):
        @functools.wraps(original)
        def routed(*args, **kwargs):
            if _is_tpu_current():
                return getattr(torch.tpu, target)(*args, **kwargs)
            return original(*args, **kwargs)

        return routed

    return make


def route_to_torch_tpu(accelerator: ModuleType) -> None:
    """torch.accelerator's stream/synchronize/capability functions answer through `torch.tpu`."""
    for name, target in ROUTED.items():
        if hasattr(accelerator, name):
            patch(accelerator, name, _router(target), rebind=(name,))


def route_memory_to_torch_tpu(memory: ModuleType) -> None:
    """torch.accelerator.memory's functions (and torch.accelerator's copies of them) answer through `torch.tpu`."""
    for name, target in ROUTED_MEMORY.items():
        if hasattr(memory, name):
            patch(memory, name, _router(target), rebind=(name,))


def count_job_devices(accelerator: ModuleType) -> None:
    """In a multi-process tpu_dist job `tpu:local_rank` names this process's device (see
    `distributed.registration.local_device_names`): count those indices, as CUDA counts a host's GPUs."""

    def make(original):
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

        return device_count

    patch(accelerator, "device_count", make, rebind=("device_count",))
