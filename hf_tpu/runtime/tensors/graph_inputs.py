"""The jax.Arrays a compiled graph is called with, one per argument.

A compiled forward takes every parameter as an argument (a tiny Llama's decode step: ~70), and
`to_jax` asks each of them the same half-dozen questions through torch's Python bindings (~1.2 us an
argument). With the C++ extension one call answers them for all arguments that read their storage's
whole payload, which is every parameter and buffer; the rest (views, CPU tensors, pending DeferAndFuse
values, numbers) take `to_jax`'s general path.
"""

from __future__ import annotations

import torch

from hf_tpu.runtime import native
from hf_tpu.runtime.buffers.storage import REGISTRY
from hf_tpu.runtime.buffers.threads import _device_thread, _device_threads, _get_ident
from hf_tpu.runtime.launch.lazy import LazyValue
from hf_tpu.runtime.tensors.tensor import to_jax

_module = native.load()
_whole_payload_arrays = None if _module is None else getattr(_module, "whole_payload_arrays", None)
_payloads = REGISTRY._payloads


def arrays_of(args: tuple) -> list:
    """Per argument: a tpu tensor's value, a CPU tensor copied to the device, anything else as it is."""
    REGISTRY.drain_native()  # the graph may write its inputs: recorded reads of them come first
    fast = _whole_payload_arrays
    # one device thread: another thread's pending writes are read through `to_jax` (threads.py)
    if fast is None or _get_ident() != _device_thread[0] or len(_device_threads) > 1:
        return [array_of(a) for a in args]
    arrays = fast(args, _payloads)
    for i, v in enumerate(arrays):
        if v is None or type(v) is LazyValue:
            arrays[i] = array_of(args[i])
    return arrays


def array_of(a):
    """One argument's array: a tpu tensor's value, a CPU tensor copied to the device, else `a` itself."""
    if isinstance(a, torch.Tensor):
        if a.is_cpu:
            from hf_tpu.runtime.buffers.placement import host_to_jax

            return host_to_jax(a)
        return to_jax(a)
    return a
