"""Upstream import-time caches that must see the `tpu` device whatever the import order (DESIGN §3.1).

Transformers and diffusers compute some device facts once (lru_cache or module constants). When they
were imported before registration, recompute them; when imported later they see the device already.
"""

from __future__ import annotations

import sys


def refresh() -> None:
    iu = sys.modules.get("transformers.utils.import_utils")
    if iu is not None:
        for name in (
            "is_torch_tpu_available",
            "is_torch_flex_attn_available",
            "is_torch_accelerator_available",
        ):
            fn = getattr(iu, name, None)
            if hasattr(fn, "cache_clear"):
                fn.cache_clear()
    tu = sys.modules.get("diffusers.utils.torch_utils")
    if tu is not None:
        backend = getattr(tu, "TorchDeviceBackend", None)
        detect = getattr(backend, "_detect_device_type", None) if backend is not None else None
        if hasattr(detect, "cache_clear"):
            detect.cache_clear()
    pu = sys.modules.get("diffusers.pipelines.pipeline_utils")
    if pu is not None:
        supported = getattr(pu, "SUPPORTED_DEVICE_MAP", None)
        if isinstance(supported, list) and "tpu" not in supported:
            supported.append("tpu")
