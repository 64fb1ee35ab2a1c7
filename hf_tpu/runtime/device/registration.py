"""Make `tpu` a PyTorch device: rename PrivateUse1, install hooks, guard, `torch.tpu` and the kernels.

Only registration lives here; the patches of torch's Python surface the device needs are in
hf_tpu.integrations (table.PATCHES), applied by `import hf_tpu` right after `register()`.

`autoload()` is the `torch.backends` entry point torch calls at the end of every `import torch`, so it
stays cheap and never raises: names, hooks and the device module only. Kernels are registered on the
same call (registration is pure Python bookkeeping); JAX itself is imported on first use of a tensor.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import warnings

import torch

_lock = threading.RLock()
_registered = False
_libs: list = []


class TorchTPUConflictError(RuntimeError):
    pass


def _torch_tpu_owner() -> str | None:
    """If Google's native `torch_tpu` already owns the device name, return its module name."""
    current = getattr(torch, "tpu", None)
    if current is None:
        return None
    name = getattr(current, "__name__", "")
    if name.startswith("hf_tpu"):
        return None
    return name or repr(current)


def register() -> None:
    """Register the `tpu` device (idempotent, thread-safe)."""
    global _registered
    with _lock:
        if _registered:
            return
        owner = _torch_tpu_owner()
        if owner is not None or torch._C._get_privateuse1_backend_name() not in ("privateuseone", "tpu"):
            _handle_conflict(owner)
            return
        if torch._C._get_privateuse1_backend_name() != "tpu":
            torch.utils.rename_privateuse1_backend("tpu")
        from hf_tpu.runtime.device import device_module, hooks

        torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
        module = sys.modules.get("torch.tpu")
        if module is None:
            torch._register_device_module("tpu", device_module)
        from hf_tpu.runtime import native

        ext = native.load()
        if ext is not None:  # C++ hooks: pinned memory, tpu generators, events (see native/)
            from hf_tpu.runtime.device import native_callbacks

            ext.set_callbacks(native_callbacks)
            ext.register_backend()
        else:
            torch._C._acc.register_python_privateuseone_hook(hooks.TpuHooks())
            torch._C._acc.register_python_privateuseone_device_guard(hooks.TpuDeviceGuard())
        from hf_tpu.runtime.execution import dispatch, fallback

        # kernels (and JAX) load on the first op that reaches the device: `import torch` stays cheap
        fallback_lib = torch.library.Library("_", "IMPL")
        fallback_lib.fallback(dispatch.outside_dynamo(fallback.fallback), "PrivateUse1")
        _libs.append(fallback_lib)
        shallow_copy_lib = torch.library.Library("aten", "IMPL")
        shallow_copy_lib.impl(
            "_has_compatible_shallow_copy_type", _has_compatible_shallow_copy_type, "PrivateUse1"
        )
        _libs.append(shallow_copy_lib)
        from hf_tpu.runtime.device import autocast, unsupported_layouts

        autocast.register()
        unsupported_layouts.install()
        from hf_tpu.runtime.distributed import registration as distributed

        distributed.register()  # the tpu_dist c10d backend (no JAX until a group is made)
        _registered = True
    # torch's Python surface (storages, torch.accelerator, Tensor methods, Module._apply, ...) and the
    # upstream caches that must see the device are patched by hf_tpu.integrations, which `import hf_tpu`
    # installs right after this: the runtime patches nothing


# c10's own list of dense backends whose tensors can take each other's data (TensorImpl.h), plus tpu
_DENSE_DEVICE_TYPES = frozenset({"cpu", "cuda", "mps", "hip", "xpu", "hpu", "mtia", "tpu"})


def _has_compatible_shallow_copy_type(self: torch.Tensor, other: torch.Tensor) -> bool:
    """`t.data = other` between tpu and CPU, as between CUDA and CPU.

    c10 answers this for its built-in dense backends only and leaves PrivateUse1 to the backend (the op
    is how a backend says so). Without it, `variable.set_data` refused every cpu <-> tpu pair: diffusers'
    group offloading (`param.data = param.data.to(onload_device)`), and any user code that moves a
    parameter in place, failed with "incompatible tensor type". Same rule as c10's: the same dispatch
    keys, or two strided tensors on dense backends. With it, `Module.to("tpu")` also converts parameters
    in place (their identity survives the move, as on CUDA).
    """
    if torch._C._dispatch_keys(self) == torch._C._dispatch_keys(other):
        return True
    return all(t.layout == torch.strided and t.device.type in _DENSE_DEVICE_TYPES for t in (self, other))


def _handle_conflict(owner: str | None) -> None:
    """torch_tpu owns `torch.tpu`: defer to it when it has a device, else say how to get ours."""
    has_device = False
    try:
        has_device = bool(torch.tpu.is_available() and torch.tpu.device_count() > 0)
    except Exception:  # noqa: BLE001 - a broken foreign module means "no device"
        has_device = False
    if has_device:
        warnings.warn(
            f"hf_tpu: the native TorchTPU backend ({owner}) owns the 'tpu' device and has chips; deferring to it.",
            stacklevel=3,
        )
        return
    raise TorchTPUConflictError(
        f"The 'tpu' device is already registered by another backend ({owner or torch._C._get_privateuse1_backend_name()}) "
        "that has no usable device here. To use hf_tpu, disable device-backend autoloading with "
        "TORCH_DEVICE_BACKEND_AUTOLOAD=0 (then `import hf_tpu`), or uninstall torch_tpu."
    )


def ensure_kernels() -> None:
    """Load JAX and the lowering table, and register a PrivateUse1 kernel per lowered op (once)."""
    from hf_tpu.runtime.execution import kernels

    kernels.ensure_kernels()


def is_registered() -> bool:
    return _registered


def has_torch_tpu_package() -> bool:
    return importlib.util.find_spec("torch_tpu") is not None
