"""Control-flow higher-order ops in compiled graphs: `torch.cond`, `while_loop`, `map`, `scan`, and
`invoke_subgraph` (`nested_compile_region`).

aot_autograd keeps them in the ATen graph as `torch.ops.higher_order.*` calls whose branches and bodies
are subgraphs (GraphModules read with `get_attr`). Each lowers to its JAX counterpart (`lax.cond`,
`lax.while_loop`, `lax.map`, `lax.scan`) with the subgraphs interpreted by the same lowering table, so the whole
graph stays one program. Another higher-order op (flex_attention, auto_functionalized, ...) has no graph
lowering: the graph runs op by op instead, naming it (`missing`).

Operands reach the branches and bodies as closures (JAX lifts the arrays among them), so Python values
among them (sizes of a graph Dynamo made dynamic) stay concrete numbers for the lowerings; only a
loop's carried values travel through `lax.while_loop`.

A loop body is traced once but runs once per iteration: `run(gm, values, iteration)` hands the body its
iteration number (a counter carried next to the loop's values), and random ops there fold it into their
key, so every iteration draws new numbers and the graph stays one program.
"""

from __future__ import annotations

import torch

from hf_tpu.runtime.buffers import platform

HOP = torch.ops.higher_order
COND, WHILE_LOOP, MAP, SCAN = HOP.cond, HOP.while_loop, HOP.map_impl, HOP.scan
INVOKE_SUBGRAPH = HOP.invoke_subgraph
CONTROL_FLOW = (COND, WHILE_LOOP, MAP, SCAN, INVOKE_SUBGRAPH)
# bodies that run once per iteration: their random ops fold the iteration number into their keys
_REPEATED_BODIES = (WHILE_LOOP, MAP, SCAN)


def subgraphs(node: torch.fx.Node) -> list[torch.fx.GraphModule]:
    """The GraphModules a control-flow node runs (its branches, loop condition and body)."""
    owner = node.graph.owning_module
    found = []
    for arg in node.args:
        if isinstance(arg, torch.fx.Node) and arg.op == "get_attr":
            value = getattr(owner, arg.target, None)
            if isinstance(value, torch.fx.GraphModule):
                found.append(value)
    return found


def unsupported(node: torch.fx.Node) -> str | None:
    """Why control-flow `node` cannot lower to its `lax` counterpart, or None when it can: a
    while_loop carrying a Python number (an unbacked SymInt) has no fixed-type JAX carry."""
    if node.target is WHILE_LOOP:
        carried = node.args[2]
        if not all(
            isinstance(c, torch.fx.Node) and isinstance(c.meta.get("val"), torch.Tensor) for c in carried
        ):
            return "Python numbers among its carried values"
    return None


def is_higher_order(target) -> bool:
    return isinstance(target, torch._ops.HigherOrderOperator)


def repeats_body(target) -> bool:
    """Whether `target` runs its subgraph once per iteration (its random ops fold in the iteration)."""
    return target in _REPEATED_BODIES


def lower(target, run, args: list):
    """The value of control-flow node `target(*args)`; `run(gm, values, iteration=None)` interprets a
    subgraph on JAX values and returns its outputs as a list (a single value for a graph returning one);
    loop bodies get their iteration number as `iteration`."""
    if target is COND:
        return _cond(run, *args)
    if target is WHILE_LOOP:
        return _while_loop(run, *args)
    if target is MAP:
        return _map(run, *args)
    if target is SCAN:
        return _scan(run, *args)
    subgraph, _identifier, *operands = args  # INVOKE_SUBGRAPH
    return tuple(_as_list(run(subgraph, operands)))


def _is_array(v) -> bool:
    return hasattr(v, "dtype") and hasattr(v, "shape")


def _as_list(out) -> list:
    return list(out) if isinstance(out, list | tuple) else [out]


def _cond(run, pred, true_gm, false_gm, operands):
    jax = platform.jax()
    operands = list(operands)
    if not _is_array(pred):  # a Python (or size-derived) bool: the branch is known now
        return tuple(_as_list(run(true_gm if pred else false_gm, operands)))

    def branch(gm):
        return lambda: tuple(_as_list(run(gm, operands)))

    return jax.lax.cond(pred.reshape(()).astype(bool), branch(true_gm), branch(false_gm))


def _while_loop(run, cond_gm, body_gm, carried, additional):
    jax = platform.jax()
    jnp = jax.numpy
    carried, additional = list(carried), list(additional)
    if not all(_is_array(c) for c in carried):
        raise NotImplementedError("while_loop with Python numbers among its carried values")
    dtypes = [c.dtype for c in carried]

    def cond_fn(state):
        _, xs = state
        (pred,) = _as_list(run(cond_gm, [*xs, *additional]))
        return jnp.asarray(pred).reshape(()).astype(bool)

    def body_fn(state):
        i, xs = state
        out = _as_list(run(body_gm, [*xs, *additional], i))
        # the carry keeps its type from one iteration to the next, as in eager
        return i + 1, tuple(jnp.asarray(o).astype(d) for o, d in zip(out, dtypes))

    _, out = jax.lax.while_loop(cond_fn, body_fn, (jnp.uint32(0), tuple(carried)))
    return tuple(out)


def _map(run, body_gm, xs, pos_args):
    jax = platform.jax()
    jnp = jax.numpy
    pos_args = list(pos_args)
    xs = tuple(xs)

    def body(row):  # one row of every xs and its index; the positional args ride along unchanged
        i, slices = row
        return tuple(_as_list(run(body_gm, [*slices, *pos_args], i)))

    return tuple(jax.lax.map(body, (jnp.arange(xs[0].shape[0], dtype=jnp.uint32), xs)))


def _scan(run, combine_gm, init, xs, additional):
    """`combine(*carry, *x_rows, *additional) -> (*new_carry, *y_rows)` over the leading dim of xs:
    the final carry, then each y stacked."""
    jax = platform.jax()
    jnp = jax.numpy
    init, additional = list(init), list(additional)
    dtypes = [c.dtype for c in init]

    def step(state, rows):
        i, carry = state
        out = _as_list(run(combine_gm, [*carry, *rows, *additional], i))
        new = tuple(jnp.asarray(o).astype(d) for o, d in zip(out, dtypes))
        return (i + 1, new), tuple(out[len(init) :])

    (_, carry), ys = jax.lax.scan(step, (jnp.uint32(0), tuple(init)), tuple(xs))
    return (*carry, *ys)
