"""What the kernels need to know about an overload's schema, computed once per overload: each argument's
kind (how a kernel passes it to JAX), the positional/keyword split and defaults."""

from __future__ import annotations

import torch

# argument kinds
TENSOR, TENSOR_LIST, NUMBER, STATIC, GENERATOR = range(5)


def arg_kind(arg) -> int:
    t = str(arg.type)
    if t in ("Tensor", "Optional[Tensor]"):
        return TENSOR
    if t in ("List[Tensor]", "List[Optional[Tensor]]"):
        return TENSOR_LIST
    if t in ("number", "Optional[number]"):
        return NUMBER
    if t == "Optional[Generator]":
        return GENERATOR
    return STATIC


class Signature:
    """What the kernels need to know about a schema, computed once per overload."""

    def __init__(self, op: torch._ops.OpOverload) -> None:
        args = op._schema.arguments
        self.names = [a.name for a in args]
        self.kinds = tuple(arg_kind(a) for a in args)
        self.n_positional = sum(1 for a in args if not a.kwarg_only)
        self.defaults = [a.default_value if a.has_default_value() else None for a in args]
        self.kwarg_only = [a.name for a in args if a.kwarg_only]
        self.mutable = [i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write]
        # `dtype=None` means torch.get_default_dtype() for factories: part of the cache key
        self.optional_dtypes = [
            i
            for i, a in enumerate(args)
            if a.name == "dtype" and str(a.type) in ("Optional[int]", "Optional[ScalarType]")
        ]

    def normalize(self, args: tuple, kwargs: dict) -> list:
        full = list(args)
        n = len(full)
        if n < len(self.names):
            for i in range(n, len(self.names)):
                name = self.names[i]
                full.append(kwargs[name] if name in kwargs else self.defaults[i])
        return full

    def split(self, full: list) -> tuple[list, dict]:
        pos = full[: self.n_positional]
        kw = {name: full[self.n_positional + i] for i, name in enumerate(self.kwarg_only)}
        return pos, kw


__all__ = ["GENERATOR", "NUMBER", "STATIC", "TENSOR", "TENSOR_LIST", "Signature", "arg_kind"]
