"""`Module.to("tpu")` (and `.cpu()`, `.tpu()`, `.half()`...) keeps tensors shared between submodules shared.

`Module._apply` converts a parameter in place (`param.data = new`) only when c10 calls the two tensor
types shallow-copy compatible, which it does for its built-in dense backends (CPU, CUDA, MPS, HIP, XPU,
HPU) and, for PrivateUse1, when the backend answers `aten::_has_compatible_shallow_copy_type` itself
(hf_tpu.runtime.device.registration does, so parameters keep their identity across tpu <-> CPU moves, as
on CUDA). Otherwise (`torch.__future__.set_overwrite_module_params_on_conversion(True)`, or before that op
was registered) moving makes a new Parameter per submodule entry: a tied weight (an embedding shared with
the LM head, T5's `shared`) was converted once per place it appears and came out as two independent
Parameters, so training updated them apart. After the outermost `_apply`, every place that held one
tensor holds one converted tensor again. Applied at `import hf_tpu` through `patching.patch`.
"""

from __future__ import annotations

import functools
import threading
from types import ModuleType

import torch

from hf_tpu.integrations.patching import patch

_state = threading.local()


def keep_tied_tensors_tied(module_module: ModuleType) -> None:
    """Wrap `torch.nn.Module._apply` (see the module docstring)."""

    def make(original):
        @functools.wraps(original)
        def _apply(self, fn, recurse=True):
            if not recurse or getattr(_state, "active", False):
                return original(self, fn, recurse)
            shared = _shared_entries(self)
            _state.active = True
            try:
                result = original(self, fn, recurse)
            finally:
                _state.active = False
            for entries in shared:
                _retie(entries)
            return result

        return _apply

    patch(module_module.Module, "_apply", make)


def _shared_entries(root: torch.nn.Module) -> list[list[tuple[dict, str]]]:
    """Groups of (a module's `_parameters` or `_buffers` dict, key) that hold the same tensor."""
    places: dict[int, list] = {}
    for module in root.modules():
        for table in (module._parameters, module._buffers):
            for key, value in table.items():
                if value is not None:
                    places.setdefault(id(value), []).append((table, key))
    return [entries for entries in places.values() if len(entries) > 1]


def _retie(entries: list[tuple[dict, str]]) -> None:
    table, key = entries[0]
    converted = table[key]
    for table, key in entries[1:]:
        if table[key] is not converted:
            table[key] = converted
