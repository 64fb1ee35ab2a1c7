"""`as_strided` inside a compiled graph reads the storage its input lies on, as PyTorch does.

A graph's values are logical arrays, not storages: `x[1:].as_strided((2,), (1,), 0)` reads elements 0
and 1 of x's storage, but gathering from the flattened input `x[1:]` read elements 4 and 5 (and an empty
view raised an index error). Before lowering, each `as_strided` whose input is a chain of views is
pointed at the chain's root, the tensor that owns the storage: when the root covers its part of the
storage densely (any dim order), the gather reads the root's values in memory order with the offset
taken relative to the root's first element. An `as_strided` that would read storage the root does not
hold (past a graph input's view, say) cannot be answered from the graph's values: it is reported, and the
graph then runs op by op, where eager kernels see real storages.
"""

from __future__ import annotations

import torch

_aten = torch.ops.aten
_AS_STRIDED = (_aten.as_strided.default, _aten.as_strided_copy.default)


def _fake(node) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _root(node: torch.fx.Node) -> torch.fx.Node:
    """The first node up a chain of view ops: the tensor whose storage the views share."""
    while (
        node.op == "call_function"
        and isinstance(node.target, torch._ops.OpOverload)
        and node.target.is_view
        and node.args
        and isinstance(node.args[0], torch.fx.Node)
        and _fake(node.args[0]) is not None
    ):
        node = node.args[0]
    return node


def _dense_order(shape: tuple, stride: tuple) -> tuple | None:
    """The dims in memory order (outermost first) when the layout covers its storage range exactly."""
    dims = sorted(range(len(shape)), key=lambda d: (-stride[d], d))
    expected = 1
    for d in reversed(dims):
        if shape[d] > 1 and stride[d] != expected:
            return None
        expected *= shape[d]
    return tuple(dims)


def _span(size, stride, offset: int) -> tuple[int, int]:
    """The lowest and highest storage index an as_strided view reads."""
    low = high = offset
    for n, st in zip(size, stride):
        low += min(0, (n - 1) * st)
        high += max(0, (n - 1) * st)
    return low, high


def _plan(node: torch.fx.Node) -> tuple | str | None:
    """(root, memory order, root's storage offset) for an as_strided of a view; a reason when the
    graph's values cannot answer it; None when nothing needs changing."""
    source = node.args[0]
    root = _root(source) if isinstance(source, torch.fx.Node) else source
    if root is source and root.op != "placeholder":
        return None  # a fresh value: its flattened values are its storage
    val = _fake(root)
    size, stride = node.args[1], node.args[2]
    offset = (node.args[3] if len(node.args) > 3 else node.kwargs.get("storage_offset")) or 0
    if val is None or not all(isinstance(v, int) for v in (*size, *stride, offset, val.storage_offset())):
        return f"{node.target} of a view with symbolic sizes"
    order = _dense_order(tuple(val.shape), tuple(val.stride()))
    if order is None:
        return f"{node.target} of a view of a non-dense tensor"
    low, high = _span(size, stride, offset)
    base = val.storage_offset()
    if root is source and base == 0 and order == tuple(range(len(order))):
        return None  # an input holding its whole storage in row-major order: nothing to change
    if all(n > 0 for n in size) and (low < base or high >= base + val.numel()):
        return f"{node.target} reading storage outside the graph's values"
    return root, order, base


def _insert(
    gm: torch.fx.GraphModule, before: torch.fx.Node, op, args: tuple, kwargs: dict, val
) -> torch.fx.Node:
    with gm.graph.inserting_before(before):
        node = gm.graph.call_function(op, args, kwargs)
    node.meta["val"] = val
    return node


def resolve(gm: torch.fx.GraphModule) -> list[str]:
    """Point each as_strided of a view at its storage's root (see the module doc); the ones that cannot
    be answered from the graph's values, as reasons for running op by op."""
    plans = [
        (node, _plan(node))
        for node in gm.graph.nodes
        if node.op == "call_function" and node.target in _AS_STRIDED
    ]  # all planned on the original chains before any is rewritten
    unresolved = [plan for _, plan in plans if isinstance(plan, str)]
    changed = False
    for node, plan in plans:
        if not isinstance(plan, tuple):
            continue
        root, order, base = plan
        storage = root
        val = _fake(root)
        if order != tuple(range(len(order))) or base:
            with val.fake_mode:
                permuted = val.permute(order)
                fresh = permuted.clone(memory_format=torch.contiguous_format)
            if order != tuple(range(len(order))):
                storage = _insert(gm, node, _aten.permute.default, (root, list(order)), {}, permuted)
            # a fresh contiguous tensor: the same reads when the graph runs op by op
            storage = _insert(
                gm, node, _aten.clone.default, (storage,), {"memory_format": torch.contiguous_format}, fresh
            )
        offset = (node.args[3] if len(node.args) > 3 else node.kwargs.get("storage_offset")) or 0
        node.args = (storage, node.args[1], node.args[2], offset - base)
        node.kwargs = {}
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()
    return unresolved


__all__ = ["resolve"]
