"""diffusers on tpu: the copies of accelerate's `get_max_memory` it imported by name see the chip memory,
and `device_map="tpu"` is an accepted pipeline strategy whatever the import order.

With these, `DiffusionPipeline.from_pretrained(..., device_map="balanced")` places components on tpu
instead of on CPU, and models loaded with `device_map="auto"` fill the tpu first.
"""

from __future__ import annotations

import functools
import sys
from types import ModuleType

from hf_tpu.integrations import accelerate as _acc


def patch_pipeline_loading_utils(module: ModuleType) -> None:
    """`_get_final_device_map` calls its own `get_max_memory` (imported from accelerate.utils)."""
    if hasattr(module, "get_max_memory"):
        module.get_max_memory = _acc.get_max_memory


def patch_model_loading_utils(module: ModuleType) -> None:
    """`_determine_device_map` calls its own `get_max_memory` (get_balanced_memory uses accelerate's, patched),
    and gets the same "nothing on tpu is an error" check as transformers."""
    if hasattr(module, "get_max_memory"):
        module.get_max_memory = _acc.get_max_memory
    if hasattr(module, "_determine_device_map"):
        module._determine_device_map = _wrap_determine_device_map(module._determine_device_map)


def _wrap_determine_device_map(original):
    if getattr(original, "__hf_tpu__", False):
        return original

    @functools.wraps(original)
    def _determine_device_map(model, device_map, max_memory, *args, **kwargs):
        strategy = device_map if isinstance(device_map, str) else None
        result = original(model, device_map, max_memory, *args, **kwargs)
        if strategy is not None and isinstance(result, dict) and _acc.tpu_is_accelerator():
            from diffusers.utils import logging

            warn = logging.get_logger("diffusers.hf_tpu").warning
            _acc.check_strategy_result(model, strategy, result, max_memory, warn)
        return result

    _determine_device_map.__hf_tpu__ = True
    return _determine_device_map


def rebind_determine_device_map(module: ModuleType) -> None:
    """diffusers.models.modeling_utils and the single-file loader imported `_determine_device_map` by name."""
    source = sys.modules.get("diffusers.models.model_loading_utils")
    if source is not None and hasattr(module, "_determine_device_map"):
        module._determine_device_map = source._determine_device_map


def patch_pipeline_utils(module: ModuleType) -> None:
    """`SUPPORTED_DEVICE_MAP` is computed at import from diffusers' device detection: make sure tpu is in it."""
    supported = getattr(module, "SUPPORTED_DEVICE_MAP", None)
    if isinstance(supported, list) and "tpu" not in supported and _acc.tpu_is_accelerator():
        supported.append("tpu")
