"""Host <-> device copies, casts and scalar reads: `.to`, `.cpu()`, `.item()`, `copy_`."""

from __future__ import annotations

from functools import cache

import torch

from hf_tpu.runtime.buffers import global_mesh, host_copies, platform
from hf_tpu.runtime.buffers.dtypes import convert, to_jax_dtype
from hf_tpu.runtime.buffers.placement import host_to_jax, jax_to_host
from hf_tpu.runtime.buffers.platform import MULTI_CHIP
from hf_tpu.runtime.buffers.platform import check_index as _check_index
from hf_tpu.runtime.launch import lazy
from hf_tpu.runtime.lowerings.table import lowers
from hf_tpu.runtime.tensors.overlap import check_write
from hf_tpu.runtime.tensors.sharding import follow_placement
from hf_tpu.runtime.tensors.strided import inverse_order, memory_order
from hf_tpu.runtime.tensors.tensor import (
    new_strided,
    new_tensor,
    to_jax,
    to_jax_lazy,
    write,
)


@cache
def _convert(shape, dtype):
    jax = platform.jax()

    def to_dtype(x):
        return jax.numpy.broadcast_to(convert(x, dtype), shape)

    return jax.jit(to_dtype)


def _fit(a, shape, dtype):
    jdt = to_jax_dtype(dtype)
    if a.dtype == jdt and tuple(a.shape) == tuple(shape):
        return a
    return lazy.maybe_call(_convert(tuple(shape), jdt), (a,))


@lowers("aten::copy_", kind="host")
def copy_(self: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    if self.device.type == "tpu":
        if _same_view(self, src):  # `x.copy_(x)` (aot_autograd's write-back of an input a compiled
            return self  # graph stored already): reading then storing would undo another thread's update
        check_write(self, src if src.device.type == "tpu" else None)  # CPU's memory-overlap errors
        if src.device.type == "tpu":
            value = to_jax_lazy(src)
        elif src.device.type == "cpu":
            value = host_to_jax(src)
        else:
            raise RuntimeError(f"hf_tpu: cannot copy from {src.device} to tpu; move it to cpu first")
        write(self, _fit(value, self.shape, self.dtype))
        return self
    # tpu -> host: asynchronous into pinned targets (CUDA's contract), else now, after earlier async ones;
    # a tensor split over other processes' chips (HF_TPU_MESH=global) is gathered now
    value = to_jax(src)
    if non_blocking and host_copies.is_async_target(self) and not global_mesh.needs_gather(value):
        host_copies.copy_async(self, value)
        return self
    host_copies.complete()
    host = jax_to_host(value)
    return self.copy_(host)


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        b.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
        and b.device == a.device
        and b.dtype == a.dtype
        and b.storage_offset() == a.storage_offset()
        and b.shape == a.shape
        and b.stride() == a.stride()
        and b.is_neg() == a.is_neg()
        and b.is_conj() == a.is_conj()
    )


@lowers("aten::_copy_from", kind="host")
def _copy_from(self: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    return copy_(dst, self, non_blocking)


@lowers("aten::_copy_from_and_resize", kind="host")
def _copy_from_and_resize(self: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    if tuple(dst.shape) != tuple(self.shape):
        dst.resize_(self.shape)
    return copy_(dst, self)


@lowers("aten::_to_copy", kind="host")
def _to_copy(
    self, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None
):
    dtype = dtype or self.dtype
    target = torch.device(device) if device is not None else self.device
    order = _copy_order(tuple(self.shape), self.stride(), memory_format)
    if target.type == "tpu":
        if target.index:
            _check_index(target)
        value = to_jax_lazy(self) if self.device.type == "tpu" else host_to_jax(self)
        value = _fit(value, self.shape, dtype)
        if order is None:
            return new_tensor(self.shape, dtype, value)
        laid_out = lazy.maybe_call(_transposed(order), (value,))
        return new_tensor(laid_out.shape, dtype, laid_out).permute(inverse_order(order))
    if target.type == "cpu":
        value = to_jax(self)
        host = jax_to_host(value if order is None else _transposed(order)(value))
        host = host if order is None else host.permute(inverse_order(order))
        return host if host.dtype == dtype else host.to(dtype)
    return self.cpu().to(device=target, dtype=dtype)


@cache
def _copy_order(shape: tuple, stride: tuple, memory_format) -> tuple | None:
    """The memory order of `.to`'s result, as PyTorch lays it out: `preserve_format` keeps a dense
    permuted layout (a transposed or channels-last tensor stays so, as CUDA copies do), an explicit
    memory format imposes its own; None: row-major."""
    like = torch.empty_strided(shape, stride, device="meta")
    out = torch.empty_like(like, memory_format=memory_format or torch.preserve_format)
    return memory_order(shape, out.stride())


@cache
def _transposed(order: tuple):
    jax = platform.jax()
    return jax.jit(lambda x: jax.numpy.transpose(x, order))


@lowers("aten::_local_scalar_dense", kind="host")
def _local_scalar_dense(self: torch.Tensor):
    value = to_jax(self)
    return jax_to_host(value).item()


@lowers("aten::record_stream", kind="host")
def record_stream(self: torch.Tensor, stream) -> None:
    """Nothing to record: a JAX buffer stays alive until the work that reads it has finished."""
    return None


@lowers("aten::empty.memory_format", kind="host")
def empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    if device is not None and device.index:
        _check_index(device)
    dtype = dtype or torch.get_default_dtype()
    to_jax_dtype(dtype)
    if memory_format in (torch.channels_last, torch.channels_last_3d) and len(size) in (4, 5):
        stride = torch.empty(size, device="meta", memory_format=memory_format).stride()
        return new_strided(size, stride, dtype)
    return new_tensor(size, dtype)


_empty_like = torch.ops.aten.empty_like.default._handle.redispatch_boxed
_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


@lowers("aten::empty_like", kind="host")
def empty_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    """PyTorch's own `empty_like` (its composite kernel, reached through the CPU key: it allocates on
    self's device), and with several chips the result is placed on the mesh as `self` is, so
    `zeros_like(param)` (optimizer state) is sharded like its parameter."""
    out = _empty_like(
        _CPU_KEYS,
        self,
        dtype=dtype,
        layout=layout,
        device=device,
        pin_memory=pin_memory,
        memory_format=memory_format,
    )
    if MULTI_CHIP[0] and out.device.type == "tpu" and self.device.type == "tpu":
        follow_placement(out, self)
    return out


@lowers("aten::empty_strided", kind="host")
def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    if device is not None and device.index:
        _check_index(device)
    dtype = dtype or torch.get_default_dtype()
    to_jax_dtype(dtype)
    return new_strided(size, stride, dtype)


@lowers("aten::_efficientzerotensor", kind="host")
def efficientzerotensor(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    """torch.func's forward-mode zero tangents (jacfwd, hessian): a plain tensor of zeros here, as a
    never-written storage reads (CPU's is a storage-less ZeroTensor; the values are the same)."""
    if device is not None and device.index:
        _check_index(device)
    dtype = dtype or torch.get_default_dtype()
    to_jax_dtype(dtype)
    return new_tensor(size, dtype)


@lowers("aten::resize_", kind="host")
def resize_(self: torch.Tensor, size, *, memory_format=None) -> torch.Tensor:
    """Grow into a new storage when needed, keeping the old values (PyTorch semantics). The same size
    without a memory format changes nothing, as on CPU: `torch.zeros(shape, out=x[:, :2])` and
    `out=b.expand(...)` keep their strides and storage (restrided, they were written elsewhere)."""
    import math

    size = tuple(size)
    if size == tuple(self.shape) and memory_format is None:
        return self
    strides = _contig(size) if memory_format is None else _strides_in(size, memory_format)
    needed = (self.storage_offset() + math.prod(size)) * self.dtype.itemsize
    storage = self.untyped_storage()
    if needed <= storage.nbytes():
        self.as_strided_(size, strides)
        return self
    old = to_jax(self) if self.numel() else None
    fresh = new_tensor(size, self.dtype)
    if old is not None:
        jnp = platform.jax().numpy
        flat = (
            jnp.zeros(math.prod(size), dtype=old.dtype).at[: old.size].set(old.reshape(-1)[: math.prod(size)])
        )
        write(fresh, flat.reshape(size))
    self.set_(fresh.untyped_storage(), 0, size, _contig(size))
    if strides != _contig(size):
        self.as_strided_(size, strides)
    return self


def _strides_in(size: tuple, memory_format: torch.memory_format) -> tuple:
    """The strides of a dense tensor of `size` in `memory_format` (channels-last and the like)."""
    return torch.empty(size, device="meta", memory_format=memory_format).stride()


def _contig(size):
    from hf_tpu.runtime.tensors.tensor import contiguous_strides

    return contiguous_strides(tuple(size))
