"""`tensor.record_stream(torch.tpu.current_stream())`: the CUDA idiom, with our stream object.

`Tensor.record_stream` parses its argument in C++ and takes only a `torch.Stream`; `torch.tpu.Stream` is
not a subclass of it (TorchDynamo recursed without end tracing code that used one), so the idiom raised
"unknown parameter type" (diffusers' group offloading with `record_stream=True` does exactly this). A
`torch.tpu.Stream` is passed on as the `torch.Stream` of the same device; the op itself stays what it
is (nothing to record on tpu: JAX keeps a buffer alive while work reads it; CPU's error for a CPU tensor).
"""

from __future__ import annotations

import functools

import torch

_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    from hf_tpu.runtime.device.device_module import Stream

    original = torch.Tensor.record_stream

    @functools.wraps(original)
    def record_stream(self, stream):
        if isinstance(stream, Stream):
            stream = torch.Stream(device=stream.device)
        return original(self, stream)

    torch.Tensor.record_stream = record_stream
    _installed = True
