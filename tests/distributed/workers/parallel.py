"""A tensor before init_process_group, DDP, DTensor basics, parallelize_module and functional collectives (eager and inside
`torch.compile(backend="tpu")`) on tpu_dist (argv: rank world_size); exits 1 listing every failed check."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from checks import Checker  # noqa: E402

rank, world = int(sys.argv[1]), int(sys.argv[2])
check = Checker(rank)
# torchrun order "tensor first": the device starts here and joins the JAX job itself
early = torch.full((2, 2), float(rank), device="tpu") * 2 + 1
dist.init_process_group("tpu_dist")
dist.all_reduce(early, op=dist.ReduceOp.MAX)
check.close("tensor made before init_process_group", early, torch.full((2, 2), 2.0 * (world - 1) + 1))


def batch(r: int) -> torch.Tensor:
    return torch.randn(3, 4, generator=torch.Generator().manual_seed(r))


def ddp():
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    ref = torch.nn.Linear(4, 2)
    module = torch.nn.Linear(4, 2).to("tpu")
    with torch.no_grad():  # rank-dependent weights: DDP must broadcast rank 0's
        module.weight.copy_(ref.weight.to("tpu") + rank)
        module.bias.copy_(ref.bias.to("tpu") + rank)
    model = DDP(module)
    model(batch(rank).to("tpu")).square().sum().backward()
    grads = []
    for r in range(world):
        ref.zero_grad()
        ref(batch(r)).square().sum().backward()
        grads.append(ref.weight.grad.clone())
    check.close("ddp broadcast weights", model.module.weight.detach(), ref.weight.detach())
    check.close("ddp averaged grad", model.module.weight.grad, sum(grads) / world)


check.run("ddp", ddp)


def dtensor():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("tpu", (world,))
    full = torch.arange(world * 4 * 3, dtype=torch.float32).reshape(world * 4, 3)
    d = distribute_tensor(full.to("tpu"), mesh, [Shard(0)])
    check.close("dtensor shard", d.to_local(), full[4 * rank : 4 * rank + 4])
    check.close("dtensor replicate", d.redistribute(mesh, [Replicate()]).to_local(), full)
    check.close("dtensor op", (d * 2 + 1).full_tensor(), full * 2 + 1)
    check.close("dtensor sum", d.sum().full_tensor(), full.sum())


check.run("dtensor", dtensor)


def tensor_parallel():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("tpu", (world,))
    torch.manual_seed(1)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    torch.manual_seed(1)
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)).to("tpu")
    parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = batch(0)
    check.close("parallelize_module colwise+rowwise forward", mlp(x.to("tpu")), ref(x))


check.run("tensor parallel", tensor_parallel)
import torch.distributed._functional_collectives as funcol  # noqa: E402

group = dist.group.WORLD


def rank_input(r: int) -> torch.Tensor:
    return torch.arange(2 * world * 3, dtype=torch.float32).reshape(2 * world, 3) * (r + 1)


xs = [rank_input(r) for r in range(world)]
x = xs[rank].to("tpu")


def eager():
    check.close("funcol all_reduce", funcol.all_reduce(x, "sum", group), sum(xs))
    check.close("funcol all_gather_tensor", funcol.all_gather_tensor(x, 0, group), torch.cat(xs))
    check.close(
        "funcol reduce_scatter_tensor",
        funcol.reduce_scatter_tensor(x, "sum", 0, group),
        sum(xs)[2 * rank : 2 * rank + 2],
    )
    check.close(
        "funcol all_to_all_single",
        funcol.all_to_all_single(x, None, None, group),
        torch.cat([xi[2 * rank : 2 * rank + 2] for xi in xs]),
    )


check.run("eager functional collectives", eager)


def compiled():
    @torch.compile(backend="tpu")
    def step(t):
        y = funcol.all_reduce(t * 2, "sum", group)
        return torch.relu(y - 10.0) + funcol.all_gather_tensor(t, 0, group)[: t.shape[0]]

    expected = torch.relu(2 * sum(xs) - 10.0) + xs[0]
    check.close("compiled all_reduce + all_gather", step(x), expected)


check.run("compiled functional collectives", compiled)
dist.barrier()
dist.destroy_process_group()
sys.exit(check.finish())
