"""`tpu_dist`: torch.distributed (c10d) on the tpu device, over JAX's multi-controller runtime.

`registration.register()` runs when the device registers (cheap: no JAX). Modules, bottom up: launch_env
(the launcher's env), bootstrap (joining `jax.distributed`), programs (the JAX collectives), reduce_ops,
work, agreement (ranks agree on each collective through the c10d store first: mismatches and dead peers
become clear errors), process_group (torch's API on top), compiled (functional collectives inside
`torch.compile(backend="tpu")`: the graph as one SPMD program), registration. See README "tpu_dist".

Env: HF_TPU_DIST_TIMEOUT (seconds a rank waits for the others at a collective, default: the
init_process_group timeout when given, else 600), HF_TPU_DIST_CHECK=0 (skip the agreement),
HF_TPU_DIST_INIT_TIMEOUT (joining the job).
"""
