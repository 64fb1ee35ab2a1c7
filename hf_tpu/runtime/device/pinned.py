"""Pinned host memory on the pure-Python path (no C++ extension, whose pinned allocator makes this module
unnecessary): the tensor itself, an async copy target, not an error.

`Tensor.pin_memory()` asks the current accelerator's C++ hooks for a pinned allocator, and PyTorch's
Python PrivateUse1 hooks cannot provide one, so `DataLoader(pin_memory=True)` (whose pinning thread
calls it) would raise. JAX stages host-to-device copies itself (PJRT), so there is nothing to pin: the
tensor comes back as it is (already in host memory; `is_pinned()` stays False), with one warning. What
pinning promises on CUDA still holds: a `non_blocking=True` copy from tpu into it returns at once and
lands by the next synchronize (host_copies.py). Everything else (a CPU-only or CUDA machine, an
explicit other device) keeps PyTorch's behaviour.
"""

from __future__ import annotations

import functools
import warnings

import torch

_installed = False
_warned = False


def _is_missing_pinned_allocator(exc: BaseException) -> bool:
    return "getPinnedMemoryAllocator" in str(exc) and "PrivateUse1" in str(exc)


def install() -> None:
    global _installed
    if _installed:
        return
    original = torch.Tensor.pin_memory

    @functools.wraps(original)
    def pin_memory(self, *args, **kwargs):
        try:
            return original(self, *args, **kwargs)
        except (NotImplementedError, RuntimeError) as exc:
            if not _is_missing_pinned_allocator(exc):
                raise
        global _warned
        if not _warned:
            _warned = True
            warnings.warn(
                "hf_tpu: pin_memory() returns the tensor itself while tpu is the accelerator (JAX stages "
                "host-to-device copies itself); non_blocking copies from tpu into it are asynchronous, as "
                "into pinned memory on CUDA: synchronize (torch.tpu.synchronize() or an Event) before reading.",
                stacklevel=2,
            )
        from hf_tpu.runtime.buffers import host_copies

        return host_copies.mark_async_target(self)

    torch.Tensor.pin_memory = pin_memory
    _installed = True
