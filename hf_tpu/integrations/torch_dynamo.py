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
