"""`make bench`: model x {torch eager, inductor, Strict, DeferAndFuse, compiled "tpu"} forward latency.

One run, side by side: median steady-state times (modes interleaved A B A B after warm-up), first-call
times, and ratios to native torch CPU eager. Writes reports/bench/modes.{md,json}.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import environment, geomean, interleaved, write_report  # noqa: E402
from tests.hf_models import build  # noqa: E402

MODELS = ["llama", "gpt2", "bert", "t5", "unet"]
MODES = ["torch_eager", "inductor", "strict", "defer_and_fuse", "compiled"]


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


def bench_model(name: str, modes: list[str], rounds: int) -> dict:
    cases = {}
    first_calls = {}
    for mode in modes:
        model, inputs = build(name)
        device = "cpu"
        if mode in ("strict", "defer_and_fuse", "compiled"):
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
        cases[mode] = (run, device)
    res = interleaved(cases, rounds=rounds, warmup=2)
    for mode in modes:
        res[mode]["first_call_s"] = first_calls[mode]
    return res


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="reports/bench")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    rows = {}
    for name in args.models.split(","):
        torch._dynamo.reset()
        rows[name] = bench_model(name, modes, args.rounds)
        base = rows[name]["torch_eager"]["median_s"] if "torch_eager" in modes else None
        cells = " | ".join(
            f"{m} {rows[name][m]['median_s'] * 1e3:.2f} ms"
            + (f" ({rows[name][m]['median_s'] / base:.2f}x)" if base else "")
            for m in modes
        )
        print(f"{name:6s} {cells}", flush=True)
    lines = [
        "# Forward latency by execution mode (ms, median; ratio to torch eager)",
        "",
        f"Environment: {environment()}",
        "",
        "| model | " + " | ".join(modes) + " |",
        "|---|" + "---|" * len(modes),
    ]
    for name, r in rows.items():
        base = r["torch_eager"]["median_s"] if "torch_eager" in r else None
        lines.append(
            f"| {name} | "
            + " | ".join(
                f"{r[m]['median_s'] * 1e3:.2f}" + (f" ({r[m]['median_s'] / base:.2f}x)" if base else "")
                for m in modes
            )
            + " |"
        )
    lines += [
        "",
        "First call (s, includes compilation):",
        "",
        "| model | " + " | ".join(modes) + " |",
        "|---|" + "---|" * len(modes),
    ]
    for name, r in rows.items():
        lines.append(f"| {name} | " + " | ".join(f"{r[m]['first_call_s']:.2f}" for m in modes) + " |")
    summary = {}
    if "torch_eager" in modes:
        for m in modes:
            summary[m] = geomean([r[m]["median_s"] / r["torch_eager"]["median_s"] for r in rows.values()])
        if "strict" in modes and "defer_and_fuse" in modes:
            summary["defer_vs_strict_speedup"] = geomean(
                [r["strict"]["median_s"] / r["defer_and_fuse"]["median_s"] for r in rows.values()]
            )
        if "inductor" in modes and "compiled" in modes:
            summary["compiled_vs_inductor"] = geomean(
                [r["compiled"]["median_s"] / r["inductor"]["median_s"] for r in rows.values()]
            )
        lines += ["", "Geomean over models: " + ", ".join(f"{k} {v:.2f}x" for k, v in summary.items()), ""]
    md = "\n".join(lines) + "\n"
    print(md)
    write_report(args.out, "modes", {"env": environment(), "rows": rows, "summary": summary}, md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
