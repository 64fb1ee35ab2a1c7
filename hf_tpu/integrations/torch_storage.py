"""Storages torch creates itself on tpu: `torch.UntypedStorage(n, device="tpu")` and what is built on it.

`torch.load(..., map_location="tpu")` (and loading a checkpoint saved from tpu), `copy.deepcopy` of tpu
tensors, of modules with buffers and of state dicts, and pickling all allocate a storage through the
device's C++ allocator, then copy bytes into it. A PrivateUse1 backend defined in Python has no such
allocator, and those calls crashed the process (a null allocator, SIGSEGV). Here a tpu storage of n bytes
is a registry storage whose payload is n bytes (uint8, zeros until written); the first typed tensor set
onto it whole (`tensor.set_(storage, ...)`, how torch.load and deepcopy rebuild tensors) turns the payload
into that dtype, so the tensor reads its values directly instead of reinterpreting bytes at every op
(hf_tpu.runtime.tensors.storages). A clone of a tpu storage shares its (immutable) array, like `copy_` of a
whole tensor. Applied at `import hf_tpu` through `patching.patch` (table.PATCHES).
"""

from __future__ import annotations

from types import ModuleType

import torch

from hf_tpu.integrations.patching import patch


def _is_tpu(device) -> bool:
    if device is None:
        return False
    device = torch.device(device) if not isinstance(device, torch.device) else device
    if device.type != "tpu":
        return False
    if device.index:
        from hf_tpu.runtime.device.device_module import _check_index

        _check_index(device)
    return True


def _new(original):
    def __new__(cls, *args, device=None, **kwargs):
        if _is_tpu(device):
            if kwargs or len(args) > 1 or (args and not isinstance(args[0], int)):
                # from a sequence of bytes (or other arguments): build it on CPU, then move it
                from hf_tpu.runtime.buffers.storage import DEVICE

                return original(cls, *args, **kwargs).to(DEVICE)
            from hf_tpu.runtime.tensors.storages import new_byte_storage

            return new_byte_storage(args[0] if args else 0)
        if device is None:
            return original(cls, *args, **kwargs)
        return original(cls, *args, device=device, **kwargs)

    return __new__


def _clone(original):
    def clone(self):
        if self.device.type == "tpu":
            from hf_tpu.runtime.tensors.storages import clone_storage

            return clone_storage(self)
        return original(self)

    return clone


def _byteswap(original):
    def _byteswap(self, elem_size):
        if self.device.type == "tpu":
            from hf_tpu.runtime.tensors.storages import byteswap_storage

            return byteswap_storage(self, elem_size)
        return original(self, elem_size)

    return _byteswap


def _resize(original):
    def resize_(self, size):
        if self.device.type == "tpu":
            # PyTorch's semantics on the registry storage (FSDP2 frees and reallocates with it)
            from hf_tpu.runtime.tensors.storages import resize_storage

            resize_storage(self, size)
            return self
        return original(self, size)

    return resize_


def route_tpu_storages(storage_module: ModuleType) -> None:
    """Route tpu storage construction, cloning, byte swapping and resizing to the runtime's registry
    (torch's own path needs a C++ allocator)."""
    cls = storage_module.UntypedStorage
    patch(cls, "__new__", _new)
    patch(cls, "clone", _clone)
    patch(cls, "_byteswap", _byteswap)
    patch(cls, "resize_", _resize)
