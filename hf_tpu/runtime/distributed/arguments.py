"""What every tpu_dist collective checks of its own arguments before the ranks compare them: tpu
tensors only, equal shapes where one collective needs them, and the signature the ranks agree on."""

from __future__ import annotations

import torch


class NotATpuTensorError(TypeError):
    """A tpu_dist collective was given a tensor that is not on the tpu device."""


class GlobalTensorInCollectiveError(ValueError):
    """A tpu_dist collective was given a tensor placed on the global mesh (HF_TPU_MESH=global)."""


def check_tensors(tensors, collective: str) -> None:
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tpu_dist {collective}: argument {i} is a {type(t).__name__}, not a tensor")
        if t.device.type != "tpu":
            raise NotATpuTensorError(
                f"tpu_dist {collective}: tensor {i} (shape {tuple(t.shape)}, {t.dtype}) is on {t.device}; "
                "tpu_dist collectives take tpu tensors: move it with .to('tpu'), or run cpu tensors through "
                "a gloo group (dist.new_group(backend='gloo'))"
            )
        if _on_global_mesh(t):
            raise GlobalTensorInCollectiveError(
                f"tpu_dist {collective}: tensor {i} (shape {tuple(t.shape)}, {t.dtype}) is placed on the global "
                "mesh (HF_TPU_MESH=global): it is already one value over every process, and ops on it run as "
                "one program across the processes (XLA adds the collectives). tpu_dist collectives take "
                "process-local tensors: reduce it with tensor ops, or give the collective t.cpu().to('tpu')"
            )


def _on_global_mesh(t: torch.Tensor) -> bool:
    """Whether `t`'s buffer is a global array split or copied over other processes' chips."""
    from hf_tpu.runtime.buffers import global_mesh

    if not global_mesh.enabled():
        return False
    from hf_tpu.runtime.buffers.storage import REGISTRY
    from hf_tpu.runtime.launch import lazy

    payload = REGISTRY.payload(t.untyped_storage().data_ptr())
    array = lazy.concrete(payload.array) if payload is not None and payload.array is not None else None
    return array is not None and not getattr(array, "is_fully_addressable", True)


def signature(tensors, **extra) -> dict:
    """A collective's signature for the agreement: the shape and dtype of its tensor(s), and `extra`."""
    if len(tensors) == 1:
        base = {"shape": list(tensors[0].shape), "dtype": dtype_name(tensors[0].dtype)}
    else:
        base = {"shapes": [list(t.shape) for t in tensors], "dtypes": [dtype_name(t.dtype) for t in tensors]}
    return {**base, **extra}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def same_shapes(tensors, shape: tuple, collective: str, what: str) -> None:
    for i, t in enumerate(tensors):
        if tuple(t.shape) != shape:
            raise ValueError(
                f"tpu_dist {collective}: {what} {i} has shape {tuple(t.shape)}, expected {shape} (tensors of "
                "one collective must have equal shapes)"
            )
