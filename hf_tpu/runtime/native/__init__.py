"""The optional C++ extension: PyTorch hooks a Python backend cannot register.

`load()` returns the extension module, or None for the pure-Python path: when `HF_TPU_NATIVE=0`, or when
the library was not built (no compiler at install time) or was built for another torch/source (then one
warning says how to build it). `HF_TPU_NATIVE=1` makes a missing library an error instead.
The library gives tpu a pinned host allocator, real `torch.Generator(device="tpu")` objects whose state
drives the device PRNG, and generic `torch.Event`/`torch.Stream` on tpu.
"""

from __future__ import annotations

import importlib.util
import os
import threading
import warnings
from types import ModuleType

from hf_tpu.runtime.native import artifact

ENV = "HF_TPU_NATIVE"
_lock = threading.Lock()
_module: ModuleType | None = None
_tried = False


class NativeUnavailableError(ImportError):
    pass


def requested() -> str:
    """'0' (Python path), '1' (native or error) or 'auto' (native when built)."""
    value = os.environ.get(ENV, "auto").strip().lower()
    if value in ("0", "false", "off", "no"):
        return "0"
    if value in ("1", "true", "on", "yes"):
        return "1"
    return "auto"


def load() -> ModuleType | None:
    """The extension module (loaded once), or None when the pure-Python path is in use."""
    global _module, _tried
    if _tried:
        return _module
    with _lock:
        if _tried:
            return _module
        _tried = True
        mode = requested()
        if mode == "0":
            return None
        problem = _problem()
        if problem is None:
            spec = importlib.util.spec_from_file_location(artifact.MODULE, artifact.library_path())
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            _module = module
            return module
        message = (
            f"hf_tpu: the C++ extension is {problem}; using the pure-Python path (no pinned memory, "
            "torch.Generator(device='tpu') gives a CPU generator, no generic torch.Event on tpu). Build it "
            f"with `python {artifact.HERE / 'build.py'}` (make install does), or set {ENV}=0 to silence this."
        )
        if mode == "1":
            raise NativeUnavailableError(message.replace("using the pure-Python path", f"but {ENV}=1"))
        warnings.warn(message, stacklevel=3)
        return None


def _problem() -> str | None:
    if not artifact.is_built():
        return "not built"
    if not artifact.is_current():
        return "out of date (built from another source or for another torch)"
    return None


def active() -> bool:
    """Whether the native path is in use in this process."""
    return load() is not None
