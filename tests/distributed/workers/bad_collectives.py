"""Collectives whose ranks disagree, and ranks that die (argv: rank world_size case...).

Each case prints `ERROR <case> <exception type> after <s>s: <message>` (or `NO ERROR <case>`) on every rank;
the test reads those lines. Mismatch cases run one after another in one job: nothing is sent when the ranks
disagree, so the job stays usable, which the `healthy` case checks with a real all_reduce against CPU.
`p2p`: a send and a recv of different shapes (`p2p_any`: the recv from any source). `any_nobody`: rank 1
receives from any source while nobody sends (its timeout cut to 3 s for this case). `die1` / `die0`: that rank exits (os._exit) after one good collective; the others call all_reduce.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

rank, world, cases = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
dist.init_process_group("tpu_dist")


def attempt(case: str) -> None:
    if case == "shape":  # all_reduce of (4,) on rank 0, (5,) on rank 1, ...
        dist.all_reduce(torch.ones(4 + rank, device="tpu"))
    elif case == "dtype":  # float32 on rank 0, int64 elsewhere
        dist.all_reduce(torch.ones(4, device="tpu", dtype=torch.float32 if rank == 0 else torch.int64))
    elif case == "gather_size":  # rank 1's output holds 3 rows instead of world_size * 2
        rows = 3 if rank == 1 else 2 * world
        out = torch.empty(rows, 3, device="tpu")
        dist.all_gather_into_tensor(out, torch.ones(2, 3, device="tpu"))
    elif case == "splits":  # rank 0 sends rank 1 three rows; rank 1 expects two from rank 0
        in_splits = [1, 3] + [2] * (world - 2) if rank == 0 else [2] * world
        out_splits = [2] * world
        inp = torch.ones(sum(in_splits), 3, device="tpu")
        out = torch.empty(sum(out_splits), 3, device="tpu")
        dist.all_to_all_single(out, inp, out_splits, in_splits)
    elif case == "different_collectives":
        t = torch.ones(4, device="tpu")
        dist.all_reduce(t) if rank == 0 else dist.broadcast(t, src=0)
    elif case == "p2p":  # rank 0 sends 4 float32, rank 1 receives into 5 (other ranks sit it out)
        if rank == 0:
            dist.send(torch.ones(4, device="tpu"), 1)
        elif rank == 1:
            dist.recv(torch.empty(5, device="tpu"), 0)
        else:
            raise RuntimeError("not a party to the send")
    elif case == "p2p_any":  # the same, the recv from any source (src=None)
        if rank == 0:
            dist.send(torch.ones(4, device="tpu"), 1)
        elif rank == 1:
            dist.recv(torch.empty(5, device="tpu"))
        else:
            raise RuntimeError("not a party to the send")
    elif case == "any_nobody":  # rank 1 waits for a message nobody sends; the others go on
        if rank == 1:
            os.environ["HF_TPU_DIST_TIMEOUT"], before = "3", os.environ.get("HF_TPU_DIST_TIMEOUT", "")
            try:
                dist.recv(torch.empty(4, device="tpu"))
            finally:
                os.environ["HF_TPU_DIST_TIMEOUT"] = before
        else:
            raise RuntimeError("not the receiver")
    elif case == "healthy":  # after the failed cases, the job still works
        t = torch.full((3,), float(rank + 1), device="tpu")
        dist.all_reduce(t)
        expected = torch.full((3,), float(sum(range(1, world + 1))))
        torch.testing.assert_close(t.cpu(), expected)
        print(f"HEALTHY rank {rank}", flush=True)
    elif case in ("die0", "die1"):
        t = torch.ones(4, device="tpu")
        dist.all_reduce(t)
        assert t.cpu().tolist() == [float(world)] * 4
        if rank == int(case[-1]):
            print(f"DYING rank {rank}", flush=True)
            os._exit(3)
        time.sleep(1)  # the peer is gone by now
        dist.all_reduce(t)
        t.cpu()
    else:
        raise SystemExit(f"unknown case {case}")


for case in cases:
    start = time.monotonic()
    try:
        attempt(case)
        if case != "healthy":
            print(f"NO ERROR {case}", flush=True)
    except Exception as exc:  # noqa: BLE001 - the test reads the message
        message = str(exc).replace("\n", " | ")
        print(
            f"ERROR {case} {type(exc).__name__} after {time.monotonic() - start:.1f}s: {message}", flush=True
        )
        if case.startswith("die"):  # rank 0 hosts the store: let the other survivors time out first
            time.sleep(4)
dist.destroy_process_group()
print(f"DONE rank {rank}", flush=True)
