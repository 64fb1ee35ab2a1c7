"""Integrations: the only place in hf_tpu that patches code it does not own — accelerate, transformers,
diffusers, safetensors, and torch's own Python surface (Tensor, storages, torch.accelerator, Dynamo) —
and where `torch.compile` finds the `tpu` backend (`torch_dynamo.py`).

Every patch is a row of `table.PATCHES` (target, function, why, the package whose verified range applies,
the parameters it relies on) and replaces attributes through `patching.patch` (original kept, applied once,
copies imported by value rebound). `install()` (called by `import hf_tpu`, hence at `import torch`) applies
the rows on torch's own surface at once (after the device is registered) and puts a small finder on
`sys.meta_path` for the rest: each of those runs when its module finishes executing, or at once if that
module is already imported, or, for a module that was still executing when hf_tpu got imported (it
imported torch, whose autoload imports hf_tpu), at the first import after it finished. So import order
never matters, and `import torch` does not pay for `import transformers`. Outside the upstream releases
the patches were verified with (`versions.py`) hf_tpu warns once per package.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
import threading
import warnings
import weakref
from collections.abc import Callable
from types import ModuleType

from hf_tpu.integrations.table import PATCHES, at_import, hooks

# target module -> "hf_tpu.integrations.<file>:<function>" patches, applied in order, once per module object
HOOKS: dict[str, tuple[str, ...]] = hooks()
# (module, "file:function") applied at `import hf_tpu`: torch's own Python surface
AT_IMPORT: tuple[tuple[str, str], ...] = at_import()

_lock = threading.RLock()
_installed = False
_resolving = threading.local()
# hooked modules that were still executing when `install()` ran (they imported torch, whose autoload
# imported hf_tpu): patched once they have finished, at the next import or `apply_pending()`
_pending: dict[str, ModuleType] = {}
# module object -> the HOOKS functions already applied to it (a reload re-executes it: applied again)
_applied: weakref.WeakKeyDictionary[ModuleType, set[str]] = weakref.WeakKeyDictionary()


def _initializing(module: ModuleType) -> bool:
    """Whether `module` is still executing its body (importlib marks its spec until the body returns)."""
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def apply_pending() -> None:
    """Patch the hooked modules that were mid-import at `install()` and have finished since."""
    if not _pending:
        return
    with _lock:
        for name, module in list(_pending.items()):
            if not _initializing(module):
                del _pending[name]
                if sys.modules.get(name) is module:
                    apply_patches(module)


def _patch_function(ref: str) -> Callable[[ModuleType], None]:
    file, name = ref.split(":")
    return getattr(importlib.import_module(f"hf_tpu.integrations.{file}"), name)


def applied(module: ModuleType) -> frozenset[str]:
    """The HOOKS functions that ran for this module object."""
    with _lock:
        return frozenset(_applied.get(module, ()))


def _run(ref: str, module: ModuleType) -> None:
    try:
        _patch_function(ref)(module)
    except Exception as exc:  # noqa: BLE001 - a broken patch must never break the user's import
        warnings.warn(
            f"hf_tpu: could not patch {module.__name__} ({ref}) for the tpu device: {exc!r}. "
            "Please report this with your torch/transformers/accelerate/diffusers versions.",
            stacklevel=3,
        )


def apply_patches(module: ModuleType) -> None:
    """Run the patches registered for `module` (idempotent per module object)."""
    refs = HOOKS.get(module.__name__, ())
    if not refs:
        return
    from hf_tpu.integrations import versions

    versions.check(module.__name__.partition(".")[0])  # once per package: outside the verified range?
    with _lock:
        done = _applied.setdefault(module, set())
        todo = [ref for ref in refs if ref not in done]
        done.update(todo)
    for ref in todo:
        _run(ref, module)


def install_torch_surface() -> None:
    """Apply the AT_IMPORT rows (torch's own Python surface), when hf_tpu owns the registered `tpu` device
    (not when torch_tpu does). Idempotent: `patching.patch` applies each once."""
    from hf_tpu.runtime.device import registration

    if not registration.is_registered():
        return
    from hf_tpu.integrations import versions

    versions.check("torch")
    from hf_tpu.integrations import patching

    with patching.rebinding_once():
        for module_name, ref in AT_IMPORT:
            _run(ref, importlib.import_module(module_name))


class _PatchingLoader(importlib.abc.Loader):
    """Wraps the real loader of a hooked module: executes it, then applies our patches."""

    def __init__(self, loader) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        with _lock:
            _applied.pop(module, None)  # importlib.reload re-executes: patch again
        self._loader.exec_module(module)
        apply_patches(module)

    def __getattr__(self, name: str):
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: asks the finders after it, and wraps the loader of hooked modules."""

    def find_spec(self, fullname: str, path=None, target=None):
        if _pending:
            apply_pending()
        if fullname not in HOOKS:
            return None
        busy = _resolving.__dict__.setdefault("names", set())
        if fullname in busy:
            return None
        busy.add(fullname)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            busy.discard(fullname)
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _PatchingLoader(spec.loader)
        return spec


def install() -> None:
    """Patch torch's own surface, put the post-import finder first on sys.meta_path and patch the hooked
    modules already imported (idempotent)."""
    global _installed
    install_torch_surface()
    with _lock:
        if not _installed:
            sys.meta_path.insert(0, _PostImportFinder())
            _installed = True
        for name in HOOKS:
            module = sys.modules.get(name)
            if module is None:
                continue
            if _initializing(module):
                _pending[name] = module  # patching half a module fails (or patches half of it)
            else:
                apply_patches(module)


__all__ = [
    "AT_IMPORT",
    "HOOKS",
    "PATCHES",
    "applied",
    "apply_patches",
    "apply_pending",
    "install",
    "install_torch_surface",
]
