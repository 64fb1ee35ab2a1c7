"""`make bench-diffusers`: a small UNet pipeline (Stable Diffusion + DDIM) and a small DiT pipeline (Flux, flow
matching) side by side: torch CPU eager, inductor (CPU, denoiser compiled), tpu Strict, DeferAndFuse,
compiled per step (`hf_tpu.compile_pipeline`) and compiled whole loop (`loop=True`).

Denoising steps/s come from two generation lengths (steps/s = (S2 - S1) / (t(S2) - t(S1))), so prompt
encoding and VAE decoding cancel out and the whole-loop mode (no per-step hook) is measured the same way
as the others. Also: a whole generation's time at S2 steps, the first call (a fresh pipeline's first
generation, compiles included; caches other modes warmed in this process are shared, e.g. Strict's op
cache), and the TorchDynamo graphs compiled after the warm-up (target 0). Modes interleave (DESIGN §3.5).
Writes reports/bench/diffusers.{md,json}. Targets (issue 19): compiled DiT step <= 0.8x torch eager and
<= 1.0x inductor; whole loop <= compiled per step; 0 recompiles after step 1.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import environment, interleaved, write_report  # noqa: E402

MODES = ["torch_eager", "inductor", "strict", "defer_and_fuse", "compiled", "compiled_loop"]
PIPELINES = {"unet_sd_ddim": ("sd", 64), "dit_flux": ("flux", 32)}


def _pipeline(family: str, mode: str):
    import hf_tpu
    from tests.integrations.diffusion_zoo import FAMILIES

    pipe = FAMILIES[family].build()
    denoiser = pipe.unet if family == "sd" else pipe.transformer
    if mode == "inductor":
        denoiser.compile()  # the default backend; a CPU graph stays with inductor
    elif mode != "torch_eager":
        pipe = pipe.to("tpu")
        if mode in ("compiled", "compiled_loop"):
            hf_tpu.compile_pipeline(pipe, loop=mode == "compiled_loop")
    return pipe


def _generate(family: str, size: int, pipe, mode: str, steps: int):
    from tests.integrations.diffusion_zoo import FAMILIES

    inputs = {**FAMILIES[family].inputs(), "num_inference_steps": steps, "height": size, "width": size}

    def run():
        if mode == "defer_and_fuse":
            with torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
                return pipe(**inputs).images
        return pipe(**inputs).images

    return run


def bench(name: str, modes: list[str], s1: int, s2: int, rounds: int) -> dict:
    from torch._dynamo.utils import counters

    family, size = PIPELINES[name]
    pipes, first = {}, {}
    for mode in modes:
        pipes[mode] = _pipeline(family, mode)
        device = "cpu" if mode in ("torch_eager", "inductor") else "tpu"
        t0 = time.perf_counter()
        _generate(family, size, pipes[mode], mode, s2)()
        if device == "tpu":
            torch.tpu.synchronize()
        first[mode] = time.perf_counter() - t0
    cases = {}
    for mode in modes:
        device = "cpu" if mode in ("torch_eager", "inductor") else "tpu"
        for steps in (s1, s2):
            cases[f"{mode}@{steps}"] = (_generate(family, size, pipes[mode], mode, steps), device)
    # the warm-up inside `interleaved` compiles the S1 programs; count what compiles after it
    warm = {k: v for k, v in cases.items() if k.endswith(f"@{s1}")}
    for fn, _ in warm.values():
        fn()
    graphs = counters["stats"]["unique_graphs"]
    timings = interleaved(cases, rounds=rounds, warmup=1, block=3, settle=1)
    recompiles = counters["stats"]["unique_graphs"] - graphs
    results = {}
    for mode in modes:
        t1, t2 = timings[f"{mode}@{s1}"]["median_s"], timings[f"{mode}@{s2}"]["median_s"]
        # None when machine noise exceeds the longer run's extra steps (t2 <= t1): no step time to report
        step = (t2 - t1) / (s2 - s1) if t2 > t1 else None
        results[mode] = {
            "step_s": step,
            "steps_per_s": 1 / step if step else None,
            "generation_s": t2,
            "first_call_s": first[mode],
        }
    return {
        "pipeline": name,
        "family": family,
        "size": size,
        "steps": [s1, s2],
        "modes": results,
        "recompiles_after_warmup": recompiles,
    }


def _markdown(runs: list[dict], env: dict) -> str:
    lines = [
        "# diffusers pipelines: torch CPU vs tpu modes",
        "",
        f"{env['date']}, torch {env['torch']}, jax {env['jax']} ({env['jax_platform']}), {env['cpu_count']} CPUs. "
        "Medians; modes interleaved. step = one denoising step (from two generation lengths); "
        "generation = whole call at the longer length; first call = a fresh pipeline's first generation.",
        "",
    ]
    for run in runs:
        eager = run["modes"].get("torch_eager", {}).get("step_s")
        inductor = run["modes"].get("inductor", {}).get("step_s")
        lines += [
            f"## {run['pipeline']} ({run['family']}, {run['size']}x{run['size']}, steps {run['steps'][0]} vs "
            f"{run['steps'][1]})",
            "",
            "| mode | step (ms) | steps/s | generation (ms) | first call (s) | step vs torch eager | step vs inductor |",
            "|---|---|---|---|---|---|---|",
        ]
        for mode, r in run["modes"].items():
            step = r["step_s"]
            ve = f"{step / eager:.2f}x" if step and eager else "-"
            vi = f"{step / inductor:.2f}x" if step and inductor else "-"
            shown = (f"{step * 1e3:.2f}", f"{r['steps_per_s']:.1f}") if step else ("n/a (noise)", "-")
            lines.append(
                f"| {mode} | {shown[0]} | {shown[1]} | {r['generation_s'] * 1e3:.1f} | "
                f"{r['first_call_s']:.2f} | {ve} | {vi} |"
            )
        lines += ["", f"TorchDynamo graphs compiled after the warm-up: {run['recompiles_after_warmup']}", ""]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="reports/bench")
    parser.add_argument("--pipelines", default=",".join(PIPELINES))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--steps", default="2,6", help="the two generation lengths S1,S2")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    s1, s2 = (int(x) for x in args.steps.split(","))
    modes = args.modes.split(",")
    runs = [bench(name, modes, s1, s2, args.rounds) for name in args.pipelines.split(",")]
    env = environment()
    markdown = _markdown(runs, env)
    write_report(args.out, "diffusers", {"environment": env, "runs": runs}, markdown)
    print(markdown)


if __name__ == "__main__":
    main()
