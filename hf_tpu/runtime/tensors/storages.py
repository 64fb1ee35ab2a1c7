"""Storages torch creates itself on tpu (`torch.UntypedStorage(n, device="tpu")`, torch.load, deepcopy):
a registry storage of n bytes (uint8, zeros until written) that takes the dtype of the first typed tensor
set onto it whole, so that tensor reads its values directly instead of reinterpreting bytes at every op.
`hf_tpu.integrations.torch_storage` routes torch's storage constructors here.

`resize_storage` is `UntypedStorage.resize_` on tpu (FSDP2 frees and reallocates unsharded parameters
with it): the storage object stays and gets a new payload size under a fresh fake pointer. Reached from
torch's Python method through hf_tpu's storage patch and from torch's C++ `resize_` through the
extension's `resizePrivateUse1Bytes` hook (native_callbacks.resize_storage).
"""

from __future__ import annotations

import math

import torch

from hf_tpu.runtime.buffers import platform
from hf_tpu.runtime.buffers.dtypes import to_jax_dtype
from hf_tpu.runtime.buffers.memory import check_capacity
from hf_tpu.runtime.buffers.storage import REGISTRY
from hf_tpu.runtime.buffers.threads import array_of
from hf_tpu.runtime.launch import lazy
from hf_tpu.runtime.tensors.tensor import _as_bytes, _from_bytes

# pointers of storages created as bytes, not yet given a dtype by a tensor set onto them
_untyped: set[int] = set()


def new_byte_storage(nbytes: int) -> torch.UntypedStorage:
    """A tpu storage of `nbytes` bytes, zeros until written."""
    check_capacity(nbytes)
    storage = REGISTRY.new_storage(nbytes, (nbytes,), torch.uint8)
    _untyped.add(storage.data_ptr())
    return storage


def clone_storage(storage: torch.UntypedStorage) -> torch.UntypedStorage:
    """A new tpu storage holding `storage`'s bytes (sharing its array: payload arrays are never mutated)."""
    p = REGISTRY.payload(storage.data_ptr())
    if p is None:
        raise RuntimeError("hf_tpu: cannot clone a tpu storage without a payload")

    array = array_of(p)  # not one another thread is donating
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


def resize_storage(storage: torch.UntypedStorage, nbytes: int) -> None:
    """`UntypedStorage.resize_(nbytes)` on tpu, with PyTorch's semantics (FSDP2 frees an unsharded
    parameter's storage with `resize_(0)` and reallocates it with `resize_(n)` before all-gathering into
    it): the storage object and every tensor viewing it stay, and see the new payload; 0 frees the
    payload; the first min(old, new) bytes are kept, the rest reads as zeros (uninitialized in torch).
    Like a CPU reallocation, the storage gets a new (fake) data pointer whenever its size changes."""
    nbytes = int(nbytes)
    if nbytes < 0:
        raise RuntimeError(f"resize_: new size must be non-negative, got {nbytes}")
    old = storage.nbytes()
    if nbytes == old:
        return
    ptr = storage.data_ptr()
    p = REGISTRY.payload(ptr)
    if p is None:
        raise RuntimeError("hf_tpu: cannot resize a tpu storage without a payload")
    if nbytes > old:
        check_capacity(nbytes)
    shape, dtype = _resized_layout(p.shape, p.dtype, nbytes)
    array = None  # never written: reads as zeros
    if nbytes and old and p.array is not None:
        array = _resized_array(lazy.concrete(array_of(p)), p.dtype, dtype, shape, min(old, nbytes))
    new_ptr = REGISTRY.resize(storage, nbytes, shape, dtype, array)
    if ptr in _untyped:
        _untyped.discard(ptr)
        _untyped.add(new_ptr)


def _resized_layout(shape: tuple, dtype: torch.dtype, nbytes: int) -> tuple[tuple, torch.dtype]:
    """The payload layout of a storage of `shape`/`dtype` resized to `nbytes`: its trailing dims kept when
    whole rows fit (freed, a (4, 8) payload is (0, 8) and comes back as (4, 8)), else flat in its dtype,
    else bytes."""
    size = dtype.itemsize
    row = math.prod(shape[1:]) * size if shape else size
    if shape and row and nbytes % row == 0:
        return (nbytes // row, *shape[1:]), dtype
    if nbytes % size == 0:
        return (nbytes // size,), dtype
    return (nbytes,), torch.uint8


def _resized_array(array, old_dtype: torch.dtype, dtype: torch.dtype, shape: tuple, keep: int):
    """`array` (of `old_dtype`) cut or zero-padded to `shape`/`dtype`, its first `keep` bytes kept."""
    jax = platform.jax()
    jnp = jax.numpy
    if dtype == old_dtype:
        flat = array.reshape(-1)
        keep //= dtype.itemsize
    else:  # resized to a size its dtype does not divide: the payload becomes bytes
        flat = _as_bytes(jax, array)
    flat = flat[:keep]
    total = math.prod(shape)
    if total > keep:
        flat = jnp.concatenate([flat, jnp.zeros((total - keep,), flat.dtype)])
    return flat.reshape(shape)
