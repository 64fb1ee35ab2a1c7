"""Output comparison with the TorchDynamo HF-suite rule (DESIGN.md §5).

pass if allclose(out, ref, tol) for every tensor; else, per floating tensor, pass if
RMSE(out, fp64_ref) <= k * RMSE(ref, fp64_ref) + tol / 10 with k = 2 (3 for fp16/bf16 or tiny tensors):
the device may differ from CPU as long as it is not further from the exact answer than CPU itself is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

DEFAULT_TOL = 1e-3
TINY_NUMEL = 10  # tensors this small get the larger multiplier, as in the TorchDynamo suite


def flatten_outputs(obj: Any, prefix: str = "out") -> dict[str, Any]:
    """Nested outputs (ModelOutput, dict, tuple, list) as {path: tensor or plain value}; None and caches dropped."""
    out: dict[str, Any] = {}
    if obj is None:
        return out
    if isinstance(obj, torch.Tensor):
        out[prefix] = obj
        return out
    if isinstance(
        obj, dict
    ):  # ModelOutput and diffusers BaseOutput are OrderedDicts of their non-None fields
        for k, v in obj.items():
            out.update(flatten_outputs(v, f"{prefix}.{k}"))
        return out
    if isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            out.update(flatten_outputs(v, f"{prefix}[{i}]"))
        return out
    if isinstance(obj, bool | int | float | str):
        out[prefix] = obj
        return out
    if hasattr(obj, "to_tuple"):
        return flatten_outputs(obj.to_tuple(), prefix)
    # cache objects and other opaque values are not compared (use_cache=False keeps them out)
    return out


def to_cpu(obj: Any) -> Any:
    """Outputs moved to CPU and detached (also the synchronisation point of a device run).

    ModelOutputs become plain dicts of their non-None fields: only the values are compared.
    """
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu")
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_cpu(v) for v in obj]
    return obj


def exactly_equal(a: Any, b: Any) -> tuple[bool, str]:
    """Bitwise equality of two output structures (NaN equals NaN); the reason when they differ."""
    fa, fb = flatten_outputs(a), flatten_outputs(b)
    if fa.keys() != fb.keys():
        return False, f"output structure differs: {sorted(fa.keys() ^ fb.keys())[:5]}"
    for k, x in fa.items():
        y = fb[k]
        if isinstance(x, torch.Tensor):
            if not isinstance(y, torch.Tensor) or x.shape != y.shape or x.dtype != y.dtype:
                return False, f"{k}: shape/dtype differ"
            if not torch.equal(x, y):
                if x.is_floating_point() and torch.equal(torch.isnan(x), torch.isnan(y)):
                    if torch.equal(torch.nan_to_num(x, nan=0.0), torch.nan_to_num(y, nan=0.0)):
                        continue
                diff = (x.double() - y.double()).abs().nan_to_num(0).max().item() if x.numel() else 0.0
                return False, f"{k}: differs between two CPU runs (max abs diff {diff:.3g})"
        elif x != y:
            return False, f"{k}: {x!r} != {y!r}"
    return True, ""


@dataclass
class Comparison:
    """Verdict of the accuracy rule plus the numbers behind it."""

    ok: bool
    max_abs_diff: float | None = None
    rmse: dict[str, float | None] | None = None
    detail: str = ""
    compared: int = 0
    failures: list[str] = field(default_factory=list)


def _rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    a64, b64 = a.double(), b.double()
    finite = torch.isfinite(a64) & torch.isfinite(b64)
    if not finite.any():
        return 0.0
    return math.sqrt(torch.mean((a64[finite] - b64[finite]) ** 2).item())


def compare(
    ref: Any,
    out: Any,
    fp64_ref: Any = None,
    tol: float = DEFAULT_TOL,
) -> Comparison:
    """Compare device outputs ``out`` with the CPU reference ``ref`` (and its fp64 twin) by the suite rule."""
    fr, fo = flatten_outputs(ref), flatten_outputs(to_cpu(out))
    f64 = flatten_outputs(fp64_ref) if fp64_ref is not None else {}
    if fr.keys() != fo.keys():
        missing = sorted(fr.keys() - fo.keys())[:5]
        extra = sorted(fo.keys() - fr.keys())[:5]
        return Comparison(False, detail=f"output structure differs: missing {missing}, extra {extra}")
    result = Comparison(True, max_abs_diff=0.0)
    worst: tuple[float, float, float] | None = None  # (out_err, ref_err, multiplier) of the worst tensor
    for k, r in fr.items():
        o = fo[k]
        result.compared += 1
        if not isinstance(r, torch.Tensor):
            if r != o and not (
                isinstance(r, float) and isinstance(o, float) and math.isclose(r, o, rel_tol=tol)
            ):
                result.failures.append(f"{k}: {o!r} != {r!r}")
            continue
        if not isinstance(o, torch.Tensor) or o.shape != r.shape:
            result.failures.append(f"{k}: shape {getattr(o, 'shape', type(o))} != {tuple(r.shape)}")
            continue
        if not r.is_floating_point() and not r.is_complex():
            if not torch.equal(r, o.to(r.dtype)):
                result.failures.append(f"{k}: integer/bool outputs differ")
            continue
        o = o.to(r.dtype)
        if r.numel():
            d = (o.double() - r.double()).abs()
            d = d[torch.isfinite(d)]
            if d.numel():
                result.max_abs_diff = max(result.max_abs_diff or 0.0, d.max().item())
        if torch.allclose(o, r, rtol=tol, atol=tol, equal_nan=True):
            continue
        ref64 = f64.get(k)
        if not isinstance(ref64, torch.Tensor) or ref64.shape != r.shape:
            result.failures.append(f"{k}: not allclose(tol={tol}) and no fp64 reference to arbitrate")
            continue
        multiplier = 3.0 if r.dtype in (torch.float16, torch.bfloat16) or r.numel() <= TINY_NUMEL else 2.0
        out_err, ref_err = _rmse(o, ref64), _rmse(r, ref64)
        if worst is None or out_err - multiplier * ref_err > worst[0] - worst[2] * worst[1]:
            worst = (out_err, ref_err, multiplier)
        if not out_err <= multiplier * ref_err + tol / 10.0:
            result.failures.append(
                f"{k}: RMSE(out, fp64) {out_err:.3g} > {multiplier:g} * RMSE(ref, fp64) {ref_err:.3g} + {tol / 10:g}"
            )
    if worst is not None:
        result.rmse = {"out_vs_fp64": worst[0], "ref_vs_fp64": worst[1], "multiplier": worst[2]}
    result.ok = not result.failures
    result.detail = "; ".join(result.failures[:3])
    return result
