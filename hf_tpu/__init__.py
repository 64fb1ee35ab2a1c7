"""hf_tpu: a `tpu` device for PyTorch on JAX/XLA, Hugging Face integrations, and a compatibility harness.

Importing this package registers the device (idempotent); with the package installed, `import torch`
alone already does, through the `torch.backends` entry point.
"""

from hf_tpu.runtime.device.registration import register

__version__ = "0.1.0"

register()

# every patch (table.PATCHES): torch's own surface now, transformers/accelerate/diffusers/... when (or if)
# those modules get imported
from hf_tpu.integrations import install as _install_integrations  # noqa: E402

_install_integrations()


from hf_tpu.runtime.buffers.placement import PlacementError, mesh, set_mesh, use_mesh  # noqa: E402
from hf_tpu.runtime.tensors.sharding import replicate, shard, sharding  # noqa: E402


def sharding_policy(policy: str):
    """`with hf_tpu.sharding_policy("fsdp"):` loads and shards models with that policy ("tp", "fsdp",
    "replicate"); see hf_tpu.integrations.sharding."""
    from hf_tpu.integrations.sharding import sharding_policy as _policy

    return _policy(policy)


def shard_module(module, policy: str | None = None, plan: dict | None = None):
    """Lay a module's tpu parameters and buffers out over the chips by `policy` (default: `tp` when it has
    a tensor-parallel plan, else `fsdp`); returns the module."""
    from hf_tpu.integrations.sharding import shard_module as _shard_module

    return _shard_module(module, policy, plan)


def parallelize_pipeline(pipe, **kwargs):
    """Spread one diffusers generation over the mesh: weights by the sharding policy, `data="data"` splits the
    batch, `context="context"` the denoiser's sequence by its `_cp_plan` (see
    `hf_tpu.integrations.diffusers_parallel.parallelize_pipeline`); returns `pipe`."""
    from hf_tpu.integrations.diffusers_parallel import parallelize_pipeline as _parallelize_pipeline

    return _parallelize_pipeline(pipe, **kwargs)


def compiled_programs() -> list:
    """The live graphs `torch.compile(backend="tpu")` compiled, oldest first; each has `.name` and
    `.compiled_text()` (the optimized HLO of its first call: shapes, placements, collectives)."""
    from hf_tpu.runtime.compile.backend import PROGRAMS

    return sorted(PROGRAMS, key=lambda p: int("".join(c for c in p.name if c.isdigit()) or 0))


def compile(model, **kwargs):  # noqa: A001 - mirrors torch.compile
    """`torch.compile(model, backend="tpu")`; `buckets=(64, 128, ...)` pads sequence lengths (see bucketing.py)."""
    from hf_tpu.runtime.compile.bucketing import compile as _compile

    return _compile(model, **kwargs)


def compile_pipeline(pipe, **kwargs):
    """Compile a diffusers pipeline's denoisers, text encoders and VAE decoder for tpu, in place (see
    `hf_tpu.integrations.diffusers_compile.compile_pipeline`); `loop=True` runs the denoising loop as one program."""
    from hf_tpu.integrations.diffusers_compile import compile_pipeline as _compile_pipeline

    return _compile_pipeline(pipe, **kwargs)


__all__ = [
    "register",
    "compile",
    "compile_pipeline",
    "parallelize_pipeline",
    "mesh",
    "set_mesh",
    "use_mesh",
    "shard",
    "replicate",
    "sharding",
    "sharding_policy",
    "shard_module",
    "compiled_programs",
    "PlacementError",
    "__version__",
]
