"""Hugging Face integrations: the only place in hf_tpu that knows accelerate/transformers/diffusers internals
(and where `torch.compile` finds the `tpu` backend, `torch_dynamo.py`).

Nothing here imports those libraries. `install()` (called by `import hf_tpu`, hence at `import torch`)
only puts a small finder on `sys.meta_path`; each patch runs when its target module finishes executing,
or at once if that module is already imported, or, for a module that was still executing when hf_tpu got
imported (it imported torch, whose autoload imports hf_tpu), at the first import after it finished. So
import order never matters, and `import torch` does not pay for `import transformers`.

Which module gets which patch is the `HOOKS` table below (the upstream releases they were verified with:
`versions.py`, which warns once outside them); the patches live in `accelerate.py`,
`transformers.py`, `transformers_sharding.py`, `diffusers.py`, `diffusers_sharding.py`, `diffusers_parallel.py`,
`safetensors_torch.py`, `torch_dynamo.py` and `torch_flex_attention.py` next to this file.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
import threading
import warnings
from collections.abc import Callable
from types import ModuleType

# target module -> "hf_tpu.integrations.<file>:<function>" patches, applied in order, once per module object
HOOKS: dict[str, tuple[str, ...]] = {
    "accelerate.utils.modeling": ("accelerate:patch_modeling",),
    "accelerate.utils.dataclasses": ("accelerate:patch_dataclasses",),
    "accelerate.utils": ("accelerate:patch_utils",),
    "accelerate.state": ("accelerate:patch_state",),
    "accelerate.checkpointing": ("accelerate:patch_checkpointing",),
    "transformers.integrations.accelerate": ("transformers:patch_integrations_accelerate",),
    "transformers.core_model_loading": ("transformers_sharding:patch_core_model_loading",),
    "transformers.modeling_utils": (
        "transformers:patch_modeling_utils",
        "transformers_sharding:rebind_convert_and_load",
    ),
    "transformers.modeling_layers": ("transformers_sharding:rebind_convert_and_load",),
    "transformers.training_args": ("transformers:patch_training_args",),
    "transformers.trainer": ("transformers:patch_trainer",),
    "transformers.generation.utils": ("transformers:patch_generation_utils",),
    "transformers.cache_utils": ("transformers:patch_cache_utils",),
    "transformers.generation.continuous_batching.cache": ("transformers:patch_continuous_batching_cache",),
    "transformers.testing_utils": ("transformers:patch_testing_utils",),
    "diffusers.pipelines.pipeline_loading_utils": ("diffusers:patch_pipeline_loading_utils",),
    "diffusers.models.model_loading_utils": (
        "diffusers:patch_model_loading_utils",
        "diffusers_sharding:patch_model_loading_utils",
    ),
    "diffusers.pipelines.pipeline_utils": ("diffusers:patch_pipeline_utils",),
    "diffusers.models.modeling_utils": (
        "diffusers:rebind_determine_device_map",
        "diffusers_sharding:patch_modeling_utils",
        "diffusers_parallel:patch_modeling_utils",
    ),
    "diffusers.models.attention_dispatch": ("diffusers_parallel:patch_attention_dispatch",),
    "diffusers.loaders.single_file_model": ("diffusers:rebind_determine_device_map",),
    "safetensors": ("safetensors_torch:patch_safe_open",),
    "safetensors.torch": ("safetensors_torch:patch_safetensors_torch",),
    "torch._dynamo.backends.registry": ("torch_dynamo:register_tpu_backend",),
    "torch._dynamo.trace_rules": (
        "torch_dynamo:keep_out_of_the_runtime",
        "torch_dynamo:allow_tpu_device_queries",
    ),
    "torch._dynamo.variables.torch": ("torch_dynamo:fold_tpu_device_queries",),
    "torch._inductor.compile_fx": ("torch_dynamo:route_tpu_graphs_from_inductor",),
    "torch.nn.attention.flex_attention": ("torch_flex_attention:allow_tpu",),
}

_lock = threading.RLock()
_installed = False
_resolving = threading.local()
# hooked modules that were still executing when `install()` ran (they imported torch, whose autoload
# imported hf_tpu): patched once they have finished, at the next import or `apply_pending()`
_pending: dict[str, ModuleType] = {}


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


def apply_patches(module: ModuleType) -> None:
    """Run the patches registered for `module` (idempotent per module object)."""
    done: set = module.__dict__.setdefault("__hf_tpu_patched__", set())
    refs = HOOKS.get(module.__name__, ())
    if refs:
        from hf_tpu.integrations import versions

        versions.check(module.__name__.partition(".")[0])  # once per package: outside the verified range?
    for ref in refs:
        if ref in done:
            continue
        done.add(ref)
        try:
            _patch_function(ref)(module)
        except Exception as exc:  # noqa: BLE001 - a broken patch must never break the user's import
            warnings.warn(
                f"hf_tpu: could not patch {module.__name__} ({ref}) for the tpu device: {exc!r}. "
                "Please report this with your transformers/accelerate/diffusers versions.",
                stacklevel=2,
            )


class _PatchingLoader(importlib.abc.Loader):
    """Wraps the real loader of a hooked module: executes it, then applies our patches."""

    def __init__(self, loader) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__dict__.pop("__hf_tpu_patched__", None)  # importlib.reload re-executes: patch again
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
    """Put the post-import finder first on sys.meta_path and patch modules already imported (idempotent)."""
    global _installed
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


__all__ = ["HOOKS", "apply_patches", "apply_pending", "install"]
