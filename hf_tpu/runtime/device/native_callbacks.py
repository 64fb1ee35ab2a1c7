"""What the C++ extension calls back into: the device work behind its events and stream sync.

The extension (hf_tpu.runtime.native) registers PyTorch's C++ device guard; a generic
`torch.Event(device="tpu")` or `torch.Stream(device="tpu")` then reaches these functions, so it has
exactly the semantics of `torch.tpu.Event`/`torch.tpu.synchronize()`; a storage resize reaching the
C++ hook (`resizePrivateUse1Bytes`) resizes the registry storage here.
"""

from __future__ import annotations

import torch

from hf_tpu.runtime.device import device_module


def new_event(enable_timing: bool) -> device_module.Event:
    return device_module.Event(enable_timing=enable_timing)


def synchronize() -> None:
    device_module.synchronize()


def check_device_index(index: int) -> None:
    """`torch.Generator("tpu:N")`: the same check (and error) as every other tpu:N."""
    device_module._check_index(torch.device("tpu", index))


def resize_storage(storage: torch.UntypedStorage, nbytes: int) -> None:
    """`UntypedStorage.resize_` on tpu reaching PyTorch's C++ hook (`resizePrivateUse1Bytes`)."""
    from hf_tpu.runtime.tensors.storages import resize_storage as resize

    resize(storage, nbytes)
