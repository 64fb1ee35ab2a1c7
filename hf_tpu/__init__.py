"""hf_tpu: a `tpu` device for PyTorch on JAX/XLA, Hugging Face integrations, and a compatibility harness.

Importing this package registers the device (idempotent); with the package installed, `import torch`
alone already does, through the `torch.backends` entry point.
"""

from hf_tpu.runtime.device.registration import register

__version__ = "0.1.0"

register()

# transformers/accelerate/diffusers patches, applied when (or if) those modules get imported
from hf_tpu.integrations import install as _install_integrations  # noqa: E402

_install_integrations()


def compile(model, **kwargs):  # noqa: A001 - mirrors torch.compile
    """`torch.compile(model, backend="tpu")`; `buckets=(64, 128, ...)` pads sequence lengths (see bucketing.py)."""
    from hf_tpu.runtime.compile.bucketing import compile as _compile

    return _compile(model, **kwargs)


__all__ = ["register", "compile", "__version__"]
