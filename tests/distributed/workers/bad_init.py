"""Jobs that cannot start (argv: rank world_size case...); prints the error each case got.

Single-process cases run one after the other in this process (each fails before JAX starts its backends):
no_env (init_process_group without any launcher env), no_master_addr (WORLD_SIZE=2 without MASTER_ADDR),
no_coordinator (rank 1 of 2 whose rank 0 never starts: the device's init must fail within
HF_TPU_DIST_INIT_TIMEOUT naming the address). late_init (both ranks of a spawn-style job: a tpu tensor,
then init_process_group(rank, world_size) without launcher env) runs alone.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

rank, world, cases = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
LAUNCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
launch_env = {k: os.environ[k] for k in LAUNCH if k in os.environ}


def attempt(case: str) -> None:
    for k in LAUNCH:
        os.environ.pop(k, None)
    if case == "no_env":
        dist.init_process_group("tpu_dist")
    elif case == "no_master_addr":
        os.environ.update(RANK="1", WORLD_SIZE="2", MASTER_PORT=launch_env["MASTER_PORT"])
        torch.ones(2, device="tpu").cpu()
    elif case == "no_coordinator":
        os.environ.update(launch_env)
        torch.ones(2, device="tpu").cpu()
    elif case == "late_init":
        torch.ones(2, device="tpu").cpu()
        dist.init_process_group(
            "tpu_dist",
            init_method=f"tcp://127.0.0.1:{launch_env['MASTER_PORT']}",
            rank=rank,
            world_size=world,
        )


for case in cases:
    start = time.monotonic()
    try:
        attempt(case)
        print(f"NO ERROR {case}", flush=True)
    except Exception as exc:  # noqa: BLE001 - the test reads the message
        print(f"ERROR {case} {type(exc).__name__} after {time.monotonic() - start:.1f}s: {exc}", flush=True)
