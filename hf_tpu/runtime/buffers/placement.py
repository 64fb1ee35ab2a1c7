"""The placement layer's seam: every device array is created here, and here it is decided where it lives.

Host -> device copies (`host_to_jax`), device -> host reads (`jax_to_host`) and the arrays that stand for
empty tensors all go through this module; nothing else in hf_tpu calls `jax.device_put` or picks a chip.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import torch

from hf_tpu.runtime.buffers import host_copies, platform
from hf_tpu.runtime.buffers.dtypes import (
    check_platform_dtype,
    numpy_from_torch,
    to_jax_dtype,
    torch_from_numpy,
)


def host_to_jax(t: torch.Tensor):
    """A device buffer holding a copy of CPU tensor `t`.

    On JAX's CPU platform `device_put` of a numpy view of a torch tensor aliases its memory (even with
    `may_alias=False`, JAX 0.10.2), so a later in-place write to the CPU tensor would show through on the
    device: copy explicitly there (into a fresh numpy array only the device buffer then holds; ~5x
    cheaper than `jnp.array(..., copy=True)`). Other platforms copy to device memory anyway.
    """
    jax = platform.jax()
    to_jax_dtype(t.dtype)  # clear error for unsupported dtypes
    check_platform_dtype(t.dtype)
    if t.numel() == 0:  # transformers' caches start from `torch.tensor([])` every forward
        return empty_array(tuple(t.shape), t.dtype)
    host_copies.complete_into(t)  # a non-blocking copy from tpu into it lands first (stream order)
    array = numpy_from_torch(t.contiguous() if not t.is_contiguous() else t)
    device = platform.default_device()
    if device.platform == "cpu":
        array = np.array(array, copy=True)
    return jax.device_put(array, device)


def numpy_to_jax(array: np.ndarray):
    """A device buffer holding numpy `array` (a constant made on the host)."""
    return platform.jax().device_put(array, platform.default_device())


@cache
def empty_array(shape: tuple, dtype: torch.dtype):
    """One device array per empty (shape, dtype): it holds no data, and arrays are immutable."""
    return numpy_to_jax(np.zeros(shape, dtype=to_jax_dtype(dtype)))


def jax_to_host(a) -> torch.Tensor:
    """A CPU tensor holding device array `a`'s values (gathered from every chip that holds a part)."""
    return torch_from_numpy(np.asarray(a))
