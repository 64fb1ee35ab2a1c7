"""What TorchDynamo must know about the tpu device before it traces anything.

Dynamo traces a function (with fake tensors) before it calls the backend, and whatever backend the user
picked (`tpu`, `aot_eager`, ...). So this is installed as Dynamo's own modules load
(hf_tpu.integrations.torch_dynamo: its trace rules, its backend registry), not when our backend module is
first imported:
- Dynamo never traces into the runtime (nor JAX): a `.item()` or `.cpu()` in compiled code, or a graph
  break such as `loss.backward()`, reaches our eager kernels while Dynamo's frame hook is active;
- meta (fake-tensor) kernels PyTorch gets wrong for tpu are fixed;
- `torch.tpu.is_available()`, `device_count()` and `current_device()` fold to constants while tracing, as
  their `torch.cuda` counterparts do (else, the runtime being skipped, each would break the graph and
  fail `fullgraph=True`).
"""

from __future__ import annotations

import threading
import warnings

import torch

_lock = threading.Lock()
_meta_lib = None  # kept alive: a Library's registrations end with it


def allow_float_grouped_mm_in_fake_tensors() -> None:
    """torch's meta kernel of `_grouped_mm` copies CUDA's bf16-only check, so Dynamo's fake-tensor pass
    rejects the float32 MoE expert matmul that CPU and tpu eager run fine (transformers picks
    `_grouped_mm` for tpu; 63 of 64 compile failures of the 5,000-model run): compute the meta result
    in bf16 and give it the real dtype. Installed where fake tensors look: the Python dispatcher's
    `py_kernels`, the meta table and the Meta dispatch key. Idempotent."""
    global _meta_lib
    with _lock:
        if _meta_lib is not None:
            return
        from torch._decomp import meta_table
        from torch._meta_registrations import meta_grouped_mm

        bf16 = torch.bfloat16
        op = torch.ops.aten._grouped_mm.default

        def meta(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
            if mat_a.dtype == mat_b.dtype and mat_a.dtype in (torch.float32, torch.float16):
                cast = None if bias is None else bias.to(bf16)
                out = meta_grouped_mm(mat_a.to(bf16), mat_b.to(bf16), offs, cast, bf16)
                return out.to(out_dtype or mat_a.dtype)
            return meta_grouped_mm(mat_a, mat_b, offs, bias, out_dtype)

        op.py_kernels[torch._C.DispatchKey.Meta] = meta
        meta_table[op] = meta
        lib = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "overriding a previously registered kernel": that is the point
            lib.impl("_grouped_mm", meta, "Meta")
        op._dispatch_cache.clear()
        _meta_lib = lib


def keep_dynamo_out_of_the_runtime(trace_rules=None) -> None:
    """Mark hf_tpu's runtime, JAX and jaxlib as code Dynamo skips (runs as is, never traces)."""
    if trace_rules is None:
        from torch._dynamo import trace_rules
    for module in ("hf_tpu.runtime", "jax", "jaxlib"):
        trace_rules.add(module)


def _device_queries() -> tuple:
    tpu = torch.tpu  # the device module registration installed
    return (tpu.is_available, tpu.device_count, tpu.current_device)


def fold_device_queries(variables_torch=None, trace_rules=None) -> None:
    """Let Dynamo evaluate the `torch.tpu` queries whose answer never changes in a process while it traces
    (`constant_fold_functions` of `torch._dynamo.variables.torch`, where `torch.cuda.is_available` is),
    instead of breaking the graph on a call into the skipped runtime: each must be a constant-fold
    function, and an allowed callable of the trace rules (so Dynamo does not skip it first). Each module
    is patched as it finishes loading (the first imports the second half-way), or both at once.
    Idempotent."""
    if variables_torch is None and trace_rules is None:
        from torch._dynamo import trace_rules
        from torch._dynamo.variables import torch as variables_torch
    for fn in _device_queries():
        if variables_torch is not None:
            variables_torch.constant_fold_functions[fn] = None
        if trace_rules is not None:
            trace_rules._allowed_callable_ids.add(id(fn))


def install() -> None:
    keep_dynamo_out_of_the_runtime()
    allow_float_grouped_mm_in_fake_tensors()
    fold_device_queries()


def fullgraph_requested() -> bool:
    """Whether the `torch.compile` call being traced now asked for one graph (`fullgraph=True`). Read from
    Dynamo's active frame translator while a backend compiles the forward; False when none is active
    (a backward graph compiles later, at `.backward()`)."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        return bool(InstructionTranslator.current_tx().one_graph)
    except Exception:  # noqa: BLE001 - no translator active, or Dynamo's internals moved
        return False
