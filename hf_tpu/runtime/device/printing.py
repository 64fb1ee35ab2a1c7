"""Printing a tpu tensor formats a host copy (one transfer), as PyTorch does for XLA tensors."""

from __future__ import annotations

import functools

import torch._tensor_str as _tensor_str

_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    original = _tensor_str._tensor_str

    @functools.wraps(original)
    def tensor_str(self, indent):
        if self.device.type == "tpu":
            self = self.cpu()
        return original(self, indent)

    _tensor_str._tensor_str = tensor_str
    _installed = True
