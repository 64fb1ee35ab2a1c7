"""The Python half of the C++ recorder (native/csrc/recorder.cpp): DeferAndFuse ops recorded without
entering Python, then handed over.

With the extension, every `OpKernel` is registered behind a C++ kernel. Under DeferAndFuse, a functional
op the C++ kernel has a cached result for (same op, argument shapes/dtypes and values) is appended to a
native trace and its output tensor made in C++; the first time, the Python kernel runs and `teach`es
the cache. `drain` hands the native trace to Python's trace (`lazy.call` of each op's cached executable;
a payload for each output still alive once the ops of the trace that read it are in), and runs whenever Python is about to look at payloads: a lookup of an output
it has not seen, a write, a flush, a compiled call (`REGISTRY.drain_native`). An op whose inputs no
longer read as they did when it was taught (another payload shape, a dtype reinterpretation) runs
through its Python kernel at that point instead, which records exactly what it always would.

In Strict mode the same C++ kernel runs an op it has a Strict entry for by itself: it calls the entry's
jitted executable on the inputs' payload arrays and makes the outputs, which `REGISTRY.adopt_recorded`
registers (`install` hands it what it calls).

`HF_TPU_NATIVE_RECORD=0` registers the Python kernels directly, as without the extension (A/B
measurements).
"""

from __future__ import annotations

import os
import threading

import torch

from hf_tpu.runtime import native
from hf_tpu.runtime.buffers import memory, platform, threads
from hf_tpu.runtime.buffers.dtypes import to_jax_dtype
from hf_tpu.runtime.buffers.pending import LazyValue
from hf_tpu.runtime.buffers.storage import REGISTRY
from hf_tpu.runtime.buffers.threads import _NO_LOCK, DONATION_LOCK, _device_threads
from hf_tpu.runtime.execution.out_specs import LaidOut
from hf_tpu.runtime.launch import lazy, modes
from hf_tpu.runtime.tensors.tensor import _permuted_back as permuted_back
from hf_tpu.runtime.tensors.tensor import contiguous_strides

_ext = native.load()
_lock = threading.RLock()
ENABLED = (
    _ext is not None
    and hasattr(_ext, "register_kernel")
    and os.environ.get("HF_TPU_NATIVE_RECORD", "1") != "0"
)
_payloads = REGISTRY._payloads
teach = _ext.teach if ENABLED else None


def register(op: torch._ops.OpOverload, kernel, teachable: bool) -> bool:
    """Register `kernel` (an OpKernel) for `op` behind the C++ recording kernel; False when the
    extension is not in use (the caller registers the Python kernel itself)."""
    if not ENABLED:
        return False
    schema = op._schema
    name = schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
    _ext.register_kernel(name, kernel, teachable)
    return True


def out_spec(spec) -> tuple:
    """A kernel entry's outputs as the C++ recorder makes them: per output (payload shape, dtype, sizes,
    strides), from its spec ((shape, dtype), a tuple of those, or a `LaidOut` of either with the memory
    order of each permuted output); () when it cannot (an output of unknown shape or dtype, or None)."""
    layout = None
    if type(spec) is LaidOut:
        spec, layout = spec
    if type(spec) is not tuple or not spec:
        return ()
    single = len(spec) == 2 and type(spec[1]) is torch.dtype
    specs = (spec,) if single else spec
    orders = (layout,) if single else (layout or (None,) * len(specs))
    out = []
    for one, order in zip(specs, orders):
        if type(one) is not tuple or len(one) != 2 or type(one[1]) is not torch.dtype:
            return ()
        shape, dtype = tuple(one[0]), one[1]
        if order is None:
            out.append((shape, dtype, shape, contiguous_strides(shape)))
        else:
            laid = tuple(shape[d] for d in order)
            sizes, strides = permuted_back(laid, tuple(order))
            out.append((laid, dtype, sizes, strides))
    return tuple(out)


def metadata_kernel_registrar():
    """What registers a view op's metadata kernel in C++ (view_kernels.py), or None."""
    return _ext.register_metadata_kernel if ENABLED else None


def install() -> None:
    """Let the storage registry and the recorder's overflow hand the native trace over, and give the
    Strict fast path what it calls."""
    if not ENABLED:
        return
    REGISTRY.drain = drain
    _ext.set_drain_callback(drain)
    _ext.set_recording(lazy.enabled())
    _ext.set_max_pending(lazy.room())
    _ext.install_strict(
        REGISTRY.adopt_recorded,
        _payloads,
        platform.last_launched,
        LazyValue,
        DONATION_LOCK,
        torch._C._dynamo.eval_frame.set_eval_frame,
        memory._fraction,
    )
    threads.on_another_thread(_ext.note_several_threads)
    if len(_device_threads) > 1:
        _ext.note_several_threads()
    modes.sync_native_mode()


def drain() -> None:
    """Record every op the C++ recorder holds into Python's trace, in order, and give each output's
    storage its (pending) value. An op that fails to record leaves its output without a value (reading
    it raises, naming the op); the first such error is raised after all others are recorded."""
    if not _ext.pending() or _draining_here():
        return
    # several device threads (autograd runs backward on its own): payload arrays are read under
    # DONATION_LOCK (threads.py), taken before this module's lock, as a donor holding it may drain
    with DONATION_LOCK if len(_device_threads) > 1 else _NO_LOCK, _lock:
        errors: list = []

        def fast(entry, leaves, outs):
            try:
                return lazy.call(entry.fn, leaves, entry)
            except BaseException as exc:  # noqa: BLE001 - raised once every record is in
                errors.append(exc)
                return _failed(entry, outs)

        def general(kernel, entry, args, kwargs, outs) -> None:
            try:
                full = kernel.sig.normalize(args, kwargs)
                value, spec = kernel.run(full, full)
                if spec != entry.spec:
                    raise RuntimeError(
                        f"hf_tpu: {entry.op} was recorded as {entry.spec} but computes {spec} (the C++ "
                        "recorder's cached result no longer matches; please report this)"
                    )
            except BaseException as exc:  # noqa: BLE001 - raised once every record is in
                errors.append(exc)
                value = _failed(entry, outs)
            _adopt_outputs(outs, value)

        _replaying.thread = threading.get_ident()
        try:
            while _ext.pending():  # what other threads recorded meanwhile, after this batch
                _ext.replay_records(fast, general, _adopt, _payloads, True)
        finally:
            _replaying.thread = None
        _ext.set_max_pending(lazy.room())
        if errors:
            raise errors[0]


_adopt = REGISTRY.adopt_recorded


class _Replaying:
    thread: int | None = None  # the thread handing records over (it holds `_lock`)


_replaying = _Replaying()


def _draining_here() -> bool:
    """Inside a hand-over in this thread (a graph-size flush while replaying): the records it holds are
    being replayed in order already, and another batch must not cut in ahead of them."""
    return _replaying.thread == threading.get_ident()


def _adopt_outputs(outs: tuple, value) -> None:
    if len(outs) == 1:
        ptr, weak, nbytes, shape, dtype = outs[0]
        _adopt(ptr, weak, shape, dtype, nbytes, value)
        return
    for (ptr, weak, nbytes, shape, dtype), v in zip(outs, value):
        _adopt(ptr, weak, shape, dtype, nbytes, v)


def _failed(entry, outs: tuple):
    """Values for outputs that will never be computed: reading one raises, naming the op."""
    values = tuple(lazy.failed_value(shape, to_jax_dtype(dtype), str(entry.op)) for *_, shape, dtype in outs)
    return values[0] if len(outs) == 1 else values


def stats() -> dict:
    """Counts of the C++ recorder: ops recorded natively (hits), cache misses, entries taught, ops
    that ran the Python kernel, records not yet handed over, and the handed-over outputs that were given
    a payload (adopted) or were dead by then (dropped)."""
    if _ext is None or not hasattr(_ext, "recording_stats"):
        return {}
    return dict(_ext.recording_stats())
