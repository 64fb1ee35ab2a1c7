"""`torch.Generator(device="tpu")` on the pure-Python path (no C++ extension, `HF_TPU_NATIVE=0`): a CPU
generator, so the diffusers idiom `torch.Generator("tpu").manual_seed(0)` works. With the extension
(hf_tpu.runtime.native) it is a real tpu generator and this patch is not applied.

PyTorch builds a device generator through the backend's C++ hooks (`getNewGenerator`), which a backend
defined in Python cannot provide: the call raised NotImplementedError, and code that builds its own
generator on the pipeline's device failed (transformers' watermarking, some diffusers pipelines).
`torch.Generator` becomes a subclass of the C type whose constructor answers a tpu device with a CPU
generator: tpu random ops given a CPU generator draw on CPU with it (`dispatch._run_with_cpu_generator`),
so a seeded tpu run gives CPU PyTorch's numbers, as diffusers' `randn_tensor` already does with CPU
generators. Every generator is still the C type, and `isinstance`/`issubclass` with `torch.Generator`
answer as before (the metaclass defers to the C type).
"""

from __future__ import annotations

from types import ModuleType

import torch

from hf_tpu.integrations.patching import patch

_CGenerator = torch._C.Generator


class _GeneratorType(type(_CGenerator)):
    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, _CGenerator)

    def __subclasscheck__(cls, sub) -> bool:
        return issubclass(sub, _CGenerator)


class Generator(_CGenerator, metaclass=_GeneratorType):
    """torch.Generator(device="cpu"); a tpu device gives a CPU generator (see the module docstring)."""

    def __new__(cls, device=None):
        if device is None:
            return _CGenerator()
        if torch.device(device).type == "tpu":
            from hf_tpu.runtime.device.device_module import _check_index

            _check_index(device)
            return _CGenerator("cpu")
        return _CGenerator(device)


Generator.__module__ = "torch"
Generator.__qualname__ = Generator.__name__ = "Generator"
Generator.__doc__ = (
    _CGenerator.__doc__ or ""
) + "\n\nOn tpu (hf_tpu): a CPU generator; see hf_tpu.integrations.torch_generator."


def cpu_generator_for_tpu(torch_module: ModuleType) -> None:
    """`torch.Generator` accepts a tpu device (pure-Python path only)."""
    from hf_tpu.runtime import native

    if not native.active():
        patch(torch_module, "Generator", lambda original: Generator)
