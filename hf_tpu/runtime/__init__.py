"""The `tpu` device for PyTorch on JAX/XLA: registration, tensors, lowerings, eager modes."""
