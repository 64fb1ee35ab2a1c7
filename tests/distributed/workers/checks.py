"""Expected values on CPU and a failure collector, shared by the workers (each rank can build every
rank's input, so every rank checks its own result against a CPU computation)."""

from __future__ import annotations

import functools
import traceback

import torch

DTYPES = (torch.float32, torch.bfloat16, torch.int64, torch.bool)


def make(rank: int, shape: tuple, dtype: torch.dtype, salt: int) -> torch.Tensor:
    """Rank `rank`'s CPU input for check number `salt`."""
    g = torch.Generator().manual_seed(7919 * salt + rank)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-5, 6, shape, generator=g, dtype=dtype)


def reduce_cpu(tensors: list[torch.Tensor], op: str, factor: float = 1.0) -> torch.Tensor:
    """torch's meaning of the reduce op, computed on CPU (bool: NCCL's, sum = any, product = all)."""
    dtype = tensors[0].dtype
    if dtype == torch.bool:
        s = torch.stack(tensors)
        return {"sum": s.any(0), "max": s.any(0), "min": s.all(0), "product": s.all(0)}[op]
    wide = torch.float64 if dtype.is_floating_point else dtype
    s = torch.stack([t.to(wide) for t in tensors])
    if op == "sum":
        out = s.sum(0)
    elif op == "avg":
        out = s.sum(0) / len(tensors)
    elif op == "premul_sum":
        out = (s * factor).sum(0)
    elif op == "max":
        out = s.amax(0)
    elif op == "min":
        out = s.amin(0)
    elif op == "product":
        out = s.prod(0)
    else:
        fn = {"band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}[op]
        out = functools.reduce(fn, list(s))
    return out.to(dtype)


def tolerances(dtype: torch.dtype) -> dict:
    if dtype == torch.bfloat16:
        return {"rtol": 2e-2, "atol": 6e-2}
    if dtype == torch.float32:
        return {"rtol": 1e-5, "atol": 1e-5}
    return {"rtol": 0, "atol": 0}


class Checker:
    """Runs named checks, keeps going after a failure, and reports them all at the end."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.failures: list[str] = []
        self.passed = 0

    def close(self, name: str, actual: torch.Tensor, expected: torch.Tensor, **tolerance) -> None:
        """`tolerance` (rtol and atol) overrides the dtype's default."""
        try:
            assert actual.device.type == "tpu", f"result is on {actual.device}"
            got = actual.cpu()
            assert got.dtype == expected.dtype, f"dtype {got.dtype} != {expected.dtype}"
            torch.testing.assert_close(got, expected, **(tolerances(expected.dtype) | tolerance))
            self.passed += 1
        except Exception as exc:  # noqa: BLE001 - collected, reported at the end
            self.failures.append(f"[rank {self.rank}] {name}: {exc}")

    def run(self, name: str, fn) -> None:
        try:
            fn()
            self.passed += 1
        except Exception:  # noqa: BLE001
            self.failures.append(f"[rank {self.rank}] {name}: {traceback.format_exc()[-2500:]}")

    def finish(self) -> int:
        for f in self.failures:
            print("FAIL", f, flush=True)
        print(f"rank {self.rank}: {self.passed} checks passed, {len(self.failures)} failed", flush=True)
        return 1 if self.failures else 0
