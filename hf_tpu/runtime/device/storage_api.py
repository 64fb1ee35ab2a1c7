"""Storages torch creates itself on tpu: `torch.UntypedStorage(n, device="tpu")` and what is built on it.

`torch.load(..., map_location="tpu")` (and loading a checkpoint saved from tpu), `copy.deepcopy` of tpu
tensors, of modules with buffers and of state dicts, and pickling all allocate a storage through the
device's C++ allocator, then copy bytes into it. A PrivateUse1 backend defined in Python has no such
allocator, and those calls crashed the process (a null allocator, SIGSEGV). Here a tpu storage of n bytes
is a registry storage whose payload is n bytes (uint8, zeros until written); the first typed tensor set
onto it whole (`tensor.set_(storage, ...)`, how torch.load and deepcopy rebuild tensors) turns the payload
into that dtype, so the tensor reads its values directly instead of reinterpreting bytes at every op.
A clone of a tpu storage shares its (immutable) array, like `copy_` of a whole tensor.
"""

from __future__ import annotations

import torch

from hf_tpu.runtime.buffers.storage import DEVICE
from hf_tpu.runtime.tensors.storages import byteswap_storage, clone_storage, new_byte_storage

_installed = False


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


def install() -> None:
    """Route tpu storage construction and cloning to the registry (torch's own path needs an allocator)."""
    global _installed
    if _installed:
        return
    base_new = torch.UntypedStorage.__new__
    base_clone = torch.UntypedStorage.clone

    def __new__(cls, *args, device=None, **kwargs):
        if _is_tpu(device):
            if kwargs or len(args) > 1 or (args and not isinstance(args[0], int)):
                # from a sequence of bytes (or other arguments): build it on CPU, then move it
                return base_new(cls, *args, **kwargs).to(DEVICE)
            return new_byte_storage(args[0] if args else 0)
        if device is None:
            return base_new(cls, *args, **kwargs)
        return base_new(cls, *args, device=device, **kwargs)

    def clone(self):
        if self.device.type == "tpu":
            return clone_storage(self)
        return base_clone(self)

    base_byteswap = torch.UntypedStorage._byteswap

    def _byteswap(self, elem_size):
        if self.device.type == "tpu":
            return byteswap_storage(self, elem_size)
        return base_byteswap(self, elem_size)

    base_resize = torch.UntypedStorage.resize_

    def resize_(self, size):
        if self.device.type == "tpu" and size != self.nbytes():
            raise NotImplementedError(
                f"hf_tpu: a tpu storage cannot be resized in place ({self.nbytes()} -> {size} bytes): its "
                "payload is one fixed-size device buffer. Resize the tensor instead (tensor.resize_(...), which "
                "moves it to a new storage) or allocate a new one."
            )
        return base_resize(self, size) if self.device.type != "tpu" else self

    torch.UntypedStorage.__new__ = __new__
    torch.UntypedStorage.clone = clone
    torch.UntypedStorage._byteswap = _byteswap
    torch.UntypedStorage.resize_ = resize_
    _installed = True
