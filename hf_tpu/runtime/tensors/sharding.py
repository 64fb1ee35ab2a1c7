"""Laying tpu tensors out over the chips: `shard`, `replicate`, `sharding` (hf_tpu's public names).

A tensor that is its storage's whole buffer (a parameter, a batch) is re-laid out in place: the same
tensor object (and `nn.Parameter`) now has a buffer split over the chips, so a module keeps working
without re-registering anything. A view, or a CPU tensor, gives a new tpu tensor laid out by the spec
(a CPU tensor is copied straight into its parts: no chip ever holds the whole of it).
"""

from __future__ import annotations

import torch

from hf_tpu.runtime.buffers import placement
from hf_tpu.runtime.buffers.placement import PlacementError
from hf_tpu.runtime.buffers.storage import REGISTRY
from hf_tpu.runtime.buffers.threads import DONATION_LOCK
from hf_tpu.runtime.launch import lazy
from hf_tpu.runtime.tensors.tensor import new_tensor, to_jax


def _describe(t: torch.Tensor) -> str:
    return "tensor"


def _whole_storage(t: torch.Tensor):
    """t's payload when t is its storage's whole buffer (same shape, dtype, offset 0, contiguous)."""
    p = REGISTRY.payload(t.untyped_storage().data_ptr())
    if (
        p is None
        or p.dtype != t.dtype
        or t.storage_offset() != 0
        or tuple(t.shape) != p.shape
        or not t.is_contiguous()
        or t.is_neg()
        or t.is_conj()
    ):
        return None
    return p


def shard(tensor: torch.Tensor, spec) -> torch.Tensor:
    """`tensor` laid out over the current mesh by `spec`: one entry per dim, each None (not split), an axis
    name of the mesh, or a tuple of names (`("data", None)` splits dim 0 over axis "data").

    A tpu tensor that is a whole storage is re-laid out in place and returned; a view or a CPU tensor
    gives a new tpu tensor. Dims must divide into the axis sizes."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"hf_tpu.shard expects a torch.Tensor, got {type(tensor).__name__}")
    what = _describe(tensor)
    if tensor.device.type == "cpu":
        from hf_tpu.runtime.buffers.placement import host_to_jax

        spec = placement.normalize_spec(spec, tuple(tensor.shape), what)
        out = new_tensor(tuple(tensor.shape), tensor.dtype, host_to_jax(tensor.detach(), spec))
        return out.requires_grad_(tensor.requires_grad) if tensor.is_floating_point() else out
    if tensor.device.type != "tpu":
        raise PlacementError(
            f"hf_tpu.shard: the {what} of shape {tuple(tensor.shape)} is on {tensor.device}; move it to cpu or tpu first"
        )
    p = _whole_storage(tensor)
    if p is None:
        value = to_jax(tensor)
        return new_tensor(tuple(tensor.shape), tensor.dtype, placement.place(value, spec, what))
    array = lazy.concrete(p.array) if p.array is not None else None
    if array is None:  # never written: zeros, laid out
        array = to_jax(tensor)
    placed = placement.place(array, spec, what)
    with DONATION_LOCK:
        REGISTRY.store(p, placed)
    return tensor


def replicate(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` as a full copy on every chip of the current mesh (see `shard`)."""
    return shard(tensor, ())


def sharding(tensor: torch.Tensor) -> tuple:
    """How `tensor` is split over the chips: one entry per dim (None where not split); all None when it
    is replicated or unsharded (`hf_tpu.is_replicated` tells those apart)."""
    if tensor.device.type != "tpu":
        return (None,) * tensor.dim()
    p = _whole_storage(tensor)
    array = lazy.concrete(p.array) if p is not None and p.array is not None else to_jax(tensor)
    return placement.spec_of(array)


def placed_on_mesh(tensor: torch.Tensor) -> bool:
    """Whether `tensor` lives on the mesh (sharded or replicated), rather than unsharded on one chip."""
    if tensor.device.type != "tpu":
        return False
    p = _whole_storage(tensor)
    array = lazy.concrete(p.array) if p is not None and p.array is not None else to_jax(tensor)
    return placement.on_mesh(array)


def follow_placement(out: torch.Tensor, like: torch.Tensor) -> None:
    """`out` (a fresh, never-written tpu tensor of `like`'s shape: `empty_like` and so `zeros_like`,
    `randn_like`, optimizer state) takes `like`'s placement on the mesh, as zeros placed there."""
    src = _whole_storage(like)
    dst = _whole_storage(out)
    if src is None or dst is None or dst.array is not None or src.shape != dst.shape:
        return
    array = src.array
    if type(array) is lazy.LazyValue:
        array = array.concrete
    if array is None or not placement.on_mesh(array):
        return
    REGISTRY.store(dst, placement.zeros_like_placed(array, out.dtype))
