"""One rank of a tpu_dist job checking every collective x dtype against CPU (argv: rank world_size).

Launched with torchrun's env by tests/distributed/launcher.py. Exits 1 listing every failed check.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from checks import DTYPES, Checker, make, reduce_cpu  # noqa: E402

rank, world = int(sys.argv[1]), int(sys.argv[2])
local_rank = int(os.environ["LOCAL_RANK"])
check = Checker(rank)

# CUDA idiom: pick the device, then bind the group to it
torch.tpu.set_device(local_rank)
dist.init_process_group(backend="tpu_dist", device_id=torch.device("tpu", local_rank))
assert dist.get_rank() == rank and dist.get_world_size() == world
assert dist.get_backend() == "tpu_dist"

OPS = {
    torch.float32: ("sum", "avg", "max", "min", "product", "premul_sum"),
    torch.bfloat16: ("sum", "avg", "max", "min", "product", "premul_sum"),
    torch.int64: ("sum", "max", "min", "product", "band", "bor", "bxor"),
    torch.bool: ("sum", "max", "min", "product"),
}
RED = {
    "sum": dist.ReduceOp.SUM,
    "avg": dist.ReduceOp.AVG,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "product": dist.ReduceOp.PRODUCT,
    "band": dist.ReduceOp.BAND,
    "bor": dist.ReduceOp.BOR,
    "bxor": dist.ReduceOp.BXOR,
}
salt = [0]


def inputs(shape, dtype):
    """Every rank's CPU input for a fresh check (same on every rank)."""
    salt[0] += 1
    return [make(r, shape, dtype, salt[0]) for r in range(world)]


def tpu(t):
    return t.to(f"tpu:{local_rank}")


def reduce_op(name):
    return dist._make_nccl_premul_sum(0.5) if name == "premul_sum" else RED[name]


for dtype in DTYPES:
    d = str(dtype).replace("torch.", "")
    shape = (3, 4)
    for name in OPS[dtype]:
        xs = inputs(shape, dtype)
        t = tpu(xs[rank])
        dist.all_reduce(t, op=reduce_op(name))
        check.close(f"all_reduce {name} {d}", t, reduce_cpu(xs, name, 0.5))
    # async, through a view (a column of a wider tensor): lands in place
    xs = inputs((3, 8), dtype)
    base = tpu(xs[rank])
    view = base[:, 2:6]
    work = dist.all_reduce(view, op=dist.ReduceOp.SUM, async_op=True)
    work.wait()
    expected = xs[rank].clone()
    expected[:, 2:6] = reduce_cpu([x[:, 2:6] for x in xs], "sum")
    check.close(f"all_reduce async view {d}", base, expected)
    # reduce to the last rank
    xs = inputs(shape, dtype)
    t = tpu(xs[rank])
    dist.reduce(t, dst=world - 1, op=dist.ReduceOp.MAX)
    check.close(f"reduce max {d}", t, reduce_cpu(xs, "max") if rank == world - 1 else xs[rank])
    # all_gather (list), sync and async
    xs = inputs((2, 3), dtype)
    out = [torch.empty((2, 3), dtype=dtype, device="tpu") for _ in range(world)]
    dist.all_gather(out, tpu(xs[rank]))
    for j in range(world):
        check.close(f"all_gather[{j}] {d}", out[j], xs[j])
    out = [torch.zeros((2, 3), dtype=dtype, device="tpu") for _ in range(world)]
    dist.all_gather(out, tpu(xs[rank]), async_op=True).wait()
    check.close(f"all_gather async {d}", torch.stack(out), torch.stack(xs))
    # all_gather_into_tensor: concatenated and stacked outputs
    xs = inputs((2, 3), dtype)
    flat = torch.empty((2 * world, 3), dtype=dtype, device="tpu")
    dist.all_gather_into_tensor(flat, tpu(xs[rank]))
    check.close(f"all_gather_into_tensor {d}", flat, torch.cat(xs))
    stacked = torch.empty((world, 2, 3), dtype=dtype, device="tpu")
    dist.all_gather_into_tensor(stacked, tpu(xs[rank]))
    check.close(f"all_gather_into_tensor stacked {d}", stacked, torch.stack(xs))
    # reduce_scatter (list) and reduce_scatter_tensor
    lists = [[make(r, (2, 3), dtype, 1000 + 10 * salt[0] + j) for j in range(world)] for r in range(world)]
    salt[0] += 1
    out = torch.empty((2, 3), dtype=dtype, device="tpu")
    dist.reduce_scatter(out, [tpu(t) for t in lists[rank]], op=dist.ReduceOp.SUM)
    check.close(f"reduce_scatter sum {d}", out, reduce_cpu([lists[r][rank] for r in range(world)], "sum"))
    xs = inputs((2 * world, 3), dtype)
    out = torch.empty((2, 3), dtype=dtype, device="tpu")
    for name in ("sum", "max"):
        dist.reduce_scatter_tensor(out, tpu(xs[rank]), op=RED[name])
        check.close(
            f"reduce_scatter_tensor {name} {d}",
            out,
            reduce_cpu([x[2 * rank : 2 * rank + 2] for x in xs], name),
        )
    # all_to_all (list, even), all_to_all_single even and uneven
    lists = [[make(r, (2, 2), dtype, 5000 + 10 * salt[0] + j) for j in range(world)] for r in range(world)]
    salt[0] += 1
    out = [torch.empty((2, 2), dtype=dtype, device="tpu") for _ in range(world)]
    dist.all_to_all(out, [tpu(t) for t in lists[rank]])
    check.close(f"all_to_all {d}", torch.stack(out), torch.stack([lists[j][rank] for j in range(world)]))
    xs = inputs((2 * world, 3), dtype)
    out = torch.empty((2 * world, 3), dtype=dtype, device="tpu")
    dist.all_to_all_single(out, tpu(xs[rank]))
    check.close(f"all_to_all_single even {d}", out, torch.cat([x[2 * rank : 2 * rank + 2] for x in xs]))

    def splits(src):  # rows rank `src` sends to each rank j
        return [(src + j) % 3 for j in range(world)]

    rows = [sum(splits(r)) for r in range(world)]
    xs = [make(r, (rows[r], 2), dtype, 9000 + salt[0]) for r in range(world)]
    salt[0] += 1
    out_splits = [splits(j)[rank] for j in range(world)]
    out = torch.empty((sum(out_splits), 2), dtype=dtype, device="tpu")
    dist.all_to_all_single(out, tpu(xs[rank]), out_splits, splits(rank))

    def chunk(j, xs=xs):  # what rank j sends to this rank
        start = sum(splits(j)[:rank])
        return xs[j][start : start + splits(j)[rank]]

    check.close(f"all_to_all_single uneven {d}", out, torch.cat([chunk(j) for j in range(world)]))
    # broadcast, gather, scatter
    xs = inputs(shape, dtype)
    t = tpu(xs[rank])
    dist.broadcast(t, src=1)
    check.close(f"broadcast {d}", t, xs[1])
    xs = inputs((2, 3), dtype)
    gl = [torch.empty((2, 3), dtype=dtype, device="tpu") for _ in range(world)] if rank == 0 else None
    dist.gather(tpu(xs[rank]), gl, dst=0)
    if rank == 0:
        check.close(f"gather {d}", torch.stack(gl), torch.stack(xs))
    src_list = [make(world - 1, (2, 3), dtype, 20000 + 10 * salt[0] + j) for j in range(world)]
    salt[0] += 1
    out = torch.empty((2, 3), dtype=dtype, device="tpu")
    dist.scatter(out, [tpu(s) for s in src_list] if rank == world - 1 else None, src=world - 1)
    check.close(f"scatter {d}", out, src_list[rank])
    # point-to-point: a ring with isend/irecv, and batch_isend_irecv the other way round
    xs = inputs((4,), dtype)
    recv = torch.empty((4,), dtype=dtype, device="tpu")
    reqs = [dist.isend(tpu(xs[rank]), (rank + 1) % world), dist.irecv(recv, (rank - 1) % world)]
    for r in reqs:
        r.wait()
    check.close(f"isend/irecv ring {d}", recv, xs[(rank - 1) % world])
    recv2 = torch.empty((4,), dtype=dtype, device="tpu")
    ops = [
        dist.P2POp(dist.isend, tpu(xs[rank]), (rank - 1) % world),
        dist.P2POp(dist.irecv, recv2, (rank + 1) % world),
    ]
    for r in dist.batch_isend_irecv(ops):
        r.wait()
    check.close(f"batch_isend_irecv {d}", recv2, xs[(rank + 1) % world])
    if rank < 2:  # blocking send/recv between ranks 0 and 1, both directions
        got = torch.empty((4,), dtype=dtype, device="tpu")
        if rank == 0:
            dist.send(tpu(xs[0]), 1)
            dist.recv(got, 1)
            check.close(f"send/recv {d}", got, xs[1])
        else:
            dist.recv(got, 0)
            dist.send(tpu(xs[1]), 0)
            check.close(f"send/recv {d}", got, xs[0])


def bad_inputs():
    try:
        dist.all_reduce(torch.ones(2), op=dist.ReduceOp.SUM)
    except TypeError as exc:
        assert "is on cpu" in str(exc) and "all_reduce" in str(exc), exc
    else:
        raise AssertionError("a cpu tensor was accepted")
    try:
        dist.all_reduce(torch.ones(2, device="tpu"), op=dist.ReduceOp.BAND)
    except ValueError as exc:
        assert "BAND" in str(exc) and "float32" in str(exc), exc
    else:
        raise AssertionError("BAND on float was accepted")
    try:
        dist.all_reduce(torch.ones(2, dtype=torch.int64, device="tpu"), op=dist.ReduceOp.AVG)
    except ValueError as exc:
        assert "AVG" in str(exc) and "int64" in str(exc), exc
    else:
        raise AssertionError("AVG on int64 was accepted")


check.run("bad inputs", bad_inputs)


def subgroups():
    members = list(range(1, world)) if world > 2 else [0, 1]
    group = dist.new_group(members)
    if rank in members:
        xs = inputs((3,), torch.float32)
        t = tpu(xs[rank])
        dist.all_reduce(t, group=group)
        check.close("subgroup all_reduce", t, reduce_cpu([xs[r] for r in members], "sum"))
        out = [torch.empty(3, device="tpu") for _ in members]
        dist.all_gather(out, tpu(xs[rank]), group=group)
        check.close("subgroup all_gather", torch.stack(out), torch.stack([xs[r] for r in members]))
        t = tpu(xs[rank])
        dist.broadcast(t, src=members[-1], group=group)
        check.close("subgroup broadcast", t, xs[members[-1]])
    else:
        inputs((3,), torch.float32)
    dist.barrier()


check.run("subgroups", subgroups)


def objects():
    got = [None] * world
    dist.all_gather_object(got, {"rank": rank, "name": f"r{rank}"})
    assert got == [{"rank": r, "name": f"r{r}"} for r in range(world)], got
    objs = [f"from {rank}", rank] if rank == 0 else [None, None]
    dist.broadcast_object_list(objs, src=0)
    assert objs == ["from 0", 0], objs


check.run("object collectives", objects)


def any_source():
    """recv / irecv without src (torch's "from any source"): every other rank sends rank 0, in an order set
    by staggered sleeps (the last rank first); rank 0 gets each sender's tensor and rank back."""
    import time
    from datetime import timedelta

    xs, ys, zs = (inputs((3,), dt) for dt in (torch.float32, torch.int64, torch.float32))
    dist.barrier()
    # blocking recv(src=None): returns the sender's (global) rank; tags are accepted (matched by order)
    if rank == 0:
        order = []
        for _ in range(world - 1):
            t = torch.empty(3, device="tpu")
            src = dist.recv(t, tag=7)
            order.append(src)
            check.close(f"recv from any source: rank {src}'s tensor", t, xs[src])
        assert sorted(order) == list(range(1, world)), order
        print(f"any-source arrival order {order}", flush=True)
    else:
        time.sleep(0.3 * (world - 1 - rank))
        dist.send(tpu(xs[rank]), 0, tag=7)
    # irecv without src mixed with named irecvs: rank 1 sends twice, the others once. Rank 0 posts a named
    # irecv from rank 1 (it takes rank 1's first message), an any-source one, a second named one from rank 1
    # (posted while the any-source one is pending: it takes rank 1's next message after whatever that one
    # takes), then the other any-source ones. A wait with a timeout before anything is sent raises and
    # keeps the receive posted.
    if rank == 0:
        named = [torch.empty(3, dtype=torch.int64, device="tpu") for _ in range(2)]
        bufs = [torch.empty(3, dtype=torch.int64, device="tpu") for _ in range(world - 1)]
        first = dist.irecv(named[0], src=1)
        works = [dist.irecv(bufs[0])]
        second = dist.irecv(named[1], src=1)
        works += [dist.irecv(b) for b in bufs[1:]]
        try:
            works[0].wait(timeout=timedelta(seconds=0.5))
        except RuntimeError as exc:
            assert "not finished within" in str(exc), exc
        else:
            raise AssertionError("an any-source irecv finished before anything was sent")
        dist.barrier()
        first.wait()
        check.close("named irecv before any-source ones", named[0], ys[1])
        # what each sender's messages became, in the order the receives were posted
        got: dict[int, list] = {}
        works[0].wait()
        got.setdefault(works[0]._source_rank(), []).append(bufs[0])
        second.wait()
        got.setdefault(1, []).append(named[1])
        for w, b in zip(works[1:], bufs[1:]):
            w.wait()
            got.setdefault(w._source_rank(), []).append(b)
        assert sorted(got) == list(range(1, world)), sorted(got)
        for src, bs in got.items():
            want = [ys[1] * 10, ys[1] * 100] if src == 1 else [ys[src]]
            check.close(f"irecv from any source: rank {src}", torch.stack(bs), torch.stack(want))
    else:
        dist.barrier()
        if rank == 1:
            dist.send(tpu(ys[1]), 0)
            dist.send(tpu(ys[1] * 10), 0)
        time.sleep(0.2 * (world - 1 - rank))
        dist.send(tpu(ys[rank] * 100 if rank == 1 else ys[rank]), 0)
    # in a subgroup: the group's first member receives; the returned rank is global
    members = list(range(1, world)) if world > 2 else [0, 1]
    group = dist.new_group(members)
    if rank == members[0]:
        for _ in members[1:]:
            t = torch.empty(3, device="tpu")
            src = dist.recv(t, group=group)
            assert src in members[1:], src
            check.close(f"subgroup recv from any source: rank {src}", t, zs[src])
    elif rank in members:
        dist.send(tpu(zs[rank]), members[0], group=group)
    dist.barrier()


check.run("recv from any source", any_source)


def edge_shapes():
    """0-d and empty tensors through the collectives (a scalar block is (1,) in the programs' layout)."""
    xs = inputs((), torch.float32)
    t = tpu(xs[rank])
    dist.all_reduce(t)
    assert t.shape == () and torch.allclose(t.cpu(), reduce_cpu(xs, "sum")), (t, xs)
    out = torch.empty(world, device="tpu")
    dist.all_gather_into_tensor(out, tpu(xs[rank]))
    assert torch.equal(out.cpu(), torch.stack(xs)), (out, xs)
    t = tpu(xs[rank])
    dist.broadcast(t, src=world - 1)
    assert t.shape == () and torch.equal(t.cpu(), xs[world - 1])
    empty = torch.empty((0, 3), device="tpu")
    dist.all_reduce(empty)
    assert empty.shape == (0, 3)
    gathered = torch.empty((0, 3), device="tpu")
    dist.all_gather_into_tensor(gathered, torch.empty((0, 3), device="tpu"))
    assert gathered.shape == (0, 3)
    parts = [torch.empty((0, 3), device="tpu") for _ in range(world)]
    dist.all_gather(parts, torch.empty((0, 3), device="tpu"))
    assert all(p.shape == (0, 3) for p in parts)


check.run("0-d and empty tensors", edge_shapes)


def devices():
    assert torch.tpu.device_count() == 1, torch.tpu.device_count()
    t = torch.ones(2, device=f"tpu:{local_rank}")
    assert t.device == torch.device("tpu", 0), t.device
    assert torch.tpu.current_device() == 0
    import hf_tpu

    assert len(hf_tpu.mesh().devices.flat) == 1, hf_tpu.mesh()  # the local chips only
    import jax

    assert len(jax.devices()) == world and jax.process_count() == world


check.run("device model", devices)
dist.barrier()
dist.destroy_process_group()
sys.exit(check.finish())
