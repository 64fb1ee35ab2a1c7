"""TorchDynamo and inductor on tpu: the `tpu` backend, what Dynamo must know before it traces anything,
and graphs with tpu tensors routed away from inductor.

`torch.compile(backend="tpu")` is registered the moment TorchDynamo's backend registry is imported.
TorchDynamo registers a backend named by an entry point on its first lookup, without a lock: threads
whose first `torch.compile` call runs at the same time both register it, and all but one fail with
"duplicate name: tpu". Registering it as the registry module loads (the import lock runs that once)
leaves nothing for the lookups to do. The backend itself loads on the first compile, so importing
TorchDynamo does not import JAX.

Dynamo traces a function (with fake tensors) before it calls the backend, whatever backend the user picked
(`tpu`, `aot_eager`, ...), so the rest is applied as Dynamo's own modules load, not when our backend module
is first imported:
- Dynamo never traces into the runtime (nor JAX): a `.item()` or `.cpu()` in compiled code, or a graph
  break such as `loss.backward()`, reaches our eager kernels while Dynamo's frame hook is active;
- meta (fake-tensor) kernels PyTorch gets wrong for tpu are fixed;
- `torch.tpu.is_available()`, `device_count()` and `current_device()` fold to constants while tracing, as
  their `torch.cuda` counterparts do (else, the runtime being skipped, each would break the graph and
  fail `fullgraph=True`).
"""

from __future__ import annotations

import functools
import threading
import warnings
from types import ModuleType

import torch

from hf_tpu.integrations.patching import patch

_lock = threading.Lock()
_meta_lib: list = []  # kept alive: a Library's registrations end with it


def allow_float_grouped_mm_in_fake_tensors() -> None:
    """torch's meta kernel of `_grouped_mm` copies CUDA's bf16-only check, so Dynamo's fake-tensor pass
    rejects the float32 MoE expert matmul that CPU and tpu eager run fine (transformers picks
    `_grouped_mm` for tpu; 63 of 64 compile failures of the 5,000-model run): compute the meta result
    in bf16 and give it the real dtype. Installed where fake tensors look: the Python dispatcher's
    `py_kernels`, the meta table and the Meta dispatch key. Idempotent."""
    with _lock:
        if _meta_lib:
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
        _meta_lib.append(lib)


def _device_queries() -> tuple:
    tpu = torch.tpu  # the device module registration installed
    return (tpu.is_available, tpu.device_count, tpu.current_device)


def tpu(gm, example_inputs, **kwargs):
    """The `tpu` backend (`hf_tpu.runtime.compile.backend.tpu_backend`), imported when first used."""
    from hf_tpu.runtime.compile.backend import tpu_backend

    return tpu_backend(gm, example_inputs, **kwargs)


def register_tpu_backend(registry: ModuleType) -> None:
    """As Dynamo's backend registry loads: the `tpu` backend, and the fake-tensor fixes (before Dynamo
    fake-traces the first function)."""
    allow_float_grouped_mm_in_fake_tensors()
    # Only while TorchDynamo has not discovered its entry-point backends yet. Once it has, the lookup
    # that is importing hf_tpu through the entry point (torch.compile before `import hf_tpu`, with
    # autoloading off) registers `tpu` itself right after, and a second registration would fail.
    if "tpu" not in registry._COMPILER_FNS and "tpu" not in registry._BACKENDS:
        registry.register_backend(compiler_fn=tpu, name="tpu")


def keep_out_of_the_runtime(trace_rules: ModuleType) -> None:
    """As Dynamo's trace rules load: never trace hf_tpu's runtime or JAX, whichever backend compiles (they
    run as they are, never traced), nor the integration modules whose patches call into the runtime (the
    table's `traced=False` rows): traced into, `torch.accelerator.current_stream()`, which Dynamo reads at
    every frame, would reach the skipped runtime and break every graph once."""
    from hf_tpu.integrations.table import untraced_modules

    for module in ("hf_tpu.runtime", *untraced_modules(), "jax", "jaxlib"):
        trace_rules.add(module)


def allow_tpu_device_queries(trace_rules: ModuleType) -> None:
    """As Dynamo's trace rules load: `torch.tpu.is_available()` and the like may be called while tracing
    although the runtime is skipped (`fold_tpu_device_queries` makes them constants): each must be an
    allowed callable of the trace rules, or Dynamo skips it first."""
    for fn in _device_queries():
        trace_rules._allowed_callable_ids.add(id(fn))


def fold_tpu_device_queries(variables_torch: ModuleType) -> None:
    """As Dynamo's torch-function rules load: `torch.tpu.is_available()` and the like, whose answer never
    changes in a process, fold to constants while tracing (`constant_fold_functions`, where
    `torch.cuda.is_available` is) instead of breaking the graph on a call into the skipped runtime."""
    for fn in _device_queries():
        variables_torch.constant_fold_functions[fn] = None


def route_tpu_graphs_from_inductor(compile_fx_module: ModuleType) -> None:
    """As inductor's `compile_fx` module loads: graphs that touch tpu go to the `tpu` backend.

    `torch.compile(model)` with no backend (what diffusers' docs and `compile_repeated_blocks` write) means
    inductor, and torch 2.13's inductor registers a `tpu` device of its own whose Pallas code generator
    imports `torch_tpu` (`ModuleNotFoundError`). Both ways into inductor (the default
    `_TorchCompileInductorWrapper` and `backend="inductor"`) call this module's `compile_fx`, which looks
    the name up at call time: wrapping it here sends a graph whose inputs, values or outputs live on tpu
    to hf_tpu's compiler, and leaves every CPU (or CUDA) graph to inductor untouched. `fullgraph` and
    `dynamic` are TorchDynamo's (they shape the graph before any backend sees it), so they keep their
    meaning; inductor's `mode` and `options` tune inductor's own code generation and have no effect on
    a tpu graph (XLA compiles it). Ahead-of-time inductor (`aot_compile`, AOTInductor packages) writes
    C++ for a device and is refused for tpu with an error that says so.
    """

    def make(original):
        @functools.wraps(original)
        def compile_fx(model_, example_inputs_, *args, **kwargs):
            if not _graph_touches_tpu(model_, example_inputs_):
                return original(model_, example_inputs_, *args, **kwargs)
            if _aot_compiling():
                raise RuntimeError(
                    "hf_tpu: ahead-of-time inductor (AOTInductor, torch._export.aot_compile) generates C++ for "
                    "CPU/CUDA and cannot compile a graph with tpu tensors; use torch.compile(...) (it runs on "
                    "hf_tpu's compiler) or export the model on CPU"
                )
            return tpu(model_, example_inputs_)

        return compile_fx

    patch(compile_fx_module, "compile_fx", make)


def _aot_compiling() -> bool:
    try:
        from torch._inductor.virtualized import V

        return bool(V.aot_compilation)
    except Exception:  # noqa: BLE001 - inductor's internals moved: treat as a plain compile
        return False


def _graph_touches_tpu(gm, example_inputs) -> bool:
    """Whether a graph Dynamo hands to a backend reads, computes or returns a tpu tensor (its example
    inputs, or the traced values of its nodes, which also show tensors it creates on tpu)."""

    def on_tpu(value) -> bool:
        return isinstance(value, torch.Tensor) and value.device.type == "tpu"

    if any(on_tpu(x) for x in example_inputs or ()):
        return True
    graph = getattr(gm, "graph", None)
    if graph is None:
        return False
    for node in graph.nodes:
        for key in ("example_value", "val"):
            if any(on_tpu(v) for v in torch.utils._pytree.tree_leaves(node.meta.get(key))):
                return True
    return False
