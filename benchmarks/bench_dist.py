"""`make bench-dist`: tpu_dist all_reduce / all_gather bus bandwidth against gloo on CPU tensors, same run.

For 2 and 4 ranks on this host (torchrun's env, 127.0.0.1), each rank joins the `tpu_dist` default group
and a gloo group over the same ranks; for message sizes 1 KiB-64 MiB (float32) both run the same collective,
alternating (tpu_dist, gloo, tpu_dist, gloo, ...), and the median time of each is kept. Bus bandwidth
follows nccl-tests: all_reduce moves size * 2(n-1)/n per rank, all_gather (size = the gathered output)
size * (n-1)/n. The figure is the ratio tpu_dist / gloo (target >= 0.8 at >= 1 MiB). On JAX's CPU platform
tpu_dist's collectives are themselves gloo underneath (JAX's CPU collectives), so the ratio is the cost of
our layer: the cross-rank argument check, the JAX program and the copies. The `jax` column runs the same
JAX program directly on a global array built once (no torch tensor, no check, no copies): `jax / gloo` is
the floor JAX's own CPU collective sets, `tpu_dist / jax` what our layer costs on top.

Writes reports/bench/dist.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIZES = [1 << 10, 1 << 16, 1 << 20, 1 << 24, 1 << 26]  # bytes
WORLD_SIZES = (2, 4)


def _bus_factor(op: str, n: int) -> float:
    return 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


BACKENDS = ("tpu_dist", "jax", "gloo")


def _raw_program(op: str, n: int, per_rank: int):
    """The JAX program tpu_dist runs for `op`, called on a global array built once: the floor."""
    import jax

    from hf_tpu.runtime.distributed import programs

    if op == "all_reduce":
        body = programs.all_reduce_body("sum", "float", n)
    else:  # as all_gather_into_tensor: the gathered blocks come out as one (n * per_rank,) tensor
        body = programs.reshaped(programs.all_gather_body(), None, (n * per_rank,))
    ranks = tuple(range(n))
    block = jax.numpy.ones((per_rank,), jax.numpy.float32)
    program, _ = programs.block_program(ranks, body, ((per_rank,),), (block.dtype,))
    global_block = programs.flat_global(ranks, block)
    return lambda: program(global_block)[0].block_until_ready()


def worker(rounds: int, max_bytes: int) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("tpu_dist")
    rank, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    results = []
    for size in [b for b in SIZES if b <= max_bytes]:
        numel = size // 4
        for op in ("all_reduce", "all_gather"):
            per_rank = numel if op == "all_reduce" else max(numel // n, 1)
            tensors = {
                "tpu_dist": torch.ones(per_rank, device="tpu"),
                "gloo": torch.ones(per_rank),
            }
            outs = {k: torch.empty(per_rank * n, device=v.device) for k, v in tensors.items()}
            raw = _raw_program(op, n, per_rank)

            def run(backend: str, op=op, tensors=tensors, outs=outs, raw=raw) -> float:
                group = None if backend == "tpu_dist" else gloo
                dist.barrier(group=gloo)
                start = time.perf_counter()
                if backend == "jax":
                    raw()
                elif op == "all_reduce":
                    dist.all_reduce(tensors[backend], group=group)
                else:
                    dist.all_gather_into_tensor(outs[backend], tensors[backend], group=group)
                if backend == "tpu_dist":
                    torch.tpu.synchronize()
                return time.perf_counter() - start

            for backend in BACKENDS:  # warm-up (compiles the JAX programs)
                run(backend)
            times: dict[str, list[float]] = {b: [] for b in BACKENDS}
            for _ in range(rounds):
                for backend in BACKENDS:
                    times[backend].append(run(backend))
            moved = (per_rank * n if op == "all_gather" else per_rank) * 4
            row = {"op": op, "bytes": moved, "ranks": n}
            for backend, ts in times.items():
                t = statistics.median(ts)
                row[f"{backend}_s"] = t
                row[f"{backend}_busbw_gbs"] = moved * _bus_factor(op, n) / t / 1e9
            row["ratio"] = row["tpu_dist_busbw_gbs"] / row["gloo_busbw_gbs"]
            row["jax_ratio"] = row["jax_busbw_gbs"] / row["gloo_busbw_gbs"]
            results.append(row)
    if rank == 0:
        print("RESULT " + json.dumps(results), flush=True)
    dist.destroy_process_group()


def launch(n: int, rounds: int, timeout: float, max_bytes: int) -> list[dict]:
    from tests.distributed.launcher import child_env, free_port_pair

    port = free_port_pair()
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", "--rounds", str(rounds), "--max-bytes", str(max_bytes)],
            env=child_env(rank, n, port),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
        )
        for rank in range(n)
    ]
    outputs = []
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise RuntimeError(f"bench-dist: {n} ranks did not finish within {timeout:.0f} s") from None
        outputs.append(out)
    for rank, (p, out) in enumerate(zip(procs, outputs)):
        if p.returncode != 0:
            raise RuntimeError(f"bench-dist: rank {rank} of {n} failed:\n{out[-3000:]}")
    line = next(x for x in outputs[0].splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def _size(b: int) -> str:
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default="reports/bench")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--ranks", default=",".join(map(str, WORLD_SIZES)), help="world sizes, e.g. 2,4")
    parser.add_argument("--max-bytes", type=int, default=SIZES[-1], help="largest message")
    args = parser.parse_args()
    if args.worker:
        worker(args.rounds, args.max_bytes)
        return
    from benchmarks.common import environment, write_report

    rows = []
    for n in (int(x) for x in args.ranks.split(",")):
        rows += launch(n, args.rounds, args.timeout, args.max_bytes)
        print(f"bench-dist: {n} ranks done", flush=True)
    lines = [
        "# tpu_dist vs gloo: bus bandwidth",
        "",
        f"`make bench-dist`; medians of {args.rounds} alternating calls per cell; float32; one host, JAX's CPU "
        "platform (tpu_dist's collectives are JAX's CPU collectives, gloo underneath, so the ratio is the "
        "cost of our layer). Bus bandwidth as nccl-tests count it.",
        "",
        "| op | ranks | message | tpu_dist (ms) | jax (ms) | gloo (ms) | tpu_dist GB/s | gloo GB/s | ratio |"
        " jax / gloo |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['op']} | {r['ranks']} | {_size(r['bytes'])} | {r['tpu_dist_s'] * 1e3:.2f} | "
            f"{r['jax_s'] * 1e3:.2f} | {r['gloo_s'] * 1e3:.2f} | {r['tpu_dist_busbw_gbs']:.3g} | "
            f"{r['gloo_busbw_gbs']:.3g} | {r['ratio']:.2f} | {r['jax_ratio']:.2f} |"
        )
    big = [r for r in rows if r["bytes"] >= 1 << 20]
    if big:
        ratios, floors = [r["ratio"] for r in big], [r["jax_ratio"] for r in big]
        lines.append(
            f"Ratio at >= 1 MiB: median {statistics.median(ratios):.2f}, min {min(ratios):.2f} (target >= 0.8); "
            f"JAX's own program alone: median {statistics.median(floors):.2f}, min {min(floors):.2f}."
        )
    lines.append("")
    write_report(args.out, "dist", {"environment": environment(), "rows": rows}, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
