"""`make bench-eager`: per-op overhead and tiny-model forward latency, Strict tpu vs native torch CPU.

Prints one table and writes reports/bench/eager.{md,json}. Targets (issue #2): <= 15 us/op for small
adds; Strict forward <= 2x torch eager (geomean). Models come in two sizes (benchmarks/models.py): `tiny`
(the test configs, ~1 ms, dispatch-bound) and `small` (sized like DESIGN §3.5's baselines).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import environment, geomean, interleaved, write_report  # noqa: E402
from benchmarks.models import NAMES, SIZES, build, n_params  # noqa: E402


def per_op(n_ops: int, rounds: int) -> dict:
    a_cpu = torch.randn(4, 4)
    a_tpu = a_cpu.to("tpu")

    def loop(a):
        def run():
            x = a
            for _ in range(n_ops):
                x = a + a
            return x

        return run

    res = interleaved({"torch_cpu": (loop(a_cpu), "cpu"), "tpu_strict": (loop(a_tpu), "tpu")}, rounds=rounds)
    return {k: v["median_s"] / n_ops * 1e6 for k, v in res.items()}


def per_op_breakdown(batches: int = 25, calls: int = 200) -> dict:
    """Where a small add's time goes (us per call; the median over interleaved batches): torch's dispatcher
    calling a Python kernel that does nothing (a custom op: the floor of any kernel written in Python), the
    add through the dispatcher and hf_tpu's kernel for it called directly, in Strict and DeferAndFuse, and
    its cached JAX executable called directly and from inside a dispatcher-invoked kernel."""
    import time

    from hf_tpu.runtime.buffers.storage import REGISTRY
    from hf_tpu.runtime.execution import dispatch
    from hf_tpu.runtime.launch import modes
    from hf_tpu.runtime.lowerings.table import TABLE
    from hf_tpu.runtime.tensors.tensor import op_input

    xc = torch.randn(4, 4)
    x = xc.to("tpu")
    out = x + 1.0
    add = torch.ops.aten.add.Tensor
    kernel = dispatch.OpKernel(add, TABLE[add])
    kernel(x, 1.0)
    entry = next(iter(kernel.cache.values()))
    array = op_input(x, False)[0]
    lib = torch.library.Library("hf_tpu_bench", "FRAGMENT")
    lib.define("nothing(Tensor a, Scalar b) -> Tensor")
    lib.define("executable(Tensor a, Scalar b) -> Tensor")
    lib.impl("nothing", lambda a, b: out, "PrivateUse1")

    def run_executable(a, b):
        entry.fn(array)
        return out

    lib.impl("executable", run_executable, "PrivateUse1")
    nothing, executable = torch.ops.hf_tpu_bench.nothing.default, torch.ops.hf_tpu_bench.executable.default
    # (the call, under DeferAndFuse?, what ends the batch inside the timing)
    cases = {
        "torch_cpu_add": (lambda: xc + 1.0, False, None),
        "cpp_view_floor": (lambda: x.view(16), False, None),
        "python_kernel_floor": (lambda: nothing(x, 1.0), False, None),
        "strict_via_dispatcher": (lambda: x + 1.0, False, None),
        "strict_kernel_direct": (lambda: kernel(x, 1.0), False, None),
        "defer_via_dispatcher": (lambda: x + 1.0, True, None),
        "defer_handed_over": (lambda: x + 1.0, True, REGISTRY.drain_native),
        "defer_kernel_direct": (lambda: kernel(x, 1.0), True, None),
        "executable_direct": (lambda: entry.fn(array), False, None),
        "executable_in_kernel": (lambda: executable(x, 1.0), False, None),
    }
    times: dict = {name: [] for name in cases}
    for _ in range(batches):
        for name, (fn, deferred, end) in cases.items():
            modes.set_eager_mode("defer_and_fuse" if deferred else "defer_never")
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            if end is not None:
                end()
            times[name].append((time.perf_counter() - t0) / calls * 1e6)
            modes.set_eager_mode("defer_never")  # runs what was recorded, outside the timing
    del lib
    return {name: sorted(ts)[len(ts) // 2] for name, ts in times.items()}


def _python_kernels_breakdown() -> dict | None:
    """`per_op_breakdown` in a child process with the Python kernels registered directly
    (`HF_TPU_NATIVE_RECORD=0`), when this one records in C++; else None."""
    import subprocess

    from hf_tpu.runtime.execution import native_recording

    if not native_recording.ENABLED:
        return None
    done = subprocess.run(
        [sys.executable, __file__, "--breakdown-only", "--json"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "HF_TPU_NATIVE_RECORD": "0"},
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def breakdown_lines(us: dict, python_us: dict | None = None) -> list[str]:
    from hf_tpu.runtime.execution import native_recording

    native = "in C++ (the native recorder)" if native_recording.ENABLED else "in Python (no C++ recorder)"
    rows = [
        ("torch CPU `x + 1.0` (reference)", "torch_cpu_add"),
        ("tpu `x.view(16)`: a C++ kernel through the dispatcher (autograd, view tracking)", "cpp_view_floor"),
        ("torch dispatcher -> a Python kernel that does nothing (custom op)", "python_kernel_floor"),
        ("Strict `x + 1.0` through the dispatcher", "strict_via_dispatcher"),
        ("Strict: hf_tpu's add kernel called directly", "strict_kernel_direct"),
        (f"DeferAndFuse `x + 1.0` through the dispatcher, recorded {native}", "defer_via_dispatcher"),
        ("the same, plus handing the batch over to Python's trace (per op)", "defer_handed_over"),
        ("DeferAndFuse: hf_tpu's Python add kernel called directly (recording)", "defer_kernel_direct"),
        ("the add's cached JAX executable, called directly", "executable_direct"),
        ("the same executable inside a dispatcher-invoked Python kernel", "executable_in_kernel"),
    ]
    if python_us is None:
        return [
            "Where a small add's time goes (us per call, median of 25 interleaved batches of 200; 4x4 fp32):",
            "",
            "| path | us |",
            "|---|---:|",
            *[f"| {label} | {us[key]:.2f} |" for label, key in rows],
            "",
        ]
    return [
        "Where a small add's time goes (us per call, median of 25 interleaved batches of 200; 4x4 fp32); "
        "second column: the same in a child process with the Python kernels registered directly "
        "(`HF_TPU_NATIVE_RECORD=0`, recording in Python):",
        "",
        "| path | us | us, Python kernels |",
        "|---|---:|---:|",
        *[f"| {label} | {us[key]:.2f} | {python_us.get(key, float('nan')):.2f} |" for label, key in rows],
        "",
    ]


def sustained_per_op(n_ops: int = 200_000) -> dict:
    """Wall time per add over one long loop, everything included: the cyclic GC's collections and
    the sweeps of dead buffers happen every few thousand ops, which a median of short rounds skips."""
    import time

    out = {}
    for name, device in (("torch_cpu", "cpu"), ("tpu_strict", "tpu")):
        a = torch.randn(4, 4, device=device)
        for _ in range(2000):
            a + a
        t0 = time.perf_counter()
        for _ in range(n_ops):
            a + a
        if device == "tpu":
            torch.tpu.synchronize()
        out[name] = (time.perf_counter() - t0) / n_ops * 1e6
    return out


def in_place_writes(rounds: int, numel: int = 1 << 24) -> dict:
    """A one-row write and an in-place add on a 64 MB tensor: the cost of the slice, not of the buffer
    (Strict donates the storage's buffer to XLA when nothing else references it)."""
    x_cpu = torch.zeros(numel)
    x_tpu = torch.zeros(numel, device="tpu")
    x_tpu.add_(0)
    row = torch.ones(numel // 1024)

    def writes(x, r):
        def run():
            for i in range(10):
                x.view(1024, -1)[i] = r
                x.add_(1.0)
            return x

        return run

    res = interleaved(
        {"torch_cpu": (writes(x_cpu, row), "cpu"), "tpu_strict": (writes(x_tpu, row.to("tpu")), "tpu")},
        rounds=rounds,
    )
    return {k: v["median_s"] / 10 * 1e3 for k, v in res.items()}


def model_latency(name: str, size: str, rounds: int) -> dict:
    model, inputs = build(name, size)
    dev_model, _ = build(name, size)
    dev_model.to("tpu")
    dev_inputs = {k: v.to("tpu") for k, v in inputs.items()}

    def fwd(m, kw):
        def run():
            with torch.no_grad():
                return m(**kw)

        return run

    res = interleaved(
        {"torch_cpu": (fwd(model, inputs), "cpu"), "tpu_strict": (fwd(dev_model, dev_inputs), "tpu")},
        rounds=rounds,
    )
    res["params"] = n_params(model)
    return res


def path_child(rounds: int, models: list[str]) -> None:
    """One process's Strict numbers (per-op, tiny models) on whichever path HF_TPU_NATIVE selected."""
    import json

    from hf_tpu.runtime import native

    out = {"native": native.active(), "per_op_us": per_op(1000, rounds=rounds), "models": {}}
    for name in models:
        r = model_latency(name, "tiny", rounds)
        out["models"][name] = {k: r[k]["median_s"] * 1e3 for k in ("torch_cpu", "tpu_strict")}
    print("PATH " + json.dumps(out), flush=True)


def path_comparison(rounds: int, models: list[str], repeats: int = 2) -> dict:
    """Strict with the C++ extension vs the pure-Python path, each in fresh processes, alternating
    (native, python, native, python): medians over the processes of each path."""
    import json
    import os
    import statistics
    import subprocess

    runs: dict[str, list[dict]] = {"native": [], "python": []}
    for _ in range(repeats):
        for path, flag in (("native", "1"), ("python", "0")):
            done = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--path-child",
                    "--rounds",
                    str(rounds),
                    "--models",
                    ",".join(models),
                ],
                env={**os.environ, "HF_TPU_NATIVE": flag},
                capture_output=True,
                text=True,
                timeout=1800,
            )
            if done.returncode != 0:
                raise RuntimeError(f"bench-eager ({path} path) failed:\n{done.stderr[-3000:]}")
            line = next(x for x in done.stdout.splitlines() if x.startswith("PATH "))
            runs[path].append(json.loads(line[5:]))
    med = statistics.median
    result = {}
    for path, rs in runs.items():
        result[path] = {
            "per_op_us": med(r["per_op_us"]["tpu_strict"] for r in rs),
            "torch_per_op_us": med(r["per_op_us"]["torch_cpu"] for r in rs),
            "models": {
                m: {k: med(r["models"][m][k] for r in rs) for k in ("torch_cpu", "tpu_strict")}
                for m in models
            },
        }
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="reports/bench")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--models", default=",".join(NAMES))
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--path-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--no-path-comparison", action="store_true", help="skip the native vs Python path runs"
    )
    parser.add_argument(
        "--breakdown-only", action="store_true", help="print where a small add's time goes, write nothing"
    )
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.path_child:
        path_child(args.rounds, args.models.split(","))
        return 0
    if args.breakdown_only:
        breakdown = per_op_breakdown()
        if args.json:
            print(json.dumps(breakdown))
        else:
            print("\n".join(breakdown_lines(breakdown, _python_kernels_breakdown())))
        return 0

    us = per_op(1000, rounds=args.rounds)
    breakdown = per_op_breakdown()
    breakdown_python = _python_kernels_breakdown()
    sustained = sustained_per_op()
    writes_ms = in_place_writes(args.rounds)
    rows = []
    for size in args.sizes.split(","):
        for name in args.models.split(","):
            r = model_latency(name, size, args.rounds)
            ratio = r["tpu_strict"]["median_s"] / r["torch_cpu"]["median_s"]
            rows.append(
                {
                    "model": name,
                    "size": size,
                    "params": r["params"],
                    "torch_cpu_ms": r["torch_cpu"]["median_s"] * 1e3,
                    "tpu_strict_ms": r["tpu_strict"]["median_s"] * 1e3,
                    "tpu_first_call_s": r["tpu_strict"]["first_call_s"],
                    "ratio": ratio,
                }
            )
            print(
                f"{size:5s} {name:6s} torch {rows[-1]['torch_cpu_ms']:8.2f} ms | strict "
                f"{rows[-1]['tpu_strict_ms']:8.2f} ms | ratio {ratio:5.2f}x | first call "
                f"{rows[-1]['tpu_first_call_s']:.2f} s",
                flush=True,
            )
    by_size = {
        size: geomean([r["ratio"] for r in rows if r["size"] == size]) for size in args.sizes.split(",")
    }
    lines = [
        "# Eager benchmark: Strict tpu vs native torch CPU",
        "",
        f"Environment: {environment()}",
        "",
        f"Per-op overhead (1,000 adds of 4x4 fp32, median of {args.rounds}): torch CPU {us['torch_cpu']:.2f} us/op, "
        f"tpu Strict {us['tpu_strict']:.2f} us/op (target <= 15 us/op). Sustained over 200,000 adds in one "
        f"loop, GC and buffer sweeps included: torch CPU {sustained['torch_cpu']:.2f} us/op, tpu Strict "
        f"{sustained['tpu_strict']:.2f} us/op.",
        "",
        f"In-place updates of a 64 MB fp32 tensor (a 64 KB row written through a view, then `add_` of the "
        f"whole tensor), per pair: torch CPU {writes_ms['torch_cpu']:.2f} ms, tpu Strict "
        f"{writes_ms['tpu_strict']:.2f} ms (the buffer is updated in place, not copied).",
        "",
        *breakdown_lines(breakdown, breakdown_python),
        "Forward latency, median of interleaved rounds (sizes: benchmarks/models.py).",
        "",
        "| size | model | params | torch eager (ms) | Strict (ms) | ratio (Strict/torch) | Strict first call (s) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['size']} | {r['model']} | {r['params'] / 1e6:.2f}M | {r['torch_cpu_ms']:.2f} | "
        f"{r['tpu_strict_ms']:.2f} | {r['ratio']:.2f}x | {r['tpu_first_call_s']:.2f} |"
        for r in rows
    ]
    lines += [
        "",
        "Geomean Strict/torch (target <= 2x): " + ", ".join(f"{k} {v:.2f}x" for k, v in by_size.items()),
        "",
    ]
    paths = None
    if not args.no_path_comparison:
        tiny = args.models.split(",")
        paths = path_comparison(args.rounds, tiny)
        nat, py = paths["native"], paths["python"]
        lines += [
            "## C++ extension vs pure-Python path (Strict)",
            "",
            "Fresh processes per path, alternating native, Python, native, Python; medians. Ratios are against "
            "torch eager measured in the same process.",
            "",
            "| | native | Python path | native / Python |",
            "|---|---:|---:|---:|",
            f"| per op (us, 1,000 adds) | {nat['per_op_us']:.2f} | {py['per_op_us']:.2f} | "
            f"{nat['per_op_us'] / py['per_op_us']:.2f} |",
            f"| per op / torch per op | {nat['per_op_us'] / nat['torch_per_op_us']:.1f}x | "
            f"{py['per_op_us'] / py['torch_per_op_us']:.1f}x | |",
        ]
        for m in tiny:
            n_ms, p_ms = nat["models"][m]["tpu_strict"], py["models"][m]["tpu_strict"]
            n_r = n_ms / nat["models"][m]["torch_cpu"]
            p_r = p_ms / py["models"][m]["torch_cpu"]
            lines.append(
                f"| tiny {m} forward (ms; x torch) | {n_ms:.2f} ({n_r:.2f}x) | {p_ms:.2f} ({p_r:.2f}x) | "
                f"{n_ms / p_ms:.2f} |"
            )
        lines.append("")
    md = "\n".join(lines)
    print(md)
    write_report(
        args.out,
        "eager",
        {
            "env": environment(),
            "per_op_us": us,
            "sustained_per_op_us": sustained,
            "per_op_breakdown_us": breakdown,
            "per_op_breakdown_python_kernels_us": breakdown_python,
            "in_place_write_ms": writes_ms,
            "models": rows,
            "geomean_ratio": by_size,
            "native_vs_python_path": paths,
        },
        md,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
