"""diffusers on tpu: the copies of accelerate's `get_max_memory` it imported by name see the chip memory,
and `device_map="tpu"` is an accepted pipeline strategy whatever the import order.

With these, `DiffusionPipeline.from_pretrained(..., device_map="balanced")` places components on tpu
instead of on CPU, and models loaded with `device_map="auto"` fill the tpu first.
"""

from __future__ import annotations

import functools
from types import ModuleType

from hf_tpu.integrations import accelerate as _acc
from hf_tpu.integrations.patching import patch


def patch_model_loading_utils(module: ModuleType) -> None:
    """`_determine_device_map` gets the same "nothing on tpu is an error" check as transformers (the copies
    diffusers.models.modeling_utils and the single-file loader imported by name are rebound). Its
    `get_max_memory`, imported from accelerate.utils, is accelerate's patched one
    (`accelerate.patch_modeling`)."""
    if hasattr(module, "_determine_device_map"):
        patch(module, "_determine_device_map", _wrap_determine_device_map, rebind=("_determine_device_map",))


def _wrap_determine_device_map(original):
    @functools.wraps(original)
    def _determine_device_map(model, device_map, max_memory, *args, **kwargs):
        strategy = device_map if isinstance(device_map, str) else None
        result = original(model, device_map, max_memory, *args, **kwargs)
        if strategy is not None and isinstance(result, dict) and _acc.tpu_is_accelerator():
            from diffusers.utils import logging

            warn = logging.get_logger("diffusers.hf_tpu").warning
            _acc.check_strategy_result(model, strategy, result, max_memory, warn)
        return result

    return _determine_device_map


def patch_pipeline_utils(module: ModuleType) -> None:
    """`SUPPORTED_DEVICE_MAP` is computed at import from diffusers' device detection: make sure tpu is in it."""
    supported = getattr(module, "SUPPORTED_DEVICE_MAP", None)
    if isinstance(supported, list) and "tpu" not in supported and _acc.tpu_is_accelerator():
        supported.append("tpu")


def refresh_device_detection(module: ModuleType) -> None:
    """diffusers.utils.torch_utils: `TorchDeviceBackend._detect_device_type` (lru_cache) sees the registered
    `tpu` device whatever the import order: a cache computed before registration is cleared."""
    backend = getattr(module, "TorchDeviceBackend", None)
    detect = getattr(backend, "_detect_device_type", None) if backend is not None else None
    if hasattr(detect, "cache_clear"):
        detect.cache_clear()
