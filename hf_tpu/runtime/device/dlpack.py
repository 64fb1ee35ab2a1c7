"""DLPack for tpu tensors: `Tensor.__dlpack_device__` names the device torch's own exporter uses.

`torch.utils.dlpack.to_dlpack(t)` already exports a tpu tensor as `kDLExtDev` (PyTorch's device type for
PrivateUse1), but `Tensor.__dlpack_device__` compares `device.type` with the literal "privateuse1", which a
renamed backend never matches, so it raised "Unknown device type tpu for Dlpack" and with it every
`from_dlpack(tensor)`: `torch.from_dlpack(t)` (an alias, as on CUDA), `torch.from_dlpack(t, device="cpu")`
and `numpy.from_dlpack(t, device="cpu")` (copies to host). Consumers that cannot read tpu memory (JAX,
NumPy without `device="cpu"`) still refuse it, with their own error naming the device type.
"""

from __future__ import annotations

import functools

import torch

_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    original = torch.Tensor.__dlpack_device__

    @functools.wraps(original)
    def __dlpack_device__(self):
        if not torch.overrides.has_torch_function_unary(self) and self.device.type == "tpu":
            from torch.utils.dlpack import DLDeviceType

            return (DLDeviceType.kDLExtDev, self.device.index or 0)
        return original(self)

    torch.Tensor.__dlpack_device__ = __dlpack_device__
    _installed = True
