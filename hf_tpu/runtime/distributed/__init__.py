"""`tpu_dist`: torch.distributed (c10d) on the tpu device, over JAX's multi-controller runtime.

`registration.register()` runs when the device registers (cheap: no JAX). Modules, bottom up: launch_env
(the launcher's env), bootstrap (joining `jax.distributed`), programs (the JAX collectives), reduce_ops,
work, process_group (torch's API on top), registration. See README "tpu_dist" for what works.
"""
