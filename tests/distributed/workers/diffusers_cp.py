"""diffusers' own `enable_parallelism` under torchrun on tpu_dist (argv: rank world_size configs), each rank
checking the tpu output against one CPU process; exits 1 listing every failed check.

`configs` is a comma list of ring, ulysses, unified (ring_degree=2 x ulysses_degree=world/2), tp (the tiny
Flux transformer's forward), the same with -compiled (after `model.compile(backend="tpu")`, called twice), with
-load (`from_pretrained(path, parallel_config=...)`), with -pipe (a whole FluxPipeline generation) and with
-train (one training step, gradients summed over the ranks). Every rank builds the same model from the same
seed, so the weights agree without a broadcast; diffusers shards the sequence (context parallel: its `_cp_plan` hooks,
ring attention's all_gather, Ulysses' all_to_all_single) or the weights (tensor parallel: DTensor through
`parallelize_module`), and every rank ends with the whole output.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from checks import Checker  # noqa: E402

from tests.integrations import diffusion_zoo as zoo  # noqa: E402

ATOL = 1e-4
rank, world, configs = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(",")
check = Checker(rank)
torch.tpu.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("tpu_dist")


def parallel_config(name: str):
    """The diffusers config `name` stands for, over every rank of the job."""
    from diffusers import ContextParallelConfig, TensorParallelConfig

    kind = name.split("-")[0]
    if kind == "ring":
        return ContextParallelConfig(ring_degree=world)
    if kind == "ulysses":
        return ContextParallelConfig(ulysses_degree=world)
    if kind == "unified":  # diffusers' unified attention: Ulysses inside each ring step
        return ContextParallelConfig(ring_degree=2, ulysses_degree=world // 2)
    if kind == "tp":
        return TensorParallelConfig(tp_degree=world)
    raise ValueError(f"unknown config {name!r}")


def transformer_forward(name: str) -> None:
    """The tiny Flux transformer with `name`'s config: its forward on tpu equals the CPU forward."""
    torch.manual_seed(0)
    cpu = zoo.flux_transformer()
    if name.endswith("-load"):
        model = _load(cpu, parallel_config(name))
    else:
        model = zoo.flux_transformer()
        model.load_state_dict(cpu.state_dict())
        model = model.to("tpu")
        model.enable_parallelism(config=parallel_config(name))
    seen = _record_block_input(model)
    compiled = name.endswith("-compiled")
    if compiled:  # the recording hook would guard the graph on its list's length: a recompile per call
        handles.pop().remove()
        model.compile(backend="tpu")
    before = _compile_counts()
    inputs = zoo.flux_transformer_inputs()
    with torch.no_grad():
        expected = cpu(**inputs)[0]
        on_tpu = {k: v.to("tpu") if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        got = model(**on_tpu)[0]
        if compiled:
            check.close(f"{name}: second call", model(**on_tpu)[0], expected)
            _check_one_program(name, before, _compile_counts())
    _check_split(name, model, None if compiled else seen)
    check.close(f"{name}: transformer forward", got, expected)
    check.close(f"{name}: transformer forward on rank 0", _from_rank0(got), expected)


handles: list = []  # of the recording hooks, removed after the run they record


def _record_block_input(model) -> list:
    """The (type, shape) of the image tokens entering the first transformer block, at each call."""
    seen: list = []

    def hook(mod, args, kwargs):
        value = kwargs.get("hidden_states", args[0] if args else None)
        seen.append((type(value).__name__, tuple(value.shape), value.device.type))

    handles.append(model.transformer_blocks[0].register_forward_pre_hook(hook, with_kwargs=True))
    return seen


def _check_split(name: str, model, seen: list | None) -> None:
    """diffusers' own path ran (not hf_tpu's single-process mapping): context parallel gives each rank its
    slice of the 64 image tokens as a plain tpu tensor; tensor parallel turns the attention's weights into
    DTensors sharded over the ranks."""
    from torch.distributed.tensor import DTensor, Shard

    if name.startswith(("ring", "ulysses", "unified")):
        assert seen is None or seen == [("Tensor", (1, 64 // world, 32), "tpu")], (
            seen
        )  # 64 tokens of width 32
    else:
        weight = model.transformer_blocks[0].attn.to_q.weight
        assert isinstance(weight, DTensor) and weight.placements == (Shard(0),), (type(weight), weight)
        assert (
            weight.to_local().shape[0] == weight.shape[0] // world and weight.to_local().device.type == "tpu"
        )


def _load(cpu, config):
    """`from_pretrained(path, parallel_config=config)` of `cpu` saved on this rank: tensor parallel reads each
    rank's slices straight into DTensors on its device (diffusers' sharded load); context parallel loads with
    device_map="tpu" and then runs `enable_parallelism`."""
    import tempfile

    from diffusers import FluxTransformer2DModel, ParallelConfig, TensorParallelConfig

    path = tempfile.mkdtemp(prefix=f"flux-rank{rank}-")
    cpu.save_pretrained(path)
    if isinstance(config, TensorParallelConfig):
        return FluxTransformer2DModel.from_pretrained(path, parallel_config=config)
    # a bare ContextParallelConfig fails in diffusers 0.42.1's from_pretrained on any device (it reads
    # `.tensor_parallel_config` of it): wrapped, as its docs show
    config = ParallelConfig(context_parallel_config=config)
    return FluxTransformer2DModel.from_pretrained(path, device_map="tpu", parallel_config=config)


def _compile_counts() -> tuple[int, int, int, int]:
    """(SPMD programs compiled, SPMD program calls, Dynamo graphs, Dynamo graph breaks) so far."""
    from torch._dynamo.utils import counters

    from hf_tpu.runtime.distributed.compiled import stats

    breaks = sum(counters["graph_break"].values())
    return stats["compiled"], stats["calls"], counters["stats"]["unique_graphs"], breaks


def _check_one_program(name: str, before: tuple, after: tuple) -> None:
    """`model.compile(backend="tpu")` of the parallel model: one graph without breaks, its collectives
    (all_to_all_single / all_gather / DTensor's all_reduce) inside it, compiled once into one SPMD program
    over the ranks that both calls ran (the second compiles nothing). Unified attention's collectives run over
    two groups (the ring's ranks and the Ulysses ranks), the rows and columns of a 2x2 grid: one program over
    the grid (compiled.spmd_plan)."""
    delta = tuple(a - b for a, b in zip(after, before, strict=True))
    expected = (1, 2, 1, 0)
    assert delta == expected, f"{name}: (programs, calls, graphs, breaks) grew by {delta}"


def _from_rank0(t: torch.Tensor) -> torch.Tensor:
    """Rank 0's copy of `t`: every rank must hold the same whole output, not just a close one."""
    t = t.clone()
    dist.broadcast(t, src=0)
    return t


def train(name: str) -> None:
    """One training step (forward, MSE loss, backward, AdamW step) of the tiny Flux transformer under `name`'s
    context-parallel config. Each rank's backward covers its own tokens, so the gradients are summed over the
    ranks (the all_reduce data parallelism would do); then loss, every gradient and every updated weight equal
    one CPU step. Ring steps' gradients come from hf_tpu's native backward op (diffusers' ignores the step's
    keys/values)."""
    torch.manual_seed(0)
    cpu = zoo.flux_transformer().train()
    model = zoo.flux_transformer().train()
    model.load_state_dict(cpu.state_dict())
    model = model.to("tpu")
    model.enable_parallelism(config=parallel_config(name))
    inputs = zoo.flux_transformer_inputs()
    target = torch.randn(1, 64, 4, generator=torch.Generator().manual_seed(1))
    expected = _train_step(cpu, inputs, target)
    on_tpu = {k: v.to("tpu") if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    got = _train_step(model, on_tpu, target.to("tpu"), world_sum=True)
    for (what, tensors), (_, wanted) in zip(got, expected, strict=True):
        for key, tensor in tensors.items():
            torch.testing.assert_close(
                tensor, wanted[key], atol=ATOL, rtol=0, msg=lambda m, w=what, k=key: f"{w} {k}: {m}"
            )


def _train_step(model, inputs: dict, target, world_sum: bool = False) -> list:
    """[("loss", ...), ("grad", ...), ("weight", ...)] of one AdamW step, each a dict of CPU tensors."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = torch.nn.functional.mse_loss(model(**inputs)[0], target)
    loss.backward()
    if world_sum:
        for p in model.parameters():
            dist.all_reduce(p.grad)
    grads = {n: p.grad.cpu() for n, p in model.named_parameters()}
    optimizer.step()
    weights = {n: p.detach().cpu() for n, p in model.named_parameters()}
    return [("loss", {"": loss.detach().cpu()}), ("grad", grads), ("weight", weights)]


def pipeline(name: str) -> None:
    """A whole FluxPipeline generation (2 steps, CPU generator) with the transformer under `name`'s config."""
    family = zoo.FAMILIES["flux"]
    pipe = family.build()
    seen_cpu = _record_block_input(pipe.transformer)
    expected = zoo.output_of(family, pipe(**family.inputs()))
    handles.pop().remove()
    pipe.to("tpu")
    pipe.transformer.enable_parallelism(config=parallel_config(name))
    seen = _record_block_input(pipe.transformer)
    got = zoo.output_of(family, pipe(**family.inputs()))
    np.testing.assert_allclose(got, expected, atol=ATOL, rtol=0)
    # one call per denoising step; context parallel: each rank saw its slice of the image tokens
    ways = 1 if name.startswith("tp") else world
    (batch, tokens, width) = seen_cpu[0][1]
    assert len(seen) == len(seen_cpu) == 2, (seen, seen_cpu)
    assert all(s == ("Tensor", (batch, tokens // ways, width), "tpu") for s in seen), (seen, seen_cpu)


for config in configs:
    if config.endswith("-pipe"):
        check.run(f"{config}: FluxPipeline generation", lambda c=config: pipeline(c))
    elif config.endswith("-train"):
        check.run(f"{config}: training step", lambda c=config: train(c))
    else:
        check.run(f"{config}: setup", lambda c=config: transformer_forward(c))
dist.barrier()
dist.destroy_process_group()
sys.exit(check.finish())
