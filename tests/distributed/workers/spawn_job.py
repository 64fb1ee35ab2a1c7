"""torch.multiprocessing.spawn of a tpu_dist job (argv: world_size port).

Rank/world size are passed to init_process_group with device_id=tpu:rank, as mp.spawn scripts do. Rank 0
finds the store through MASTER_ADDR/MASTER_PORT in its env (init_method "env://"); the other ranks have
nothing in the env and use init_method="tcp://..." (JAX's coordinator then comes from the c10d store's
address): both ways of deriving the coordinator must agree, or the job never forms.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def main(rank: int, world: int, port: int) -> None:
    if rank == 0:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        init = {"init_method": "env://"}
    else:
        init = {"init_method": f"tcp://127.0.0.1:{port}"}
    dist.init_process_group(
        "tpu_dist", rank=rank, world_size=world, device_id=torch.device("tpu", rank), **init
    )
    torch.tpu.set_device(rank)
    t = torch.arange(4, dtype=torch.float32, device=f"tpu:{rank}") * (rank + 1)
    dist.all_reduce(t)
    expected = torch.arange(4, dtype=torch.float32) * sum(range(1, world + 1))
    torch.testing.assert_close(t.cpu(), expected)
    out = torch.empty(world, dtype=torch.int64, device="tpu")
    dist.all_gather_into_tensor(out, torch.tensor([rank * 10], device="tpu"))
    assert out.cpu().tolist() == [r * 10 for r in range(world)], out.cpu()
    dist.destroy_process_group()
    print(f"{init['init_method'].split(':')[0]} rank {rank} ok", flush=True)


if __name__ == "__main__":
    world, port = int(sys.argv[1]), int(sys.argv[2])
    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        os.environ.pop(k, None)
    mp.spawn(main, args=(world, port), nprocs=world, join=True)
    print("spawn ok", flush=True)
