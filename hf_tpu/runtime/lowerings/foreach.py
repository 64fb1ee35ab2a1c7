"""`_foreach_*` ops (what torch.optim's default foreach path calls): one jitted executable per call.

Without these, PyTorch's CompositeExplicitAutograd slow path loops over the list and dispatches one
tpu op per tensor (AdamW on 100 parameters: ~1,000 dispatches per step). Here each call runs the
element-wise lowering over the whole list inside one `jax.jit`, cached per (overload, shapes, dtypes).
Scalar lists (Adam's per-parameter bias corrections, which change every step) are traced, not baked
into the executable. Functional, in-place and out= overloads are all kernels of this module ("host"
kind, since they write lists of tensors); result dtypes come from PyTorch's meta kernels. Under
DeferAndFuse the call is recorded like any other op (an optimizer step then fuses with forward and
backward instead of flushing the trace at every `_foreach_*`).

Inside `torch.compile(..., backend="tpu")` graphs, aot_autograd emits the functional overloads; each also
has a graph lowering (`ForeachGraphLowering`) built from the same element functions, so a compiled
optimizer step is one XLA program instead of an eager fallback.
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import torch

from hf_tpu.runtime.buffers.dtypes import to_jax_dtype
from hf_tpu.runtime.launch import lazy
from hf_tpu.runtime.lowerings import comparisons as cmp
from hf_tpu.runtime.lowerings import elementwise as ew
from hf_tpu.runtime.lowerings import (
    linalg,  # noqa: F401 - registers mm, used below
    special,  # noqa: F401 - registers lgamma, used below
)
from hf_tpu.runtime.lowerings.elementwise import opmath
from hf_tpu.runtime.lowerings.table import TABLE, lowers
from hf_tpu.runtime.tensors.tensor import to_jax_lazy, wrap, write

_UNARY = (
    "abs acos asin atan ceil cos cosh erf erfc exp expm1 floor frac lgamma log log10 log1p log2 neg "
    "reciprocal round rsqrt sigmoid sign sin sinh sqrt tan tanh trunc"
).split()


def _unary(name: str):
    """The element-wise lowering of aten::<name> (registered by elementwise.py)."""
    return TABLE[getattr(torch.ops.aten, name).default].fn


def _norm(x, ord=2, dtype=None):  # noqa: A002 - schema name
    """Vector norm of the flattened tensor, accumulated in float32 for half types."""
    x = jnp.abs(x.astype(opmath(x.dtype)) if dtype is None else x.astype(to_jax_dtype(dtype)))
    if ord == float("inf"):
        return jnp.max(x)
    if ord == float("-inf"):
        return jnp.min(x)
    if ord == 0:
        return jnp.sum(x != 0).astype(x.dtype)
    if ord == 1:
        return jnp.sum(x)
    if ord == 2:
        return jnp.sqrt(jnp.sum(x * x))
    return jnp.sum(x**ord) ** (1.0 / ord)


# name -> (element function, names of Scalar arguments that must stay static)
_ELEMENT: dict[str, tuple] = {
    "add": (ew.add, ()),
    "sub": (ew.sub, ()),
    "mul": (ew.mul, ()),
    "div": (ew.div, ()),
    "pow": (ew.pow_values, ()),
    "maximum": (cmp.maximum, ()),
    "minimum": (cmp.minimum, ()),
    "clamp_min": (lambda x, lo: cmp.clamp_values(x, lo=lo), ()),
    "clamp_max": (lambda x, hi: cmp.clamp_values(x, hi=hi), ()),
    "addcmul": (ew.addcmul, ()),
    "addcdiv": (ew.addcdiv, ()),
    "lerp": (ew.lerp, ()),
    "zero": (jnp.zeros_like, ()),
    "copy": (lambda x, src, non_blocking=False: jnp.broadcast_to(src, x.shape), ()),
    "norm": (_norm, ("ord",)),
    "max": (jnp.max, ()),
    "mm": (TABLE[torch.ops.aten.mm.default].fn, ()),  # aten::mm's own lowering
    **{name: (_unary(name), ()) for name in _UNARY},
}

# argument kinds
_LIST, _SCALARS, _TENSOR, _SCALAR, _STATIC = range(5)


def map_elements(element, args, each, length: int) -> list:
    """`element` applied at each list position: per-element arguments (tensor lists, scalar lists, a
    1-D `scalars` tensor) give their i-th item, shared ones (a Scalar, a 0-d Tensor) pass as they are.

    The one place the foreach math runs, for the eager kernels and the graph lowerings alike.
    """
    return [jnp.asarray(element(*(a[i] if e else a for a, e in zip(args, each)))) for i in range(length)]


_META = torch.device("meta")


def _kind(arg, static_names) -> int:
    t = str(arg.type)
    if t.startswith("List[") and "Tensor" in t:
        return _LIST
    if t == "List[number]":
        return _SCALARS
    if t in ("Tensor", "Optional[Tensor]"):
        # the `.Tensor` overloads of addcmul/addcdiv take one scalar per list element as a 1-D tensor
        return _SCALARS if arg.name == "scalars" else _TENSOR
    if t == "number" and arg.name not in static_names:
        return _SCALAR
    return _STATIC


class ForeachKernel:
    """The PrivateUse1 kernel of one `_foreach_*` overload (functional, in-place or out=)."""

    def __init__(self, op, element, static_names=()) -> None:
        self.op = op
        self.element = element
        args = op._schema.arguments
        self.names = [a.name for a in args]
        self.defaults = [a.default_value if a.has_default_value() else None for a in args]
        self.mutable = [i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write]
        self.inplace = op._schema.name.endswith("_")
        self.out_index = None if self.inplace or not self.mutable else self.mutable[0]
        self.inputs = [i for i in range(len(args)) if i != self.out_index]
        self.kinds = [_kind(args[i], static_names) for i in self.inputs]
        self.functional = _functional_of(op)
        self.cache: dict = {}
        self.lock = threading.Lock()

    def __call__(self, *args, **kwargs):
        full = list(args) + [
            kwargs.get(name, default)
            for name, default in zip(self.names[len(args) :], self.defaults[len(args) :])
        ]
        values = [full[i] for i in self.inputs]
        slots = [self._slot(v, k) for v, k in zip(values, self.kinds)]
        length = next(n for kind, n in slots if kind == "each")
        if length == 0:
            return [] if self.out_index is None and not self.inplace else None
        if self.inplace and self._aliased(values, slots):
            return self._one_by_one(full, slots, length)
        leaves, key = [], []
        for v, (kind, _) in zip(values, slots):
            if kind == "each":
                items = v.tolist() if isinstance(v, torch.Tensor) else v
                items = [to_jax_lazy(x) if isinstance(x, torch.Tensor) else x for x in items]
                leaves.extend(items)
                key.append(tuple((x.shape, x.dtype) if hasattr(x, "shape") else type(x) for x in items))
            elif kind == "one":
                leaves.append(to_jax_lazy(v) if isinstance(v, torch.Tensor) else v)
                key.append((v.shape, v.dtype) if isinstance(v, torch.Tensor) else type(v))
            else:
                key.append(tuple(v) if isinstance(v, list) else v)
        key = tuple(key)
        entry = self.cache.get(key)
        if entry is None:
            entry = self._build(values, slots)
            with self.lock:
                self.cache[key] = entry
        fn, specs = entry
        results = lazy.maybe_call(fn, leaves)
        if self.inplace:
            for (_, dtype), dest in zip(specs, values[0]):
                if not torch.can_cast(dtype, dest.dtype):
                    raise RuntimeError(
                        f"result type {dtype} can't be cast to the desired output type {dest.dtype}"
                    )
            for dest, value in zip(values[0], results):
                write(dest, _as_dtype(value, dest.dtype))
            return None
        if self.out_index is not None:
            for dest, value, (shape, _) in zip(full[self.out_index], results, specs):
                if tuple(dest.shape) != shape:
                    dest.resize_(shape)
                write(dest, _as_dtype(value, dest.dtype))
            return None
        return [wrap(r, dtype) for r, (_, dtype) in zip(results, specs)]

    def _aliased(self, values, slots) -> bool:
        """Does element i read or write a storage that another element writes? (CPU runs them in order.)"""
        written: dict[int, int] = {}
        for i, t in enumerate(values[0]):
            ptr = t.untyped_storage().data_ptr()
            if written.setdefault(ptr, i) != i:
                return True
        for v, (kind, _) in zip(values[1:], slots[1:]):
            if kind == "each" and isinstance(v, list | tuple):
                for j, t in enumerate(v):
                    if isinstance(t, torch.Tensor) and written.get(t.untyped_storage().data_ptr(), j) != j:
                        return True
            elif isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() in written:
                return True
        return False

    def _one_by_one(self, full, slots, length):
        for i in range(length):
            args = list(full)
            for pos, (kind, _) in zip(self.inputs, slots):
                if kind == "each":
                    v = full[pos]
                    args[pos] = v[i : i + 1] if not isinstance(v, torch.Tensor) else v[i : i + 1].tolist()
            self(*args)

    @staticmethod
    def _slot(v, kind) -> tuple[str, int]:
        """("each", n): one value per list element; ("one", 1): a traced leaf; ("static", 0): baked in."""
        if kind in (_LIST, _SCALARS):
            return "each", (v.numel() if isinstance(v, torch.Tensor) else len(v))
        if kind == _TENSOR or (kind == _SCALAR and type(v) in (int, float)):
            return "one", 1
        return "static", 0

    def _build(self, values: list, slots: list):
        specs = self._meta_specs(values)
        element = self.element

        def run(*leaves):
            per_arg, pos = [], 0
            for v, (kind, n) in zip(values, slots):
                per_arg.append(
                    leaves[pos : pos + n] if kind == "each" else leaves[pos] if kind == "one" else v
                )
                pos += n
            each = [kind == "each" for kind, _ in slots]
            results = map_elements(element, per_arg, each, len(specs))
            return [
                jnp.broadcast_to(r.astype(to_jax_dtype(dtype)), shape)
                for r, (shape, dtype) in zip(results, specs)
            ]

        return jax.jit(run), specs

    def _meta_specs(self, values: list) -> list:
        """(shape, dtype) of each result, from the functional overload's meta kernel."""

        def meta(v):
            if isinstance(v, torch.Tensor):
                if v.device.type == "cpu" and v.dim() <= 1:
                    return v
                return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=_META)
            if isinstance(v, list | tuple):
                return [meta(x) for x in v]
            return v

        func = self.functional
        schema_args = func._schema.arguments
        pos = [meta(v) for v, a in zip(values, schema_args) if not a.kwarg_only]
        kw = {a.name: meta(v) for v, a in zip(values, schema_args) if a.kwarg_only}
        result = func(*pos, **kw)
        return [(tuple(r.shape), r.dtype) for r in result]


def _as_dtype(value, dtype: torch.dtype):
    jdt = to_jax_dtype(dtype)
    return value if value.dtype == jdt else value.astype(jdt)


def _functional_of(op):
    """`_foreach_add_.List` / `_foreach_add.List_out` -> `_foreach_add.List` (same inputs, returns a list)."""
    schema = op._schema
    inplace = schema.name.endswith("_")

    def written(a) -> bool:
        return a.alias_info is not None and a.alias_info.is_write

    if not inplace and not any(written(a) for a in schema.arguments):
        return op
    target = [(a.name, str(a.type)) for a in schema.arguments if inplace or not written(a)]
    packet = getattr(torch.ops.aten, schema.name.removeprefix("aten::").rstrip("_"))
    for ov in packet.overloads():
        cand = getattr(packet, ov)
        if any(written(a) for a in cand._schema.arguments):
            continue
        if [(a.name, str(a.type)) for a in cand._schema.arguments] == target:
            return cand
    raise LookupError(f"no functional overload for {op}")


class ForeachGraphLowering:
    """The graph lowering of one functional `_foreach_*` overload (what aot_autograd's functional
    graphs hold): arrays in, the list of results out, in the schema's order.

    Inside a traced graph every argument already is what the element function takes: tensor lists
    are lists of arrays, a `Scalar[]` a list of numbers, the `.Tensor` overloads' `scalars` a 1-D array
    (indexed per element), a lone `Tensor` a (0-d) array shared by all elements. The compiled
    interpreter casts and broadcasts each result to the node's (shape, dtype).
    """

    def __init__(self, op, element) -> None:
        self.op = op
        self.element = element
        self.each = [_kind(a, ()) in (_LIST, _SCALARS) for a in op._schema.arguments]

    def __call__(self, *args) -> list:
        length = next(len(a) for a, e in zip(args, self.each) if e)
        return map_elements(self.element, args, self.each, length)


def _register() -> None:
    for name, (element, static_names) in _ELEMENT.items():
        for packet_name in (f"_foreach_{name}", f"_foreach_{name}_"):
            packet = getattr(torch.ops.aten, packet_name, None)
            if packet is None:
                continue
            for ov in packet.overloads():
                op = getattr(packet, ov)
                try:
                    kernel = ForeachKernel(op, element, static_names)
                except LookupError:
                    continue
                lowers(f"aten::{packet_name}.{ov}", kind="host")(kernel)
                if kernel.functional is op:
                    lowers(f"aten::{packet_name}.{ov}", graph=True)(ForeachGraphLowering(op, element))


_register()
