"""safetensors on tpu: `safetensors.torch.load_file(path, device="tpu")` and
`safetensors.safe_open(path, framework="pt", device="tpu")` load onto the tpu.

safetensors parses the device string itself (in Rust) and knows only its built-in device names
("cpu", "cuda", "mps", "npu", "xpu", ...): `device="tpu"` raised `SafetensorError: device tpu is
invalid`. diffusers' group offloading to disk reloads each group with `load_file(path,
device=onload_device)`, so `enable_group_offload(onload_device="tpu", offload_to_disk_path=...)`
failed on its first forward, and accelerate's `load_state_dict` with a device map that mixes "tpu"
and "cpu" opens the file once per device with `safe_open`. For a tpu device the file is read on CPU
(memory-mapped) and each tensor is copied to the tpu, which is what a direct device load does on any
backend without a zero-copy path.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch

from hf_tpu.integrations.patching import patch


def _is_tpu(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == "tpu"
    return isinstance(device, str) and (device == "tpu" or device.startswith("tpu:"))


def patch_safetensors_torch(module: ModuleType) -> None:
    """safetensors.torch: `load_file(path, device="tpu")` reads on CPU, then copies each tensor to tpu."""

    def make(original):
        @functools.wraps(original)
        def load_file(
            filename, device="cpu", **kwargs
        ):  # safetensors 0.8 adds `backend=` (load_model passes it)
            if not _is_tpu(device):
                return original(filename, device=device, **kwargs)
            loaded = original(filename, device="cpu", **kwargs)
            return {name: tensor.to(device) for name, tensor in loaded.items()}

        return load_file

    patch(module, "load_file", make, rebind=("load_file",))


class _OnTpu:
    """A `safe_open` handle read on CPU whose tensors come back on the tpu (slices stay on CPU)."""

    def __init__(self, handle, device) -> None:
        self._handle = handle
        self._device = device

    def __enter__(self) -> _OnTpu:
        self._handle.__enter__()
        return self

    def __exit__(self, *exc) -> bool | None:
        return self._handle.__exit__(*exc)

    def get_tensor(self, name: str) -> torch.Tensor:
        return self._handle.get_tensor(name).to(self._device)

    def __getattr__(self, name: str):  # keys(), metadata(), get_slice(), offset_keys(), ...
        return getattr(self._handle, name)


def patch_safe_open(module: ModuleType) -> None:
    """safetensors: `safe_open(..., device="tpu")`; copies imported by name (accelerate's modeling and
    offload utilities) are rebound when they were imported before this patch."""

    def make(original):
        def safe_open(filename, framework, device="cpu", **kwargs):
            if framework in ("pt", "torch") and _is_tpu(device):
                return _OnTpu(original(filename, framework=framework, device="cpu", **kwargs), device)
            return original(filename, framework=framework, device=device, **kwargs)

        safe_open.__doc__ = original.__doc__
        return safe_open

    patch(module, "safe_open", make, rebind=("safe_open",))
