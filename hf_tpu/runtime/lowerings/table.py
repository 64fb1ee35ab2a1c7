"""The one table of ATen -> JAX lowerings, shared by Strict/Debug eager, DeferAndFuse and compiled.

A lowering is a plain function written as math on `jax.Array`s. It receives the op's arguments in
schema order (tensors as arrays, everything else as Python values) and returns array(s). Families of
ops live in `hf_tpu.runtime.lowerings.*` and register here with `@lowers("aten::op.overload", ...)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class Lowering:
    fn: Callable
    # "jit": pure JAX, traced and cached per (op, static args, shapes, dtypes).
    # "host": runs eagerly with the torch arguments themselves (copies, factories, data-dependent shapes).
    kind: str = "jit"
    # Scalar arguments are traced (no recompile per value) unless the lowering needs them static.
    static_scalars: bool = False
    # Random ops get a fresh PRNG key from the device generator as their first argument.
    random: bool = False


TABLE: dict[torch._ops.OpOverload, Lowering] = {}
# Lowerings used only inside traced graphs (compiled / fused): view and copy ops, which eager runs
# through PyTorch's own metadata kernels and the host copy path instead.
GRAPH_TABLE: dict[torch._ops.OpOverload, Lowering] = {}


def resolve(name: str) -> torch._ops.OpOverload:
    """'aten::add.Tensor' (or 'add.Tensor', 'add') -> torch.ops.aten.add.Tensor; other namespaces
    ('prims::convert_element_type') by their prefix."""
    namespace, _, name = name.rpartition("::")
    base, _, overload = name.partition(".")
    packet = getattr(getattr(torch.ops, namespace or "aten"), base)
    return getattr(packet, overload or "default")


def lowers(
    *names: str, kind: str = "jit", static_scalars: bool = False, random: bool = False, graph: bool = False
):
    """Register the decorated function as the lowering of each named overload.

    `graph=True` registers it for traced graphs only (never as an eager kernel).
    """

    def register(fn: Callable) -> Callable:
        for name in names:
            try:
                op = resolve(name)
            except AttributeError:  # an overload this torch version lacks
                continue
            table = GRAPH_TABLE if graph else TABLE
            table[op] = Lowering(fn, kind=kind, static_scalars=static_scalars, random=random)
        return fn

    return register


def graph_lowering(op) -> Lowering | None:
    """The pure-JAX lowering of `op` inside a traced graph, if there is one."""
    lowering = GRAPH_TABLE.get(op)
    if lowering is not None:
        return lowering
    lowering = TABLE.get(op)
    return lowering if lowering is not None and lowering.kind == "jit" else None


def lowered_ops() -> list[str]:
    return sorted(str(op) for op in TABLE)


# Host lowerings that prepare their arguments on the host, then run a jitted lowering as an eager op
# kernel (`index` turning boolean masks into indices): the execution layer provides the kernel class.
_kernel_factory: list = [None]
_eager_kernels: dict = {}


def provide_kernel_factory(factory: Callable) -> None:
    """Called by the execution layer: `factory(op, lowering, mode=..., functional=...)` builds a kernel."""
    _kernel_factory[0] = factory


def eager_kernel(name: str, lowering: Lowering, inplace_of: str | None = None):
    """The eager kernel running `lowering` as overload `name` (built once, on first use); `inplace_of`
    names the functional overload an in-place `name` computes."""
    kernel = _eager_kernels.get(name)
    if kernel is None:
        op = resolve(name)
        if inplace_of is None:
            kernel = _kernel_factory[0](op, lowering)
        else:
            kernel = _kernel_factory[0](op, lowering, mode="inplace", functional=resolve(inplace_of))
        _eager_kernels[name] = kernel
    return kernel
