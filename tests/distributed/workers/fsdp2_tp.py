"""FSDP2 + tensor parallel on a 2-D mesh against one CPU process (argv: rank world_size models steps;
world_size 4; models: a comma list of mlp, mlp-seq, llama): `init_device_mesh("tpu", (2, 2),
mesh_dim_names=("dp", "tp"))`, each block tensor-parallel on the "tp" sub-mesh (`parallelize_module`:
column-wise then row-wise linears; mlp-seq: sequence parallel, the residual stream split along the
sequence between blocks and the norm a `SequenceParallel`) and `fully_shard` per block and at the root
on "dp"; AdamW steps where
dp group d trains on its half of each global batch. The global loss of every step and the final
parameters (`full_tensor()`) must equal the single-process run on whole batches. Exits 1 listing every
failed check."""

from __future__ import annotations

import functools
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from checks import Checker  # noqa: E402
from fsdp_models import LR, MODELS, WEIGHT_DECAY, blocks_of, cpu_reference, local, to_tpu  # noqa: E402

rank, world = int(sys.argv[1]), int(sys.argv[2])
kinds = (sys.argv[3] if len(sys.argv) > 3 else "mlp").split(",")
steps = int(sys.argv[4]) if len(sys.argv) > 4 else 2
check = Checker(rank)
dist.init_process_group("tpu_dist")
DP = TP = 2
assert world == DP * TP, "the 2-D mesh test runs on 4 ranks"


def tp_plan(kind: str) -> dict:
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if kind == "mlp":
        return {"0": ColwiseParallel(), "2": RowwiseParallel()}
    if kind == "mlp-seq":  # the block's input and output split along the sequence (dim 1)
        return {"0": ColwiseParallel(input_layouts=Shard(1)), "2": RowwiseParallel(output_layouts=Shard(1))}
    return {
        **{f"self_attn.{p}_proj": ColwiseParallel() for p in "qkv"},
        "self_attn.o_proj": RowwiseParallel(),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(),
    }


def seq_root_plan() -> dict:
    """mlp-seq around the blocks: into the sequence split, a sequence-parallel norm, out of it."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    return {
        "inp": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "out": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }


def fsdp_tp_matches_cpu(kind: str):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    model, data, loss_fn = MODELS[kind](DP, steps)
    ref, ref_losses = cpu_reference(model, data, loss_fn)

    mesh = init_device_mesh("tpu", (DP, TP), mesh_dim_names=("dp", "tp"))
    dp_rank = mesh.get_local_rank("dp")
    model = model.to("tpu")
    for block in blocks_of(model):
        parallelize_module(block, mesh["tp"], tp_plan(kind))
        fully_shard(block, mesh=mesh["dp"])
    if kind == "mlp-seq":
        parallelize_module(model, mesh["tp"], seq_root_plan())
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    for step, batch in enumerate(data):
        opt.zero_grad()
        loss = loss_fn(model, to_tpu(local(batch, dp_rank, DP)))
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total, op=dist.ReduceOp.AVG)  # tp ranks hold equal losses: the dp average
        check.close(f"{kind} 2-D step {step} global loss", total, ref_losses[step])
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        check.close(f"{kind} 2-D final {name}", p.full_tensor(), ref_params[name].detach())


for kind in kinds:
    check.run(f"fsdp2 + tp {kind}", functools.partial(fsdp_tp_matches_cpu, kind))
dist.barrier()
dist.destroy_process_group()
sys.exit(check.finish())
