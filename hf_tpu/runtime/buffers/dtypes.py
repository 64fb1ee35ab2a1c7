"""torch dtype <-> JAX dtype, and what each platform can hold."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

_TORCH_TO_NUMPY: dict[torch.dtype, np.dtype] = {
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
    torch.float16: np.dtype(np.float16),
    torch.bfloat16: np.dtype(ml_dtypes.bfloat16),
    torch.int8: np.dtype(np.int8),
    torch.int16: np.dtype(np.int16),
    torch.int32: np.dtype(np.int32),
    torch.int64: np.dtype(np.int64),
    torch.uint8: np.dtype(np.uint8),
    torch.uint16: np.dtype(np.uint16),
    torch.uint32: np.dtype(np.uint32),
    torch.uint64: np.dtype(np.uint64),
    torch.bool: np.dtype(np.bool_),
    torch.complex64: np.dtype(np.complex64),
    torch.complex128: np.dtype(np.complex128),
    torch.float8_e4m3fn: np.dtype(ml_dtypes.float8_e4m3fn),
    torch.float8_e5m2: np.dtype(ml_dtypes.float8_e5m2),
}
_NUMPY_TO_TORCH: dict[np.dtype, torch.dtype] = {v: k for k, v in _TORCH_TO_NUMPY.items()}

# numpy cannot exchange these with torch directly: move them as same-width integers
_BITCAST_VIA: dict[torch.dtype, torch.dtype] = {
    torch.bfloat16: torch.int16,
    torch.float8_e4m3fn: torch.uint8,
    torch.float8_e5m2: torch.uint8,
    torch.uint16: torch.int16,
    torch.uint32: torch.int32,
    torch.uint64: torch.int64,
}


class UnsupportedDtypeError(TypeError):
    """A dtype the tpu device cannot hold on this platform."""


# dtypes some platforms cannot hold on the device (XLA:TPU has no 64-bit floating point)
_HOST_ONLY_DTYPES = (torch.float64, torch.complex128)


def check_platform_dtype(dtype: torch.dtype) -> None:
    """XLA on TPU has no float64: say so instead of silently computing in lower precision."""
    if dtype not in _HOST_ONLY_DTYPES:
        return
    from hf_tpu.runtime.buffers import platform

    if not platform.supports_float64():
        raise UnsupportedDtypeError(
            f"{dtype} is not supported on TPU (XLA:TPU has no 64-bit floating point). Use torch.float32 or "
            "torch.bfloat16, or keep this tensor on CPU. (float64 works when hf_tpu runs on JAX's CPU/GPU platform.)"
        )


def to_jax_dtype(dtype: torch.dtype) -> np.dtype:
    try:
        return _TORCH_TO_NUMPY[dtype]
    except KeyError:
        raise UnsupportedDtypeError(
            f"dtype {dtype} is not supported on the tpu device; supported: "
            f"{', '.join(sorted(str(d) for d in _TORCH_TO_NUMPY))}"
        ) from None


def to_torch_dtype(dtype) -> torch.dtype:
    return _NUMPY_TO_TORCH[np.dtype(dtype)]


def numpy_from_torch(t: torch.Tensor) -> np.ndarray:
    """A numpy array with t's values and dtype (bf16/fp8 included), sharing memory when possible."""
    t = t.detach().resolve_conj().resolve_neg()
    via = _BITCAST_VIA.get(t.dtype)
    if via is None:
        return t.numpy()
    return t.view(via).numpy().view(_TORCH_TO_NUMPY[t.dtype])


def torch_from_numpy(a: np.ndarray) -> torch.Tensor:
    """A CPU tensor holding a (writable copy of) numpy array a."""
    dtype = _NUMPY_TO_TORCH[a.dtype]
    a = np.array(a, copy=True, order="C")
    via = _BITCAST_VIA.get(dtype)
    if via is None:
        return torch.from_numpy(a)
    return torch.from_numpy(a.view(_TORCH_TO_NUMPY[via])).view(dtype)


_FLOAT8_E4M3FN = np.dtype(ml_dtypes.float8_e4m3fn)
_E4M3FN_MAX = 448.0


def convert(x, dtype):
    """Traceable `x.astype(dtype)` with PyTorch's conversion rules where XLA's differ: float8_e4m3fn has
    no infinity, and c10 saturates finite overflow and ±inf to ±448 (NaN stays NaN) where XLA gives NaN."""
    if dtype == _FLOAT8_E4M3FN and x.dtype != dtype and x.dtype != np.bool_:
        import jax.numpy as jnp

        if not jnp.issubdtype(x.dtype, jnp.complexfloating):
            x = jnp.clip(x, -_E4M3FN_MAX, _E4M3FN_MAX)
    return x.astype(dtype)
