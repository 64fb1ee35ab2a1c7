"""torch's `ReduceOp`s, by name, checked against the tensor's dtype before any program runs."""

from __future__ import annotations

import torch
import torch.distributed as dist

_NAMES = {
    dist.ReduceOp.RedOpType.SUM: "sum",
    dist.ReduceOp.RedOpType.AVG: "avg",
    dist.ReduceOp.RedOpType.PRODUCT: "product",
    dist.ReduceOp.RedOpType.MIN: "min",
    dist.ReduceOp.RedOpType.MAX: "max",
    dist.ReduceOp.RedOpType.BAND: "band",
    dist.ReduceOp.RedOpType.BOR: "bor",
    dist.ReduceOp.RedOpType.BXOR: "bxor",
    dist.ReduceOp.RedOpType.PREMUL_SUM: "premul_sum",
}
# which ops each kind of dtype supports (as NCCL does: bitwise ops on integers and bool only)
_SUPPORTED = {
    "bool": ("sum", "max", "min", "product", "band", "bor", "bxor"),
    "int": ("sum", "max", "min", "product", "band", "bor", "bxor"),
    "float": ("sum", "avg", "max", "min", "product", "premul_sum"),
    "complex": ("sum", "avg", "product", "premul_sum"),
}


class UnsupportedReduceOpError(ValueError):
    """A reduce op tpu_dist cannot apply to this dtype."""


def kind(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "bool"
    if dtype.is_complex:
        return "complex"
    if dtype.is_floating_point:
        return "float"
    return "int"


def resolve(op, dtype: torch.dtype, collective: str) -> tuple[str, float | None]:
    """(op name, premul factor or None) for `op` applied to `dtype`, or a clear error naming both."""
    red_type = getattr(op, "op", op)
    name = _NAMES.get(red_type)
    if name is None:
        raise UnsupportedReduceOpError(f"tpu_dist {collective}: unknown reduce op {op!r}")
    factor = None
    if name == "premul_sum":
        factor = getattr(op, "factor", None)
        if isinstance(factor, torch.Tensor):
            factor = factor.item()
        if factor is None:
            raise UnsupportedReduceOpError(
                f"tpu_dist {collective}: ReduceOp.PREMUL_SUM without a factor; make it with "
                "torch.distributed._make_nccl_premul_sum(factor)"
            )
        factor = float(factor)
    k = kind(dtype)
    if name not in _SUPPORTED[k]:
        raise UnsupportedReduceOpError(
            f"tpu_dist {collective}: ReduceOp.{name.upper()} is not defined for {dtype} tensors "
            f"(ops for {k} tensors: {', '.join(o.upper() for o in _SUPPORTED[k])})"
        )
    return name, factor
