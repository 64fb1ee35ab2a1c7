"""The C++ kernels' fast paths against the Python kernels, in one process: Strict ops run from C++ and
DeferAndFuse ops recorded in C++ (switched on and off between interleaved blocks), with torch eager on
CPU as the reference. In one process the machine's noise hits every case alike, which a child process
run after the parent (bench_modes `--python-path`) cannot promise on a shared 2-core VM.

`make bench-native`; the report lands in reports/bench/native.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import environment, geomean, interleaved, write_report  # noqa: E402
from models import NAMES, build, n_params  # noqa: E402

import hf_tpu  # noqa: E402,F401 - registers the tpu device
from hf_tpu.runtime.execution import native_recording  # noqa: E402

CASES = ("torch_eager", "strict_cpp", "strict_python", "defer_cpp", "defer_python")


def _first_tensor(out):
    for name in ("logits", "last_hidden_state", "sample"):
        value = getattr(out, name, None)
        if isinstance(value, torch.Tensor):
            return value
    return out[0] if isinstance(out, tuple) else out


def _runner(model, inputs, case: str):
    ext = native_recording._ext
    mode = {"strict": "defer_never", "defer": "defer_and_fuse"}.get(case.split("_")[0])
    native = case.endswith("_cpp")

    def run():
        if mode is not None:
            torch.tpu.set_eager_mode(mode)
            # the C++ kernels' switches: Strict runs cached ops from C++, DeferAndFuse records them there
            (ext.set_strict if mode == "defer_never" else ext.set_recording)(native)
        with torch.no_grad():
            out = _first_tensor(model(**inputs))
        if mode is not None:
            out = out.cpu()  # a forward is done when its value is on the host (DeferAndFuse flushes here)
            torch.tpu.set_eager_mode("defer_never")
        return out

    return run


def bench_model(name: str, size: str, rounds: int) -> dict:
    cases = {}
    params = 0
    for case in CASES:
        model, inputs = build(name, size)
        params = n_params(model)
        if case != "torch_eager":
            model.to("tpu")
            inputs = {k: v.to("tpu") for k, v in inputs.items()}
        cases[case] = (_runner(model, inputs, case), "cpu")
    res = interleaved(cases, rounds=rounds, warmup=3)
    res["params"] = params
    return res


def markdown(results: dict, env: dict) -> str:
    lines = [
        "# C++ kernels vs Python kernels, one process",
        "",
        f"Environment: {env}",
        "",
        "Median ms per forward (ratio to torch eager), modes interleaved in blocks in one process "
        "(benchmarks/common.py). `C++`: Strict runs cached ops from the C++ kernel, DeferAndFuse records "
        "them there; `Python`: the same process with both switched off (each op enters its Python kernel "
        "through the C++ one; view metadata kernels stay in C++).",
        "",
        "| model | params | torch eager | Strict C++ | Strict Python | DeferAndFuse C++ | DeferAndFuse Python "
        "| Strict C++ speedup | DeferAndFuse C++ speedup | DeferAndFuse/Strict C++ | DeferAndFuse/Strict Python |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ratios = {k: [] for k in ("strict", "defer", "dfs_cpp", "dfs_py", "strict_torch", "defer_torch")}
    for key, r in results.items():
        ms = {c: r[c]["median_s"] * 1e3 for c in CASES}
        t = ms["torch_eager"]
        sc, sp, dc, dp = ms["strict_cpp"], ms["strict_python"], ms["defer_cpp"], ms["defer_python"]
        ratios["strict"].append(sp / sc)
        ratios["defer"].append(dp / dc)
        ratios["dfs_cpp"].append(sc / dc)
        ratios["dfs_py"].append(sp / dp)
        ratios["strict_torch"].append(sc / t)
        ratios["defer_torch"].append(dc / t)
        lines.append(
            f"| {key} | {r['params'] / 1e6:.2f}M | {t:.2f} | {sc:.2f} ({sc / t:.2f}x) | {sp:.2f} ({sp / t:.2f}x) "
            f"| {dc:.2f} ({dc / t:.2f}x) | {dp:.2f} ({dp / t:.2f}x) | {sp / sc:.2f}x | {dp / dc:.2f}x "
            f"| {sc / dc:.2f}x | {sp / dp:.2f}x |"
        )
    g = {k: geomean(v) for k, v in ratios.items()}
    lines += [
        "",
        f"Geomeans: Strict C++ {g['strict']:.2f}x faster than Strict Python; DeferAndFuse C++ {g['defer']:.2f}x "
        f"faster than DeferAndFuse Python; DeferAndFuse over Strict {g['dfs_cpp']:.2f}x with the C++ kernels, "
        f"{g['dfs_py']:.2f}x with the Python ones; Strict C++ / torch eager {g['strict_torch']:.2f}x, "
        f"DeferAndFuse C++ / torch eager {g['defer_torch']:.2f}x.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="reports/bench")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--models", default=",".join(NAMES))
    parser.add_argument("--sizes", default="tiny")
    args = parser.parse_args()
    if not native_recording.ENABLED:
        sys.exit("bench_native: the C++ extension is not in use (build it: make install)")
    results = {}
    for size in args.sizes.split(","):
        for name in args.models.split(","):
            key = f"{size}/{name}"
            results[key] = bench_model(name, size, args.rounds)
            print(key, {c: round(results[key][c]["median_s"] * 1e3, 2) for c in CASES}, flush=True)
    env = environment()
    write_report(args.out, "native", {"environment": env, "results": results}, markdown(results, env))
    print(markdown(results, env))


if __name__ == "__main__":
    main()
