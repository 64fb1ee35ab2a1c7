"""`make bench-modes`: model x size x {torch eager, inductor, Strict, DeferAndFuse, compiled "tpu"}.

One run, side by side: median steady-state forward times (modes interleaved A B A B after warm-up),
first-call times, ratios to native torch CPU eager, and the peak device memory a forward adds on top
of the weights for Strict vs DeferAndFuse. Writes reports/bench/modes.{md,json}. Targets (issue #5):
DeferAndFuse >= 2x faster than Strict with lower peak memory; compiled <= 0.7x torch eager and
<= 1.0x inductor (geomeans); compiled first call <= inductor's warm-cache first call.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import environment, geomean, interleaved, write_report  # noqa: E402
from benchmarks.models import NAMES, SIZES, build, n_params  # noqa: E402

MODES = ["torch_eager", "inductor", "strict", "defer_and_fuse", "compiled"]
DEVICE_MODES = ("strict", "defer_and_fuse", "compiled")


def _runner(model, inputs, mode):
    def run():
        with torch.no_grad():
            if mode == "defer_and_fuse":
                with torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
                    out = model(**inputs)
                    torch.tpu.flush()
                return out
            return model(**inputs)

    return run


def _peak_extra_bytes(run) -> int:
    """Device bytes one forward allocates beyond what was live before it (activations, not weights)."""
    torch.tpu.synchronize()
    base = torch.tpu.memory_allocated()
    torch.tpu.reset_peak_memory_stats()
    out = run()
    torch.tpu.synchronize()
    peak = torch.tpu.max_memory_allocated()
    del out
    return max(0, peak - base)


def bench_model(name: str, size: str, modes: list[str], rounds: int) -> dict:
    cases = {}
    first_calls = {}
    peaks = {}
    params = 0
    for mode in modes:
        model, inputs = build(name, size)
        params = n_params(model)
        device = "cpu"
        if mode in DEVICE_MODES:
            model.to("tpu")
            inputs = {k: v.to("tpu") for k, v in inputs.items()}
            device = "tpu"
        if mode == "inductor":
            model = torch.compile(model, backend="inductor")
        elif mode == "compiled":
            model = torch.compile(model, backend="tpu")
        run = _runner(model, inputs, mode)
        t0 = time.perf_counter()
        run()
        if device == "tpu":
            torch.tpu.synchronize()
        first_calls[mode] = time.perf_counter() - t0
        if mode in ("strict", "defer_and_fuse"):
            run()
            peaks[mode] = _peak_extra_bytes(run)
        cases[mode] = (run, device)
    res = interleaved(cases, rounds=rounds, warmup=2)
    for mode in modes:
        res[mode]["first_call_s"] = first_calls[mode]
        if mode in peaks:
            res[mode]["peak_extra_bytes"] = peaks[mode]
    res["params"] = params
    return res


TRAIN_MODES = ("torch_eager", "strict", "defer_and_fuse")


def bench_training_step(name: str, size: str, rounds: int) -> dict:
    """One AdamW training step (forward, loss, backward, step) per call: torch CPU eager, Strict and
    DeferAndFuse (each step one cached program: the trace ends at `optimizer.step()`). Target (issue 21):
    DeferAndFuse >= 2x Strict steps/s."""
    from tests.hf_models import first_tensor

    cases = {}
    for mode in TRAIN_MODES:
        torch.manual_seed(0)
        model, inputs = build(name, size)
        model.train()
        device = "cpu" if mode == "torch_eager" else "tpu"
        model.to(device)
        inputs = {k: v.to(device) for k, v in inputs.items()}
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(model=model, inputs=inputs, opt=opt, mode=mode):
            ctx = (
                torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE) if mode == "defer_and_fuse" else None
            )
            if ctx is not None:
                ctx.__enter__()
            try:
                opt.zero_grad()
                first_tensor(model(**inputs)).float().square().mean().backward()
                opt.step()
            finally:
                if ctx is not None:
                    ctx.__exit__(None, None, None)

        cases[mode] = (step, device)
    return interleaved(cases, rounds=rounds, warmup=3)


def _ratio_cell(r: dict, mode: str, base: float | None) -> str:
    ms = r[mode]["median_s"] * 1e3
    return f"{ms:.2f}" + (f" ({r[mode]['median_s'] / base:.2f}x)" if base else "")


def summarize(rows: dict, modes: list[str]) -> dict:
    """Geomeans over the rows given: each mode / torch eager, DeferAndFuse speedup, compiled / inductor."""
    out = {}
    vals = list(rows.values())
    if "torch_eager" in modes:
        for m in modes:
            out[f"{m}_vs_torch_eager"] = geomean(
                [r[m]["median_s"] / r["torch_eager"]["median_s"] for r in vals]
            )
    if "strict" in modes and "defer_and_fuse" in modes:
        out["defer_speedup_over_strict"] = geomean(
            [r["strict"]["median_s"] / r["defer_and_fuse"]["median_s"] for r in vals]
        )
    if "strict" in modes and "compiled" in modes:
        # DeferAndFuse runs the same fused program as compiled, after recording it op by op: its speedup
        # over Strict cannot exceed Strict / compiled (reached only if recording cost nothing)
        out["defer_ceiling_strict_over_compiled"] = geomean(
            [r["strict"]["median_s"] / r["compiled"]["median_s"] for r in vals]
        )
    if "inductor" in modes and "compiled" in modes:
        out["compiled_vs_inductor"] = geomean(
            [r["compiled"]["median_s"] / r["inductor"]["median_s"] for r in vals]
        )
        out["compiled_first_call_in_process_vs_inductor"] = geomean(
            [r["compiled"]["first_call_s"] / r["inductor"]["first_call_s"] for r in vals]
        )
    return out


def _python_path_run(args) -> dict | None:
    """Strict and DeferAndFuse with the Python kernels registered directly (no C++ recorder), measured in
    a child process right after this one's run: {"rows": ..., "train": ...}, or None when this process
    has no C++ recorder to compare with."""
    import json
    import subprocess

    from hf_tpu.runtime.execution import native_recording

    if not native_recording.ENABLED:
        return None
    out = tempfile.mkdtemp(prefix="hf_tpu_bench_modes_py_")
    cmd = [
        sys.executable,
        __file__,
        "--out",
        out,
        "--rounds",
        str(args.rounds),
        "--models",
        args.models,
        "--sizes",
        args.sizes,
        "--modes",
        "strict,defer_and_fuse",
        "--train",
        args.train,
        "--python-path",
        "off",
    ]
    subprocess.run(
        cmd, check=True, env={**os.environ, "HF_TPU_NATIVE_RECORD": "0"}, stdout=subprocess.DEVNULL
    )
    data = json.loads((Path(out) / "modes.json").read_text())
    return {"rows": data["rows"], "train": data["train"]}


def _python_path_lines(rows: dict, train_rows: dict, other: dict) -> list[str]:
    """The C++ recorder against the Python kernels: per model, Strict and DeferAndFuse ms on each path and
    DeferAndFuse's speedup over Strict on each (the Python path measured in a separate process, right
    after this one: not interleaved with it)."""
    lines = [
        "",
        "The C++ recorder (this run) against the Python kernels (`HF_TPU_NATIVE_RECORD=0`, a child process "
        "right after it), median ms per forward:",
        "",
        "| model | Strict | DeferAndFuse | DeferAndFuse speedup | Strict, Python kernels | "
        "DeferAndFuse, Python kernels | DeferAndFuse speedup, Python kernels |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    native_speedups, python_speedups = [], []
    for key, r in rows.items():
        p = other["rows"].get(key)
        if p is None or "strict" not in r or "defer_and_fuse" not in r:
            continue
        s, d = r["strict"]["median_s"], r["defer_and_fuse"]["median_s"]
        ps, pd = p["strict"]["median_s"], p["defer_and_fuse"]["median_s"]
        native_speedups.append(s / d)
        python_speedups.append(ps / pd)
        lines.append(
            f"| {key} | {s * 1e3:.2f} | {d * 1e3:.2f} | {s / d:.2f}x | {ps * 1e3:.2f} | {pd * 1e3:.2f} | "
            f"{ps / pd:.2f}x |"
        )
    for key, r in train_rows.items():
        p = other["train"].get(key)
        if p is None:
            continue
        s, d = r["strict"]["median_s"], r["defer_and_fuse"]["median_s"]
        ps, pd = p["strict"]["median_s"], p["defer_and_fuse"]["median_s"]
        lines.append(
            f"| {key} training step | {s * 1e3:.2f} | {d * 1e3:.2f} | {s / d:.2f}x | {ps * 1e3:.2f} | "
            f"{pd * 1e3:.2f} | {ps / pd:.2f}x |"
        )
    if native_speedups:
        lines.append(
            f"| geomean (forwards) | | | {geomean(native_speedups):.2f}x | | | {geomean(python_speedups):.2f}x |"
        )
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="reports/bench")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--models", default=",".join(NAMES))
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--train", default="tiny/llama", help="size/model pairs for the training-step table")
    parser.add_argument(
        "--python-path",
        choices=("auto", "off"),
        default="auto",
        help="also run Strict and DeferAndFuse with the Python kernels (HF_TPU_NATIVE_RECORD=0) in a child "
        "process, as columns of the same report (auto: when the C++ recorder is in use)",
    )
    args = parser.parse_args(argv)
    # first calls here compile from scratch: an empty persistent XLA cache (bench_first_call.py measures
    # fresh processes with cold and warm caches); set before JAX initializes
    os.environ["HF_TPU_COMPILATION_CACHE"] = tempfile.mkdtemp(prefix="hf_tpu_bench_modes_")
    modes = args.modes.split(",")
    sizes = args.sizes.split(",")
    rows = {}
    for size in sizes:
        for name in args.models.split(","):
            torch._dynamo.reset()
            key = f"{size}/{name}"
            rows[key] = bench_model(name, size, modes, args.rounds)
            base = rows[key]["torch_eager"]["median_s"] if "torch_eager" in modes else None
            print(
                f"{key:12s} " + " | ".join(f"{m} {_ratio_cell(rows[key], m, base)}" for m in modes),
                flush=True,
            )
    lines = [
        "# Forward latency by execution mode",
        "",
        f"Environment: {environment()}",
        "",
        "Median steady-state ms per forward (ratio to torch eager); after warm-up, modes alternate in blocks of 8 "
        "calls and the first 3 of each block are not counted (thread pools settling after a switch; "
        "benchmarks/common.py). "
        "Sizes: benchmarks/models.py (`tiny` = test configs, `small` = DESIGN §3.5-sized).",
        "",
        "| model | params | " + " | ".join(modes) + " |",
        "|---|---:|" + "---:|" * len(modes),
    ]
    for key, r in rows.items():
        base = r["torch_eager"]["median_s"] if "torch_eager" in r else None
        lines.append(
            f"| {key} | {r['params'] / 1e6:.2f}M | "
            + " | ".join(_ratio_cell(r, m, base) for m in modes)
            + " |"
        )
    lines += [
        "",
        "First call in this process (s, includes compilation; hf_tpu's persistent XLA cache starts empty, "
        "inductor's cache is warm only for shapes seen earlier in this process; see first_call.md for fresh "
        "processes with cold and warm caches):",
        "",
        "| model | " + " | ".join(modes) + " |",
        "|---|" + "---:|" * len(modes),
    ]
    for key, r in rows.items():
        lines.append(f"| {key} | " + " | ".join(f"{r[m]['first_call_s']:.2f}" for m in modes) + " |")
    if "strict" in modes and "defer_and_fuse" in modes:
        lines += [
            "",
            "Peak device memory one forward adds beyond the weights (MiB):",
            "",
            "| model | Strict | DeferAndFuse | DeferAndFuse / Strict |",
            "|---|---:|---:|---:|",
        ]
        for key, r in rows.items():
            s, d = r["strict"]["peak_extra_bytes"], r["defer_and_fuse"]["peak_extra_bytes"]
            lines.append(
                f"| {key} | {s / 2**20:.2f} | {d / 2**20:.2f} | {d / s if s else float('nan'):.2f} |"
            )
    train_rows = {}
    for key in filter(None, args.train.split(",")):
        size, name = key.split("/")
        train_rows[key] = bench_training_step(name, size, args.rounds)
    if train_rows:
        lines += [
            "",
            "Training step (forward, loss, backward, AdamW step), median ms per step (ratio to torch eager); "
            "DeferAndFuse runs each step as one cached program (its trace ends at `optimizer.step()`):",
            "",
            "| model | " + " | ".join(TRAIN_MODES) + " | DeferAndFuse speedup over Strict |",
            "|---|" + "---:|" * (len(TRAIN_MODES) + 1),
        ]
        for key, r in train_rows.items():
            base = r["torch_eager"]["median_s"]
            lines.append(
                f"| {key} | "
                + " | ".join(_ratio_cell(r, m, base) for m in TRAIN_MODES)
                + f" | {r['strict']['median_s'] / r['defer_and_fuse']['median_s']:.2f}x |"
            )
    python_path = _python_path_run(args) if args.python_path == "auto" else None
    if python_path is not None:
        lines += _python_path_lines(rows, train_rows, python_path)
    summary = {"all": summarize(rows, modes)}
    for size in sizes:
        summary[size] = summarize({k: v for k, v in rows.items() if k.startswith(size + "/")}, modes)
    lines += ["", "Geomeans:", "", "| over | " + " | ".join(summary["all"]) + " |"]
    lines.append("|---|" + "---:|" * len(summary["all"]))
    for over, s in summary.items():
        lines.append(f"| {over} | " + " | ".join(f"{v:.2f}x" for v in s.values()) + " |")
    md = "\n".join(lines) + "\n"
    print(md)
    write_report(
        args.out,
        "modes",
        {
            "env": environment(),
            "rows": rows,
            "train": train_rows,
            "summary": summary,
            "python_kernels": python_path,
        },
        md,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
