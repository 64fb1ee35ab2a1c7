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

from hf_tpu.runtime.storage import DEVICE, REGISTRY

_installed = False
# pointers of storages created as bytes, not yet given a dtype by a tensor set onto them
_untyped: set[int] = set()


def _is_tpu(device) -> bool:
    if device is None:
        return False
    device = torch.device(device) if not isinstance(device, torch.device) else device
    if device.type != "tpu":
        return False
    if device.index:
        from hf_tpu.runtime.device_module import _check_index

        _check_index(device)
    return True


def new_byte_storage(nbytes: int) -> torch.UntypedStorage:
    """A tpu storage of `nbytes` bytes, zeros until written."""
    from hf_tpu.runtime.memory import check_capacity

    check_capacity(nbytes)
    storage = REGISTRY.new_storage(nbytes, (nbytes,), torch.uint8)
    _untyped.add(storage.data_ptr())
    return storage


def clone_storage(storage: torch.UntypedStorage) -> torch.UntypedStorage:
    """A new tpu storage holding `storage`'s bytes (sharing its array: payload arrays are never mutated)."""
    p = REGISTRY.payload(storage.data_ptr())
    if p is None:
        raise RuntimeError("hf_tpu: cannot clone a tpu storage without a payload")
    from hf_tpu.runtime import lazy
    from hf_tpu.runtime.tensor import _array_of

    array = _array_of(p)  # not one another thread is donating
    if type(array) is lazy.LazyValue and array.concrete is not None:
        array = array.concrete
    clone = REGISTRY.new_storage(p.nbytes, p.shape, p.dtype, array)
    if storage.data_ptr() in _untyped:
        _untyped.add(clone.data_ptr())
    return clone


def adopt_dtype(tensor: torch.Tensor) -> None:
    """After `tensor.set_(storage, ...)`: a byte storage from `new_byte_storage` takes `tensor`'s dtype."""
    if not _untyped:
        return
    storage = tensor.untyped_storage()
    ptr = storage.data_ptr()
    if ptr not in _untyped:
        return
    dtype = tensor.dtype
    if dtype == torch.uint8:
        return
    _untyped.discard(ptr)
    p = REGISTRY.payload(ptr)
    size = dtype.itemsize
    if p is None or p.dtype != torch.uint8 or p.nbytes % size:
        return
    from hf_tpu.runtime import lazy, platform
    from hf_tpu.runtime.dtypes import to_jax_dtype
    from hf_tpu.runtime.tensor import _from_bytes

    shape = (p.nbytes // size,)
    if p.array is not None:
        jax = platform.jax()
        array = lazy.concrete(p.array)
        p.array = _from_bytes(jax, array.reshape(shape[0], size), to_jax_dtype(dtype))
    p.shape, p.dtype = shape, dtype


def byteswap_storage(storage: torch.UntypedStorage, elem_size: int) -> None:
    """`UntypedStorage.byteswap` on tpu (torch's kernel reads the storage's fake pointer on the host)."""
    nbytes = storage.nbytes()
    if elem_size not in (1, 2, 4, 8):
        raise ValueError(f"byteswap: elem_size must be 1, 2, 4 or 8, got {elem_size}")
    if nbytes % elem_size:
        raise RuntimeError(
            f"byteswap: the storage's {nbytes} bytes are not a multiple of elem_size {elem_size}"
        )
    if elem_size == 1 or nbytes == 0:
        return
    rows = torch.empty(0, dtype=torch.uint8, device=storage.device)
    rows.set_(storage, 0, (nbytes // elem_size, elem_size), (elem_size, 1))
    rows.copy_(rows.flip(-1))


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
