"""Side by side: `bench_eager`/`bench_modes` results of two code versions, run alternately on one machine.

Usage: `python benchmarks/compare_runs.py --before DIR[,DIR...] --after DIR[,DIR...] --out FILE.md`, where
each DIR holds an `eager.json` and/or `modes.json` written by those scripts (for example by running the
old checkout's own benchmark scripts with PYTHONPATH pointing at it, then this checkout's, A B A B).
Only ratios to native torch measured in the same run are compared, never absolute times across runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def _load(dirs: list[str], name: str) -> list[dict]:
    return [json.loads((Path(d) / name).read_text()) for d in dirs if (Path(d) / name).exists()]


def _eager_rows(runs: list[dict]) -> dict[str, float]:
    """Strict/torch ratio per model, median over runs, plus the per-op ratio."""
    out: dict[str, list[float]] = {}
    for run in runs:
        for m in run["models"]:
            out.setdefault(f"{m['size']}/{m['model']}", []).append(m["ratio"])
        out.setdefault("per-op (1,000 adds)", []).append(
            run["per_op_us"]["tpu_strict"] / run["per_op_us"]["torch_cpu"]
        )
        for size, g in run["geomean_ratio"].items():
            out.setdefault(f"geomean {size}", []).append(g)
    return {k: statistics.median(v) for k, v in out.items()}


def _modes_rows(runs: list[dict]) -> dict[str, dict[str, float]]:
    """Each device mode's time over torch eager's, per model, median over runs."""
    out: dict[str, dict[str, list[float]]] = {}
    for run in runs:
        for model, cases in run["rows"].items():
            base = cases["torch_eager"]["median_s"]
            for mode, case in cases.items():
                if isinstance(case, dict) and mode != "torch_eager":
                    out.setdefault(model, {}).setdefault(mode, []).append(case["median_s"] / base)
    return {m: {k: statistics.median(v) for k, v in modes.items()} for m, modes in out.items()}


def _geomean(values: list[float]) -> float:
    return statistics.geometric_mean(values) if values else float("nan")


def render(before: list[str], after: list[str]) -> str:
    lines = [
        "# Before / after: one chip, the same machine, runs alternated",
        "",
        f"Before: {', '.join(before)}; after: {', '.join(after)}. Ratios to native torch CPU eager measured in the "
        "same run (lower is better), medians over the runs.",
        "",
    ]
    eb, ea = _eager_rows(_load(before, "eager.json")), _eager_rows(_load(after, "eager.json"))
    if eb and ea:
        lines += [
            "## bench_eager: Strict / torch",
            "",
            "| case | before | after | after / before |",
            "|---|---:|---:|---:|",
        ]
        for key in eb:
            if key in ea:
                lines.append(f"| {key} | {eb[key]:.2f}x | {ea[key]:.2f}x | {ea[key] / eb[key]:.2f} |")
        lines.append("")
    mb, ma = _modes_rows(_load(before, "modes.json")), _modes_rows(_load(after, "modes.json"))
    if mb and ma:
        modes = [m for m in next(iter(ma.values())) if all(m in mb.get(k, {}) for k in ma)]
        lines += [
            "## bench_modes: mode / torch eager",
            "",
            "| model | " + " | ".join(f"{m} before | {m} after" for m in modes) + " |",
            "|---|" + "---:|---:|" * len(modes),
        ]
        for model in ma:
            cells = [f"{mb[model][m]:.2f}x | {ma[model][m]:.2f}x" for m in modes]
            lines.append(f"| {model} | " + " | ".join(cells) + " |")
        cells = [
            f"{_geomean([mb[k][m] for k in ma]):.2f}x | {_geomean([ma[k][m] for k in ma]):.2f}x"
            for m in modes
        ]
        lines += ["| **geomean** | " + " | ".join(cells) + " |", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--before", required=True)
    parser.add_argument("--after", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--title-note", default="", help="a paragraph added under the title")
    args = parser.parse_args(argv)
    text = render(args.before.split(","), args.after.split(","))
    if args.title_note:
        head, _, rest = text.partition("\n\n")
        text = f"{head}\n\n{args.title_note}\n\n{rest}"
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
