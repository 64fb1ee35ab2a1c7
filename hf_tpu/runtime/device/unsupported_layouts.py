"""Sparse, quantized and (strided) nested tensors on tpu: one clear error instead of PyTorch's
"Could not run 'aten::...' with arguments from the 'Sparsetpu' backend ... selective/custom build".

The tpu device holds dense strided tensors (a JAX array per storage). These layouts reach their own
dispatch keys (SparsePrivateUse1, ...), where no kernel exists; a boxed fallback on each key says what is
unsupported and what to do instead. Jagged nested tensors (`layout=torch.jagged`) are dense tensors
underneath and keep working.
"""

from __future__ import annotations

import torch

_LAYOUTS = {
    "SparsePrivateUse1": (
        "sparse COO tensors",
        "keep them on CPU, or convert with .to_dense() before moving to tpu",
    ),
    "SparseCsrPrivateUse1": (
        "sparse compressed (CSR/CSC/BSR/BSC) tensors",
        "keep them on CPU, or convert with .to_dense() before moving to tpu",
    ),
    "QuantizedPrivateUse1": (
        "quantized tensors",
        "call .dequantize() before moving to tpu (or keep the quantized model on CPU)",
    ),
    "NestedTensorPrivateUse1": (
        "nested tensors with layout=torch.strided",
        "build them with torch.nested.nested_tensor(..., layout=torch.jagged)",
    ),
}
_libs: list = []


def _raiser(what: str, instead: str):
    def unsupported(op, *args, **kwargs):
        raise NotImplementedError(f"hf_tpu: {what} are not supported on the tpu device ({op}); {instead}.")

    return unsupported


def install() -> None:
    if _libs:
        return
    lib = torch.library.Library("_", "IMPL")
    for key, (what, instead) in _LAYOUTS.items():
        lib.fallback(_raiser(what, instead), key)
    _libs.append(lib)
