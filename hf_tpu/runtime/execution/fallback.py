"""The boxed PrivateUse1 fallback: every op without a registered kernel comes here once.

It finds, in order: an in-place/out= variant derived from a functional lowering, a lowering registered
after start-up, torch's decomposition (guarded against recursion), and otherwise a clear error naming
the op and its inputs, or, with `HF_TPU_CPU_FALLBACK=1`, a run on CPU copies with results copied back.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable

import torch

from hf_tpu.runtime.execution.dispatch import (
    LoweringMissing,
    OpKernel,
    _describe,
    _to_cpu,
    derived_kernel,
    host_kernel,
)
from hf_tpu.runtime.execution.signature import Signature
from hf_tpu.runtime.lowerings.table import TABLE

_fallback_cache: dict = {}
_warned_cpu: set = set()
_local = threading.local()


def _cpu_fallback_enabled() -> bool:
    return os.environ.get("HF_TPU_CPU_FALLBACK", "").strip().lower() in ("1", "true", "yes", "on")


def _decomposition(op) -> Callable | None:
    from torch._decomp import decomposition_table

    fn = decomposition_table.get(op)
    if fn is not None:
        return fn
    if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
        return op.decompose
    return None


def fallback(op, *args, **kwargs):
    """Boxed PrivateUse1 fallback for every op without a registered kernel."""
    from hf_tpu.runtime.execution import kernels

    if not kernels._kernels_ready:
        kernels.ensure_kernels()
        return op(*args, **kwargs)  # now reaches its own kernel, if it has one
    handler = _fallback_cache.get(op)
    if handler is None:
        handler = _fallback_handler(op)
        _fallback_cache[op] = handler
    return handler(*args, **kwargs)


def _fallback_handler(op):
    kernel = derived_kernel(op)
    if kernel is not None:
        return kernel
    lowering = TABLE.get(op)
    if lowering is not None:
        return host_kernel(op, lowering.fn) if lowering.kind == "host" else OpKernel(op, lowering)
    decomp = _decomposition(op)
    if decomp is not None:

        def run_decomposition(*args, **kwargs):
            depth = getattr(_local, "depth", {})
            _local.depth = depth
            if depth.get(op, 0) > 0:
                return _missing(op, args, kwargs)
            depth[op] = depth.get(op, 0) + 1
            try:
                return decomp(*args, **kwargs)
            finally:
                depth[op] -= 1

        return run_decomposition
    return lambda *args, **kwargs: _missing(op, args, kwargs)


def _missing(op, args, kwargs):
    if _cpu_fallback_enabled():
        return cpu_fallback(op, args, kwargs)
    sig = Signature(op)
    full = sig.normalize(args, kwargs)
    raise LoweringMissing(
        f"hf_tpu has no lowering for {op._schema.name}.{op._overloadname} "
        f"(inputs: {_describe(full, sig.kinds)}). Set HF_TPU_CPU_FALLBACK=1 to run this op on CPU and copy "
        "the result back (slow), or add a lowering in hf_tpu/runtime/lowerings/."
    )


def cpu_fallback(op, args, kwargs):
    """Run `op` on CPU copies of its tpu arguments, copy results and mutated arguments back."""
    if op not in _warned_cpu:
        _warned_cpu.add(op)
        warnings.warn(
            f"hf_tpu: {op} has no tpu lowering; running it on CPU (HF_TPU_CPU_FALLBACK=1). This is slow.",
            stacklevel=3,
        )
    cpu_args = [_to_cpu(a) for a in args]
    cpu_kwargs = {k: _to_cpu(v) for k, v in kwargs.items()}
    result = op(*cpu_args, **cpu_kwargs)
    sig = Signature(op)
    full = sig.normalize(args, kwargs)
    cpu_full = sig.normalize(tuple(cpu_args), cpu_kwargs)
    for i in sig.mutable:  # written arguments: single tensors and lists of them (`_foreach_*_`, AMP ops)
        targets = full[i] if isinstance(full[i], list | tuple) else [full[i]]
        sources = cpu_full[i] if isinstance(cpu_full[i], list | tuple) else [cpu_full[i]]
        for dst, src in zip(targets, sources):
            if isinstance(dst, torch.Tensor) and dst.device.type == "tpu":
                dst.copy_(src)
    mutated_ids = {id(cpu_full[i]): full[i] for i in sig.mutable}

    def back(r):
        if isinstance(r, torch.Tensor):
            if id(r) in mutated_ids:
                return mutated_ids[id(r)]
            return r.to("tpu")
        if isinstance(r, list | tuple):
            return type(r)(back(x) for x in r)
        return r

    return back(result)
