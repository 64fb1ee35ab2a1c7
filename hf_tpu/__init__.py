"""hf_tpu: a `tpu` device for PyTorch on JAX/XLA, Hugging Face integrations, and a compatibility harness.

Importing this package registers the device (idempotent); with the package installed, `import torch`
alone already does, through the `torch.backends` entry point.
"""

from hf_tpu.runtime.registration import register

__version__ = "0.1.0"

register()

__all__ = ["register", "__version__"]
