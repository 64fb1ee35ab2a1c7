"""Functional collectives inside `torch.compile(backend="tpu")` run as one SPMD program (argv: rank world_size,
then "grid" for the two-group checks alone).

Checks, against values computed on CPU: all_reduce (sum, avg, max), all_gather_tensor, reduce_scatter_tensor,
all_to_all_single and broadcast mixed with ordinary ops in one compiled function; that the graph compiled to
one executable run once per call (distributed.compiled.stats) with no eager collective program in between
(distributed.programs.stats) and nothing left to run op by op; a compiled tensor-parallel MLP step
(parallelize_module) against CPU; and that ranks calling the compiled function with different shapes get a
clear error on every rank. With "grid" (4 ranks): a graph whose collectives run over the rows and the columns
of a 2x2 DeviceMesh, one program over the grid. Exits 1 listing every failed check.
"""

from __future__ import annotations

import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._functional_collectives as funcol  # noqa: E402
from checks import Checker  # noqa: E402

rank, world = int(sys.argv[1]), int(sys.argv[2])
only_grid = sys.argv[3:] == ["grid"]
check = Checker(rank)
dist.init_process_group("tpu_dist")
group = dist.group.WORLD

from hf_tpu.runtime.compile.backend import GraphProgram  # noqa: E402
from hf_tpu.runtime.distributed import compiled, programs  # noqa: E402


def rank_input(r: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + r)
    return torch.randn(2 * world, 3, generator=g)


xs = [rank_input(r) for r in range(world)]
x = xs[rank].to("tpu")


def step(t):
    total = funcol.all_reduce(t * 2, "sum", group)
    mean = funcol.all_reduce(t, "avg", group)
    top = funcol.all_reduce(t, "max", group)
    gathered = funcol.all_gather_tensor(torch.relu(t), 0, group)
    scattered = funcol.reduce_scatter_tensor(t + 1, "sum", 0, group)
    exchanged = funcol.all_to_all_single(t, None, None, group)
    first = funcol.broadcast(t, 0, group)
    head = gathered[: t.shape[0]] + total - mean * top
    return head.sum(1), scattered * 3, exchanged - first


def expected_cpu(r: int):
    total = sum(2 * xi for xi in xs)
    mean = sum(xs) / world
    top = torch.stack(xs).amax(0)
    gathered = torch.cat([torch.relu(xi) for xi in xs])
    n = 2 * world // world
    scattered = sum(xi + 1 for xi in xs)[n * r : n * r + n]
    exchanged = torch.cat([xi[n * r : n * r + n] for xi in xs])
    head = gathered[: 2 * world] + total - mean * top
    return head.sum(1), scattered * 3, exchanged - xs[0]


def _one_spmd_program(fn, t, calls: int):
    """`calls` calls of torch.compile(fn): the outputs, after checking they ran as one SPMD executable
    compiled once and run once per call, with nothing op by op and no eager collective program."""
    compiled_fn = torch.compile(fn, backend="tpu")
    before = (dict(compiled.stats), dict(programs.stats))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [compiled_fn(t) for _ in range(calls)]
    op_by_op = [str(w.message) for w in caught if "op by op" in str(w.message)]
    assert not op_by_op, op_by_op
    assert compiled.stats["compiled"] - before[0]["compiled"] == 1, (before, compiled.stats)
    assert compiled.stats["calls"] - before[0]["calls"] == calls, (before, compiled.stats)
    assert programs.stats["runs"] == before[1]["runs"], (before, programs.stats)
    return outs


def grid():
    """Collectives over both dimensions of a 2x2 DeviceMesh in one graph (unified context parallelism and
    FSDP + TP make such graphs): rank r = 2 i + j, its row group {2i, 2i+1} (stride 1) and its column group
    {j, 2+j} (stride 2). One program over the grid; values against CPU."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("tpu", (2, 2))
    rows, cols = mesh.get_group(1), mesh.get_group(0)
    i, j = divmod(rank, 2)

    def both(t):
        row_sum = funcol.all_reduce(t, "sum", rows)
        col_gather = funcol.all_gather_tensor(row_sum * 2, 0, cols)
        exchanged = funcol.all_to_all_single(t, None, None, rows)
        col_max = funcol.all_reduce(t, "max", cols)
        return col_gather, exchanged - col_max

    outs = _one_spmd_program(both, x, 2)
    row_sums = [xs[0] + xs[1], xs[2] + xs[3]]
    n = xs[0].shape[0] // 2
    col_max = torch.maximum(xs[j], xs[2 + j])
    want = (
        torch.cat([2 * row_sums[0], 2 * row_sums[1]]),
        torch.cat([xs[2 * i][n * j : n * j + n], xs[2 * i + 1][n * j : n * j + n]]) - col_max,
    )
    for out in outs:
        for name, got, expected in zip(
            ("column all_gather of row sums", "row all_to_all - column max"), out, want
        ):
            check.close(f"grid {name}", got, expected)


if only_grid:
    assert world == 4, "the grid checks run on 4 ranks"
    check.run("compiled collectives over a 2x2 grid as one program", grid)
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(check.finish())


def one_program():
    compiled_fn = torch.compile(step, backend="tpu")
    before = (dict(compiled.stats), dict(programs.stats))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [compiled_fn(x) for _ in range(3)]
    op_by_op = [str(w.message) for w in caught if "op by op" in str(w.message)]
    assert not op_by_op, op_by_op
    for out in outs:
        for name, got, want in zip(("reduced", "scattered", "exchanged"), out, expected_cpu(rank)):
            check.close(f"compiled {name}", got, want)
    # one SPMD executable, compiled once and run once per call; no eager collective program ran
    assert compiled.stats["compiled"] - before[0]["compiled"] == 1, (before, compiled.stats)
    assert compiled.stats["calls"] - before[0]["calls"] == 3, (before, compiled.stats)
    assert programs.stats["runs"] == before[1]["runs"], (before, programs.stats)
    graphs = [p for p in __import__("hf_tpu").compiled_programs() if isinstance(p, GraphProgram)]
    spmd = [p for p in graphs if isinstance(p._jitted, compiled.SpmdProgram)]
    assert len(spmd) == 1 and not spmd[0].missing, [(p.name, p.missing) for p in graphs]
    hlo = spmd[0].compiled_text()  # the one executable holds the collectives themselves
    for collective in ("all-reduce", "all-gather", "all-to-all"):
        assert collective in hlo, f"{collective} not in the compiled HLO:\n{hlo[:3000]}"
    # the eager functional collectives give the same values (op by op, through ProcessGroupTPU)
    eager = step(x)
    for got, want in zip(outs[0], eager):
        check.close("compiled == eager", got, want.cpu())


check.run("compiled functional collectives as one program", one_program)


def tensor_parallel_step():
    """parallelize_module (colwise + rowwise MLP) under torch.compile: DTensor's collectives reach the
    graph as functional collectives, so the forward compiles to one SPMD program; forward and gradients
    against CPU."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("tpu", (world,))
    torch.manual_seed(1)
    hidden = 4 * world  # DTensor shards it evenly
    ref = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 4))
    torch.manual_seed(1)
    mlp = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 4)).to(
        "tpu"
    )
    parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    batch = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    before = dict(compiled.stats)
    out = torch.compile(mlp, backend="tpu")(batch.to("tpu"))
    assert compiled.stats["calls"] == before["calls"] + 1, (before, compiled.stats)
    expected = ref(batch)
    check.close("compiled tensor-parallel forward", out, expected.detach())
    out.square().sum().backward()
    expected.square().sum().backward()
    for (name, param), (_, ref_param) in zip(mlp.named_parameters(), ref.named_parameters()):
        grad = param.grad.full_tensor() if hasattr(param.grad, "full_tensor") else param.grad
        check.close(f"compiled tensor-parallel grad {name}", grad, ref_param.grad)


check.run("compiled tensor-parallel step", tensor_parallel_step)


def mismatch():
    @torch.compile(backend="tpu", dynamic=False)
    def reduce_twice(t):
        return funcol.all_reduce(t, "sum", group) * 2

    t = torch.ones(3 + rank, device="tpu")  # (3,) on rank 0, (4,) on rank 1
    try:
        reduce_twice(t)
    except Exception as exc:  # noqa: BLE001
        message = str(exc)
        assert "disagree" in message and "input shapes differ" in message, message
        assert "rank 0: input shapes (3,)" in message and "rank 1: input shapes (4,)" in message, message
        print(f"MISMATCH ERROR rank {rank}: {message.splitlines()[0]}", flush=True)
    else:
        raise AssertionError("ranks with different shapes ran the compiled collective")
    # the job is still usable after the refused call
    y = torch.full((2,), float(rank + 1), device="tpu")
    dist.all_reduce(y)
    check.close(
        "all_reduce after the refused compiled call", y, torch.full((2,), float(sum(range(1, world + 1))))
    )


check.run("compiled graph with shapes that differ across ranks", mismatch)
dist.barrier()
dist.destroy_process_group()
sys.exit(check.finish())
