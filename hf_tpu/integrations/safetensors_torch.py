"""safetensors on tpu: `safetensors.torch.load_file(path, device="tpu")` loads onto the tpu.

safetensors parses the device string itself (in Rust) and knows only its built-in device names
("cpu", "cuda", "mps", "npu", "xpu", ...): `device="tpu"` raised `SafetensorError: device tpu is
invalid`. diffusers' group offloading to disk reloads each group with `load_file(path,
device=onload_device)`, so `enable_group_offload(onload_device="tpu", offload_to_disk_path=...)`
failed on its first forward. For a tpu device the file is read on CPU (memory-mapped) and each
tensor is copied to the tpu, which is what a direct device load does on any backend without a
zero-copy path.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch


def _is_tpu(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == "tpu"
    return isinstance(device, str) and (device == "tpu" or device.startswith("tpu:"))


def patch_safetensors_torch(module: ModuleType) -> None:
    original = getattr(module, "load_file", None)
    if original is None or getattr(original, "__hf_tpu__", False):
        return

    @functools.wraps(original)
    def load_file(filename, device="cpu"):
        if not _is_tpu(device):
            return original(filename, device=device)
        return {name: tensor.to(device) for name, tensor in original(filename, device="cpu").items()}

    load_file.__hf_tpu__ = True
    module.load_file = load_file
