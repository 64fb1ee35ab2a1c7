"""Timing helpers for side-by-side benchmarks: warm up every mode, interleave modes, report medians."""

from __future__ import annotations

import json
import math
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch


def sync(device: str) -> None:
    if device == "tpu":
        torch.tpu.synchronize()


def time_call(fn: Callable[[], object], device: str) -> float:
    sync(device)
    t0 = time.perf_counter()
    out = fn()  # kept alive until the device finished computing it
    sync(device)
    elapsed = time.perf_counter() - t0
    del out
    return elapsed


def interleaved(
    cases: dict[str, tuple[Callable[[], object], str]],
    rounds: int,
    warmup: int = 2,
    block: int = 8,
    settle: int = 3,
) -> dict:
    """Median seconds per case; modes alternate in blocks (A*8 B*8 A*8 ...) so machine noise hits them
    alike (DESIGN §3.5). The first `settle` calls of each block are not counted: on 2 cores, right
    after a switch the previous case's worker threads (torch's OpenMP pool, XLA's Eigen pool) are
    still spinning while the new case's are waking up, which costs each mode up to ~2x for 2-4 calls
    (measured: a tiny compiled BERT takes 0.69, 0.36, 0.32, 0.31, 0.26 ms after a torch eager block).
    That is an artifact of interleaving, not of either mode's steady state."""
    first = {}
    for name, (fn, device) in cases.items():
        first[name] = time_call(fn, device)
        for _ in range(warmup - 1):
            time_call(fn, device)
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, (fn, device) in cases.items():
            for _ in range(settle):
                time_call(fn, device)
            samples[name].extend(time_call(fn, device) for _ in range(block - settle))
    return {
        name: {
            "median_s": statistics.median(s),
            "min_s": min(s),
            "first_call_s": first[name],
            "rounds": rounds,
            "samples": len(s),
        }
        for name, s in samples.items()
    }


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def environment() -> dict:
    import jax

    return {
        "torch": torch.__version__,
        "jax": jax.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "jax_platform": jax.devices()[0].platform,
        "cpu_count": __import__("os").cpu_count(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def write_report(out_dir: str | Path, name: str, payload: dict, markdown: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(payload, indent=2) + "\n")
    (out / f"{name}.md").write_text(markdown)
