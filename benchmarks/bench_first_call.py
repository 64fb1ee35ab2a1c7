"""`make bench-first-call`: the first forward of a fresh process, cold and warm caches, per mode.

What a user waits for after starting Python: the first call of a model compiles (inductor: Dynamo +
C++ codegen; tpu: Dynamo + JAX tracing + XLA). Both keep an on-disk cache: inductor's FX graph cache
and hf_tpu's persistent XLA cache (`HF_TPU_COMPILATION_CACHE`). Each (model, mode) runs in two new
processes that share a fresh cache folder: the first finds it empty (cold), the second finds what the
first wrote (warm). Only the first forward itself is timed (imports and model building are not).
Target (issue #5): tpu compiled first call <= inductor's warm-cache first call. Writes
reports/bench/first_call.{md,json}.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import environment, geomean, write_report  # noqa: E402
from benchmarks.models import NAMES, SIZES  # noqa: E402

MODES = ["inductor", "compiled", "strict", "defer_and_fuse"]


def first_call(name: str, size: str, mode: str) -> float:
    """In this (fresh) process: build the model, time its first forward in `mode`."""
    import torch

    from benchmarks.models import build

    model, inputs = build(name, size)
    tpu = mode != "inductor"
    if tpu:
        model.to("tpu")
        inputs = {k: v.to("tpu") for k, v in inputs.items()}
        torch.tpu.synchronize()
    if mode in ("inductor", "compiled"):
        model = torch.compile(model, backend="inductor" if mode == "inductor" else "tpu")
    t0 = time.perf_counter()
    with torch.no_grad():
        if mode == "defer_and_fuse":
            with torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
                out = model(**inputs)
        else:
            out = model(**inputs)
    if tpu:
        torch.tpu.synchronize()
    elapsed = time.perf_counter() - t0
    del out
    return elapsed


def _in_new_process(name: str, size: str, mode: str, cache: str) -> float:
    env = dict(
        os.environ,
        HF_TPU_COMPILATION_CACHE=os.path.join(cache, "xla"),
        TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"),
        TRANSFORMERS_VERBOSITY="error",
    )
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    proc = subprocess.run(
        [sys.executable, __file__, "--child", name, size, mode],
        env=env,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("FIRST_CALL_S "):
            return float(line.split()[1])
    raise RuntimeError(f"{size}/{name} {mode} failed:\n{proc.stderr[-3000:]}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child", nargs=3, metavar=("MODEL", "SIZE", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument("--out", default="reports/bench")
    parser.add_argument("--models", default=",".join(NAMES))
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args(argv)
    if args.child:
        print(f"FIRST_CALL_S {first_call(*args.child):.6f}", flush=True)
        return 0
    modes = args.modes.split(",")
    rows: dict = {}
    for size in args.sizes.split(","):
        for name in args.models.split(","):
            key = f"{size}/{name}"
            rows[key] = {}
            for mode in modes:
                with tempfile.TemporaryDirectory(prefix="hf_tpu_first_call_") as cache:
                    cold = _in_new_process(name, size, mode, cache)
                    warm = _in_new_process(name, size, mode, cache)
                rows[key][mode] = {"cold_s": cold, "warm_s": warm}
            print(
                f"{key:12s} "
                + " | ".join(f"{m} {r['cold_s']:.2f}/{r['warm_s']:.2f}" for m, r in rows[key].items()),
                flush=True,
            )
    summary = {}
    if "inductor" in modes and "compiled" in modes:
        for temp in ("cold_s", "warm_s"):
            summary[f"compiled_{temp[:-2]}_vs_inductor_warm"] = geomean(
                [r["compiled"][temp] / r["inductor"]["warm_s"] for r in rows.values()]
            )
        summary["compiled_cold_vs_inductor_cold"] = geomean(
            [r["compiled"]["cold_s"] / r["inductor"]["cold_s"] for r in rows.values()]
        )
    lines = [
        "# First forward of a fresh process (s): cold cache / warm cache",
        "",
        f"Environment: {environment()}",
        "",
        "Each cell: a new process with an empty cache folder (cold), then a second new process reusing what the "
        "first wrote (warm): inductor's FX graph cache, hf_tpu's persistent XLA cache. Only the first forward "
        "is timed.",
        "",
        "| model | " + " | ".join(modes) + " |",
        "|---|" + "---:|" * len(modes),
    ]
    for key, r in rows.items():
        lines.append(
            f"| {key} | " + " | ".join(f"{r[m]['cold_s']:.2f} / {r[m]['warm_s']:.2f}" for m in modes) + " |"
        )
    if summary:
        lines += ["", "Geomeans:", ""]
        lines += [f"- {k}: {v:.2f}x" for k, v in summary.items()]
    md = "\n".join(lines) + "\n"
    print(md)
    write_report(args.out, "first_call", {"env": environment(), "rows": rows, "summary": summary}, md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
