"""torch.Tensor's Python surface on tpu: printing, pinned memory, `record_stream`, DLPack.

Each function replaces one attribute through `patching.patch` (table.PATCHES lists them); applied at
`import hf_tpu` (hence at `import torch`), right after the device is registered.
"""

from __future__ import annotations

import functools
import warnings
from types import ModuleType

import torch

from hf_tpu.integrations.patching import patch


def format_on_host(tensor_str: ModuleType) -> None:
    """Printing a tpu tensor formats a host copy (one transfer), as PyTorch does for XLA tensors."""

    def make(original):
        @functools.wraps(original)
        def _tensor_str(self, indent):
            if self.device.type == "tpu":
                self = self.cpu()
            return original(self, indent)

        return _tensor_str

    patch(tensor_str, "_tensor_str", make)


_pin_warned = [False]


def _is_missing_pinned_allocator(exc: BaseException) -> bool:
    return "getPinnedMemoryAllocator" in str(exc) and "PrivateUse1" in str(exc)


def pin_memory_without_allocator(tensor_module: ModuleType) -> None:
    """Pinned host memory on the pure-Python path (`HF_TPU_NATIVE=0`; the C++ extension has a real pinned
    allocator and this patch is not applied): the tensor itself, an async copy target, not an error.

    `Tensor.pin_memory()` asks the current accelerator's C++ hooks for a pinned allocator, which Python
    PrivateUse1 hooks cannot provide, so `DataLoader(pin_memory=True)` (whose pinning thread calls it) would
    raise. JAX stages host-to-device copies itself (PJRT), so there is nothing to pin: the tensor comes back
    as it is (`is_pinned()` stays False), with one warning. What pinning promises on CUDA still holds: a
    `non_blocking=True` copy from tpu into it returns at once and lands by the next synchronize
    (host_copies.py). Everything else (a CPU-only or CUDA machine, an explicit other device) keeps
    PyTorch's behaviour.
    """
    from hf_tpu.runtime import native

    if native.active():
        return

    def make(original):
        @functools.wraps(original)
        def pin_memory(self, *args, **kwargs):
            try:
                return original(self, *args, **kwargs)
            except (NotImplementedError, RuntimeError) as exc:
                if not _is_missing_pinned_allocator(exc):
                    raise
            if not _pin_warned[0]:
                _pin_warned[0] = True
                warnings.warn(
                    "hf_tpu: pin_memory() returns the tensor itself while tpu is the accelerator (JAX stages "
                    "host-to-device copies itself); non_blocking copies from tpu into it are asynchronous, as "
                    "into pinned memory on CUDA: synchronize (torch.tpu.synchronize() or an Event) before "
                    "reading.",
                    stacklevel=2,
                )
            from hf_tpu.runtime.buffers import host_copies

            return host_copies.mark_async_target(self)

        return pin_memory

    patch(tensor_module.Tensor, "pin_memory", make)


def record_stream_of_tpu_streams(tensor_module: ModuleType) -> None:
    """`tensor.record_stream(torch.tpu.current_stream())`: the CUDA idiom, with our stream object.

    `Tensor.record_stream` parses its argument in C++ and takes only a `torch.Stream`; `torch.tpu.Stream` is
    not a subclass of it (TorchDynamo recursed without end tracing code that used one), so the idiom raised
    "unknown parameter type" (diffusers' group offloading with `record_stream=True` does exactly this). A
    `torch.tpu.Stream` is passed on as the `torch.Stream` of the same device; the op itself stays what it
    is (nothing to record on tpu: JAX keeps a buffer alive while work reads it; CPU's error for a CPU tensor).
    """
    from hf_tpu.runtime.device.device_module import Stream

    def make(original):
        @functools.wraps(original)
        def record_stream(self, stream):
            if isinstance(stream, Stream):
                stream = torch.Stream(device=stream.device)
            return original(self, stream)

        return record_stream

    patch(tensor_module.Tensor, "record_stream", make)


def dlpack_device_of_tpu(tensor_module: ModuleType) -> None:
    """`Tensor.__dlpack_device__` names the device torch's own exporter uses for tpu tensors.

    `torch.utils.dlpack.to_dlpack(t)` already exports a tpu tensor as `kDLExtDev` (PyTorch's device type for
    PrivateUse1), but `Tensor.__dlpack_device__` compares `device.type` with the literal "privateuse1", which
    a renamed backend never matches, so it raised "Unknown device type tpu for Dlpack" and with it every
    `from_dlpack(tensor)`: `torch.from_dlpack(t)`, `torch.from_dlpack(t, device="cpu")` and
    `numpy.from_dlpack(t, device="cpu")` (copies to host). Consumers that cannot read tpu memory (JAX,
    NumPy without `device="cpu"`) still refuse it, with their own error naming the device type.
    """

    def make(original):
        @functools.wraps(original)
        def __dlpack_device__(self):
            if not torch.overrides.has_torch_function_unary(self) and self.device.type == "tpu":
                from torch.utils.dlpack import DLDeviceType

                return (DLDeviceType.kDLExtDev, self.device.index or 0)
            return original(self)

        return __dlpack_device__

    patch(tensor_module.Tensor, "__dlpack_device__", make)
