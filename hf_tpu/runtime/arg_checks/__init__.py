"""Argument checks PyTorch's CPU kernels make and the tpu path would otherwise skip.

A tpu op computes its result's shape and dtype with PyTorch's meta kernel, then runs a JAX lowering.
Meta kernels leave out many of the CPU kernels' checks (mixed dtypes in `mm`, negative conv padding,
integer inputs to `std`), and XLA clamps out-of-range indices where CPU raises. The checks here put
those errors back, with CPU's exception type and message:

- `@checks("aten::op.overload", ...)`: a static check (dtypes, shapes, argument values), run on every
  call before the meta kernel; it must not read tensor values (no sync, no cost beyond Python).
- `@checks(..., values=True)`: a check that reads tensor values (index bounds, targets in range). Those
  need a sync, so they run in Debug mode (`DEFER_NEVER_AND_LAUNCH_BLOCKING`) only; Strict and
  DeferAndFuse keep XLA's semantics (out-of-range indices clamp, as on torch_xla), documented in README.

A check receives the functional overload's arguments in schema order (defaults filled, tpu tensors as
torch tensors) and raises, or returns None. In-place and out= variants run their functional op's checks.
Family modules in this package register on import (`load_all`).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable

import torch

from hf_tpu.runtime.lowerings.table import resolve

# functional overload -> (static checks, value checks)
CHECKS: dict[torch._ops.OpOverload, tuple[list[Callable], list[Callable]]] = {}
_loaded = False


def checks(*names: str, values: bool = False) -> Callable[[Callable], Callable]:
    """Register the decorated function as a check of each named overload."""

    def register(fn: Callable) -> Callable:
        for name in names:
            static, by_value = CHECKS.setdefault(resolve(name), ([], []))
            (by_value if values else static).append(fn)
        return fn

    return register


def for_op(op: torch._ops.OpOverload) -> tuple[tuple, tuple] | None:
    """(static checks, value checks) of functional overload `op`, or None when it has none."""
    entry = CHECKS.get(op)
    if entry is None:
        return None
    return tuple(entry[0]), tuple(entry[1])


def load_all() -> None:
    global _loaded
    if _loaded:
        return
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        importlib.import_module(f"{__name__}.{info.name}")
    _loaded = True
