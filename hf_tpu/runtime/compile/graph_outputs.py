"""How a compiled graph's outputs reach the caller as eager would give them (`plan_outputs`).

The jitted program returns fresh arrays; eager returns the same input objects it was given, views that
share storage with other outputs, CPU tensors for `.cpu()` results and Python numbers for sizes.
aot_autograd relies on all of it (sizes must be numbers; inference outputs that view other outputs must
alias them), so the plan is made once per graph and replayed on every call.
"""

from __future__ import annotations

import operator

import torch
from torch._prims_common import is_contiguous_or_false
from torch.fx.experimental.symbolic_shapes import guard_or_false

from hf_tpu.runtime.compile.graph_rng import SAVE_RNG
from hf_tpu.runtime.tensors.strided import memory_order
from hf_tpu.runtime.tensors.tensor import wrap, wrap_laid_out


def spec_of(val):
    """(shape, dtype) of a traced value; shape None when a dim is symbolic (a graph Dynamo made
    dynamic: its size is only known per call, so only the dtype is enforced)."""
    if isinstance(val, torch.Tensor):
        if any(isinstance(s, torch.SymInt) for s in val.shape):
            return (None, val.dtype)
        return (tuple(val.shape), val.dtype)
    return None


def user_outputs(gm: torch.fx.GraphModule) -> range:
    """The indices of the forward graph's outputs its caller sees: after the new values of mutated
    inputs, before what is saved for the backward (aot_autograd's `num_forward_returns`)."""
    n = len(output_nodes(gm))
    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
    if meta is None:
        return range(n)
    if getattr(meta, "tokens", None):
        return range(0)  # effect tokens lead the outputs: leave the rest as it is
    return range(meta.num_mutated_inp_runtime_indices, min(meta.num_forward_returns, n))


def _belongs_on_cpu(node) -> bool:
    """Whether graph output `node` is a CPU tensor in eager (`.cpu()`, a CPU factory, a CPU input's
    math). A saved RNG state stays on the device although traced on CPU: only our backward reads it, and
    fetching it would wait for the whole graph."""
    if not isinstance(node, torch.fx.Node):
        return False
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.device.type != "cpu":
        return False
    saved_state = node.target is operator.getitem and getattr(node.args[0], "target", None) is SAVE_RNG
    return not saved_state


# where a value the jitted program returns goes (`_placement`): a tpu tensor, a CPU tensor, a number (or,
# for a tpu tensor the graph lays out as a permutation, its memory order: a tuple, see `_fake_order`)
_DEVICE, _HOST, _NUMBER = "device", "host", "number"
# how a graph output is produced (`plan_outputs`)
FROM_JIT, FROM_ARG, ON_HOST, AS_VIEW, CONST = "jit", "arg", "on host", "view", "const"


def output_nodes(gm: torch.fx.GraphModule) -> list:
    for node in gm.graph.nodes:
        if node.op == "output":
            return list(node.args[0])
    return []


def plan_outputs(gm: torch.fx.GraphModule, user_outputs: range) -> tuple[list, list, dict, bool]:
    """How `GraphProgram` produces each output as eager (and aot_eager, which runs the graph itself)
    would: (plan, nodes the jitted program returns, graph output index -> index among those, any views).

    - an input returned as is (a tensor saved for the backward, a size): that very object, so it keeps
      its identity, storage and autograd metadata (a double backward must see the input itself);
    - a number computable from the inputs alone (a size Dynamo made dynamic): computed on the host, a
      Python number as aot_autograd requires, without waiting for the graph;
    - a user output that is a view (`view`, `select`, `t`, ... of another value): replayed on the tensor
      it views, so it shares that storage as in eager. aot_autograd regenerates outputs aliasing inputs,
      and outputs aliasing intermediates only when they require grad: the rest is the backend's job.
      A viewed intermediate that is no output is returned too, as a hidden result. Saved activations
      stay compact copies (a view would keep its whole base alive and reach the backward strided);
    - anything else: a result of the jitted program (a number among them: converted with int()/float()/
      bool(), which waits for the graph).
    Plan entries are (kind, a, b, c); see `GraphProgram._results`.
    """
    nodes = output_nodes(gm)
    inputs = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    plan: list = [None] * len(nodes)
    jit_nodes: list = []
    jit_index: dict = {}
    first: dict = {}  # user output node -> its first index
    hidden: dict = {}  # viewed intermediate -> its index in `plan` (after the outputs)
    host: dict = {}
    views = []

    def from_jit(node, laid_out: bool = False):
        """`laid_out`: a value the caller sees (a user output, or the base of one that views it), given
        the strides its fake tensor has (`_fake_order`); the new values of mutated inputs and the
        activations saved for the backward stay row-major."""
        jit_nodes.append(node)
        spec, place = _placement(node)
        if laid_out and place is _DEVICE:
            place = _fake_order(node.meta.get("val")) or place
        return (FROM_JIT, len(jit_nodes) - 1, spec, place)

    for k, node in enumerate(nodes):
        if not isinstance(node, torch.fx.Node):
            plan[k] = (CONST, node, None, None)
        elif node.op == "placeholder":
            plan[k] = (FROM_ARG, inputs[node], None, None)
        elif _number_type(node.meta.get("val")) is not None and _computable_on_host(node, host):
            plan[k] = (ON_HOST, node, inputs, None)
        elif k in user_outputs and isinstance(node.meta.get("val"), torch.Tensor):
            if node in first:  # returned twice: the same tensor twice
                views.append((k, first[node], ()))
                continue
            first[node] = k
            root, steps = _view_chain(node, host)
            if steps:
                views.append((k, root, steps))
            else:
                plan[k] = from_jit(node, laid_out=True)
                jit_index[k] = plan[k][1]
        else:
            plan[k] = from_jit(node)
            jit_index[k] = plan[k][1]
    updates = set(nodes[: user_outputs.start])  # new values of mutated inputs
    for k, root, steps in views:
        if root in updates:  # a view of a mutated input: aot_autograd makes it from the input itself
            plan[k] = from_jit(nodes[k], laid_out=True)
            jit_index[k] = plan[k][1]
            continue
        if not isinstance(root, torch.fx.Node):
            index = root  # an earlier output
        elif root.op == "placeholder":
            index = len(plan)
            plan.append((FROM_ARG, inputs[root], None, None))
        elif root in first and plan[first[root]] is not None and plan[first[root]][0] is FROM_JIT:
            index = first[root]
        else:
            index = hidden.get(root)
            if index is None:
                index = hidden[root] = len(plan)
                plan.append(from_jit(root, laid_out=True))
        plan[k] = (AS_VIEW, index, steps, inputs)
    return plan, jit_nodes, jit_index, bool(views)


def jit_layouts(plan: list, n: int) -> tuple | None:
    """Per value the jitted program returns, the memory order it is returned in (transposed into it at
    the end of the program: `wrap_laid_out` makes the tensor), or None; None when all are row-major."""
    layouts: list = [None] * n
    for kind, a, _, place in plan:
        if kind is FROM_JIT and type(place) is tuple:
            layouts[a] = place
    return tuple(layouts) if any(o is not None for o in layouts) else None


def wrap_specs(plan: list) -> list:
    """Per plan entry: the (shape, dtype) a result of the jitted program becomes a tpu tensor with, when
    that is all `to_caller` would do (a row-major tpu tensor of static shape), else None."""
    specs: list = []
    for kind, _, spec, place in plan:
        static = kind is FROM_JIT and place is _DEVICE and spec is not None and spec[0] is not None
        specs.append(spec if static and all(type(s) is int for s in spec[0]) else None)
    return specs


def _fake_order(val) -> tuple | None:
    """The memory order of a traced tensor whose strides are a dense permutation other than row-major
    (`(x.t() * 2)` keeps the transposed layout, as eager does), or None (row-major, not dense, symbolic)."""
    if not isinstance(val, torch.Tensor) or val.dim() < 2:
        return None
    shape, stride = tuple(val.shape), tuple(val.stride())
    if not all(type(s) is int for s in shape + stride):
        return None
    if not guard_or_false(val.storage_offset() == 0):
        return None
    return memory_order(shape, stride)


def _placement(node) -> tuple:
    """(spec, place) of a value the jitted program returns: a number's Python type, or a tensor's traced
    (shape, dtype) and whether eager has it on the device or on the host."""
    number = _number_type(node.meta.get("val"))
    if number is not None:
        return number, _NUMBER
    return spec_of(node.meta.get("val")), (_HOST if _belongs_on_cpu(node) else _DEVICE)


def _number_type(val):
    """The Python type a traced number (a SymInt, SymFloat, SymBool or a plain number) comes back as."""
    if isinstance(val, bool | torch.SymBool):
        return bool
    if isinstance(val, int | torch.SymInt):
        return int
    if isinstance(val, float | torch.SymFloat):
        return float
    return None


def _computable_on_host(node, memo: dict) -> bool:
    """Whether `node` is an input, or a number computed from inputs only (a size: `sym_size` of an
    input, arithmetic on the graph's size inputs), so the host can compute it without the graph."""
    known = memo.get(node)
    if known is None:
        if node.op == "placeholder":
            known = True
        else:
            known = (
                node.op == "call_function"
                and _number_type(node.meta.get("val")) is not None
                and all(_computable_on_host(n, memo) for n in node.all_input_nodes)
            )
        memo[node] = known
    return known


def evaluate_on_host(node, args: tuple, inputs: dict):
    """The value of a node `_computable_on_host` accepted, for this call's `args`."""
    if node.op == "placeholder":
        return args[inputs[node]]
    a, kw = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: evaluate_on_host(n, args, inputs))
    return node.target(*a, **kw)


def _is_view_op(target) -> bool:
    return isinstance(target, torch._ops.OpOverload) and target.is_view


def _view_chain(node, host: dict) -> tuple:
    """(root, steps): the value `node` is a view of and the view ops that make it from there, each
    (op, its other arguments, kwargs), in order; no steps when `node` is no view. A `getitem` of a
    multi-output view (`split`, `unbind`) is a step too. A view with an argument only the device knows
    (a size computed in the graph) ends the chain: it becomes the root."""
    steps = []
    root = node
    while root.op == "call_function":
        if root.target is operator.getitem:
            parent = root.args[0]
            if not (isinstance(parent, torch.fx.Node) and _is_view_op(parent.target)):
                break
            step, base = (operator.getitem, root.args[1:], {}), parent
        elif _is_view_op(root.target) and isinstance(root.args[0], torch.fx.Node):
            step, base = (root.target, root.args[1:], root.kwargs), root.args[0]
        else:
            break
        if not all(_computable_on_host(n, host) for n in _arg_nodes(step[1:])):
            break
        steps.append(step)
        root = base
    if steps and root.op != "placeholder" and not _laid_out_as_wrapped(root.meta.get("val")):
        return node, []  # views planned on strides our fresh (contiguous) result would not have
    return root, steps[::-1]


def _laid_out_as_wrapped(val) -> bool:
    """Whether a traced tensor has the layout of the tensor its result becomes: contiguous or a dense
    permutation (`_fake_order`), at offset 0 (views replayed on it then pick the elements the graph's
    views picked)."""
    if not isinstance(val, torch.Tensor):
        return False
    if _fake_order(val) is not None:
        return True
    return is_contiguous_or_false(val) and guard_or_false(val.storage_offset() == 0)


def _arg_nodes(args) -> list:
    found: list = []
    torch.fx.node.map_arg(args, found.append)
    return found


def replay_views(base: torch.Tensor, steps: tuple, args: tuple, inputs: dict):
    """`base` through the view ops of `_view_chain`, with this call's sizes: a view of its storage."""
    out = base
    for op, rest, kwargs in steps:
        if op is operator.getitem:
            out = out[rest[0]]
            continue
        rest, kwargs = torch.fx.node.map_arg((rest, kwargs), lambda n: evaluate_on_host(n, args, inputs))
        out = op(out, *rest, **kwargs)
    return out


def to_caller(value, spec, place):
    """A result of the jitted program as eager has it: a tpu tensor of the traced dtype, a CPU tensor,
    or a Python number (`spec` its type; aot_autograd requires Python sizes)."""
    if place is _NUMBER:
        return spec(value)
    if not (hasattr(value, "dtype") and hasattr(value, "shape")):
        return value
    dtype = spec[1] if spec else None
    if place is _DEVICE:
        return wrap(value, dtype)
    if type(place) is tuple:  # laid out in this memory order (transposed into it by the program)
        return wrap_laid_out(value, dtype or value.dtype, place)
    from hf_tpu.runtime.buffers.placement import jax_to_host

    host = jax_to_host(value)
    return host if dtype is None or host.dtype == dtype else host.to(dtype)
