"""`torch.compile(backend="tpu")`: ATen FX graphs interpreted with the lowering table in one jax.jit."""
