"""View and storage-metadata kernels: PyTorch's own CPU kernels compute sizes/strides/offsets only,
so they are reused for tpu tensors by redispatching to the CPU key (views alias storage natively)."""

from __future__ import annotations

import torch

from hf_tpu.runtime.lowerings.table import resolve

_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)

# ops whose CPU kernel touches metadata only (the rest of the view ops are composite: they call these)
METADATA_OPS = (
    "view",
    "as_strided",
    "_reshape_alias",
    "unfold",
    "view_as_real",
    "view_as_complex",
    "set_.source_Storage_storage_offset",
    "set_.source_Storage",
    "set_.source_Tensor",
    "set_",
    "is_set_to",
)


def _redispatch_to_cpu(op):
    handle = op._handle

    def kernel(*args, **kwargs):
        return handle.redispatch_boxed(_CPU_KEYS, *args, **kwargs)

    return kernel


# setting a storage into a tensor: a byte storage torch allocated takes the tensor's dtype (integrations/torch_storage.py)
_SET_STORAGE_OPS = ("set_.source_Storage_storage_offset", "set_.source_Storage")


def _set_storage(op):
    handle = op._handle
    from hf_tpu.runtime.tensors.storages import adopt_dtype

    def kernel(*args, **kwargs):
        out = handle.redispatch_boxed(_CPU_KEYS, *args, **kwargs)
        adopt_dtype(args[0])
        return out

    return kernel


def _set_empty(op):
    """`x.set_()`: an empty storage of x's device (CPU's kernel would give it an empty CPU storage)."""

    def kernel(self):
        from hf_tpu.runtime.tensors.tensor import new_tensor

        return self.set_(new_tensor((0,), self.dtype).untyped_storage(), 0, (0,), (1,))

    return kernel


def register_view_kernels(lib: torch.library.Library, native_kernel=None) -> None:
    """`native_kernel(name)`: registers the same CPU redispatch in C++ (no Python per view), when the
    extension is in use; `set_` and its overloads stay here (storages may take the tensor's dtype)."""
    for name in METADATA_OPS:
        if native_kernel is not None and not name.startswith("set_"):
            native_kernel(name)
            continue
        if name == "set_":
            kernel = _set_empty
        else:
            kernel = _set_storage if name in _SET_STORAGE_OPS else _redispatch_to_cpu
        lib.impl(name, kernel(resolve(name)), "PrivateUse1")
