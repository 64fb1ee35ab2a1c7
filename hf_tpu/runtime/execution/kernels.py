"""Registering the eager kernels: one PrivateUse1 kernel per lowered overload, its derived in-place and out=
variants, and the view/metadata kernels. Runs once, on the first op that reaches the device (so
`import torch` stays cheap), and loads JAX and the lowering table on the way.
"""

from __future__ import annotations

import os
import threading

import torch

from hf_tpu.runtime import arg_checks, lowerings
from hf_tpu.runtime.buffers import platform
from hf_tpu.runtime.execution import dispatch, native_recording, view_kernels
from hf_tpu.runtime.lowerings.table import TABLE

_lock = threading.RLock()
_libs: list = []  # kept alive: a Library's registrations end with it

_kernels_ready = False


def ensure_kernels() -> None:
    """Load JAX and the lowering table, and register a PrivateUse1 kernel per lowered op (once)."""
    global _kernels_ready
    if _kernels_ready:
        return
    with _lock:
        if _kernels_ready:
            return
        _register_kernels()
        _kernels_ready = True
        _freeze_heap()


def _freeze_heap() -> None:
    """Move the (large) heap of torch/JAX/transformers modules out of the cyclic GC's reach.

    Eager dispatch allocates a few tracked objects per op; every few thousand ops that triggers a full
    collection which, over a heap with JAX and transformers loaded, took ~140 ms here (60 us/op
    amortized). `gc.freeze()` makes those collections scan only new objects. HF_TPU_GC_FREEZE=0 opts out.
    """
    if os.environ.get("HF_TPU_GC_FREEZE", "1") != "0":
        import gc

        gc.freeze()


def _register_kernels() -> None:
    platform.jax()
    lowerings.load_all()
    arg_checks.load_all()
    impl = torch.library.Library("aten", "IMPL")
    view_kernels.register_view_kernels(impl, native_recording.metadata_kernel_registrar())
    registered = set()

    def register(op, kernel) -> None:
        # an OpKernel runs behind the C++ recorder when the extension is there (native_recording.py)
        if not (
            isinstance(kernel, dispatch.OpKernel) and native_recording.register(op, kernel, kernel.teachable)
        ):
            impl.impl(op, kernel, "PrivateUse1")
        registered.add(op)

    for op, lowering in list(TABLE.items()):
        kernel = (
            dispatch.host_kernel(op, lowering.fn)
            if lowering.kind == "host"
            else dispatch.OpKernel(op, lowering)
        )
        register(op, kernel)
    # derived in-place and out= variants of every lowered functional op
    for op in list(TABLE):
        name = op._schema.name.removeprefix("aten::")
        for packet_name in (name + "_", name):
            packet = getattr(torch.ops.aten, packet_name, None)
            if packet is None:
                continue
            for ov in packet.overloads():
                cand = getattr(packet, ov)
                if cand in registered or cand in TABLE:
                    continue
                kernel = dispatch.derived_kernel(cand)
                if kernel is not None:
                    register(cand, kernel)
    _libs.append(impl)
    native_recording.install()
