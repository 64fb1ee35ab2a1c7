"""`torch.compile(backend="tpu")`: registered the moment TorchDynamo's backend registry is imported.

TorchDynamo registers a backend named by an entry point on its first lookup, without a lock: threads
whose first `torch.compile` call runs at the same time both register it, and all but one fail with
"duplicate name: tpu". Registering it as the registry module loads (the import lock runs that once)
leaves nothing for the lookups to do. The backend itself loads on the first compile, so importing
TorchDynamo does not import JAX.
"""

from __future__ import annotations

from types import ModuleType


def tpu(gm, example_inputs, **kwargs):
    """The `tpu` backend (`hf_tpu.runtime.compile.backend.tpu_backend`), imported when first used."""
    from hf_tpu.runtime.compile.backend import tpu_backend

    return tpu_backend(gm, example_inputs, **kwargs)


def register_tpu_backend(registry: ModuleType) -> None:
    from hf_tpu.runtime.compile import dynamo_prep

    dynamo_prep.allow_float_grouped_mm_in_fake_tensors()  # before Dynamo fake-traces the first function
    # Only while TorchDynamo has not discovered its entry-point backends yet. Once it has, the lookup
    # that is importing hf_tpu through the entry point (torch.compile before `import hf_tpu`, with
    # autoloading off) registers `tpu` itself right after, and a second registration would fail.
    if "tpu" not in registry._COMPILER_FNS and "tpu" not in registry._BACKENDS:
        registry.register_backend(compiler_fn=tpu, name="tpu")


def keep_out_of_the_runtime(trace_rules: ModuleType) -> None:
    """As Dynamo's trace rules load: never trace hf_tpu's runtime or JAX, whichever backend compiles."""
    from hf_tpu.runtime.compile import dynamo_prep

    dynamo_prep.keep_dynamo_out_of_the_runtime(trace_rules)


def allow_tpu_device_queries(trace_rules: ModuleType) -> None:
    """As Dynamo's trace rules load: `torch.tpu.is_available()` and the like may be called while tracing
    although the runtime is skipped (`fold_tpu_device_queries` makes them constants)."""
    from hf_tpu.runtime.compile import dynamo_prep

    dynamo_prep.fold_device_queries(trace_rules=trace_rules)


def fold_tpu_device_queries(variables_torch: ModuleType) -> None:
    """As Dynamo's torch-function rules load: `torch.tpu.is_available()` and the like fold to constants."""
    from hf_tpu.runtime.compile import dynamo_prep

    dynamo_prep.fold_device_queries(variables_torch=variables_torch)


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
    original = getattr(compile_fx_module, "compile_fx", None)
    if original is None or getattr(original, "__hf_tpu__", False):
        return

    import functools

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

    compile_fx.__hf_tpu__ = True
    compile_fx_module.compile_fx = compile_fx


def _aot_compiling() -> bool:
    try:
        from torch._inductor.virtualized import V

        return bool(V.aot_compilation)
    except Exception:  # noqa: BLE001 - inductor's internals moved: treat as a plain compile
        return False


def _graph_touches_tpu(gm, example_inputs) -> bool:
    """Whether a graph Dynamo hands to a backend reads, computes or returns a tpu tensor (its example
    inputs, or the traced values of its nodes, which also show tensors it creates on tpu)."""
    import torch

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
