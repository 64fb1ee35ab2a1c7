"""From the PyTorch dispatcher to the lowering table: per-op kernels and the boxed fallback."""
