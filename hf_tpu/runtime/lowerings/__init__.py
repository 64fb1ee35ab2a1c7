"""ATen -> JAX lowerings by op family; importing a family registers it in the one lowering table."""

from __future__ import annotations

import importlib
import pkgutil

_loaded = False


def load_all() -> None:
    global _loaded
    if _loaded:
        return
    import hf_tpu.runtime.lowerings.copies  # noqa: F401 - host-side kernels (copies, empty, scalars)

    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        importlib.import_module(f"{__name__}.{info.name}")
    _loaded = True
