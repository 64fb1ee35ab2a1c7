"""Functional collectives inside `torch.compile(backend="tpu")`: the whole graph as one SPMD program.

`torch.distributed._functional_collectives` reach a compiled graph as `_c10d_functional` ops
(`all_reduce`, `all_gather_into_tensor`, `reduce_scatter_tensor`, `all_to_all_single`, `broadcast`, their
coalesced forms, `wait_tensor`). Their lowerings here are the JAX collectives tpu_dist's eager programs use
(`programs.py`), over the axis of the group's mesh (one chip per process). They only mean something inside
that mesh, so a graph holding them runs as `jit(shard_map(graph))` over the group (`SpmdProgram`): each
process's inputs are its blocks of global arrays, and the graph's own ops, the collectives included,
compile into one executable that every process of the group runs. Before each call the ranks agree on the
inputs' shapes and dtypes (agreement.py), so a mismatch is a clear error rather than an abort.

A graph whose collectives span several groups runs as one program too when those groups are the lines of
one grid covering every rank (a 2-D DeviceMesh's rows and columns: unified context parallelism, FSDP + TP):
the mesh is that grid, one axis per group stride, and each collective reduces over its group's axis. Other
groups, and uneven all_to_all splits (each rank would compile a different program), are left to the compile
backend's op-by-op path (`spmd_plan` says why).
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from hf_tpu.runtime.buffers import platform
from hf_tpu.runtime.distributed import programs
from hf_tpu.runtime.lowerings.table import lowers

NAMESPACE = "_c10d_functional"
# how many SPMD executables were compiled and how many calls ran them (tests and users read these)
stats = {"compiled": 0, "calls": 0}
_stats_lock = threading.Lock()


def _kind(dtype) -> str:
    jnp = platform.jax().numpy
    if dtype == jnp.bool_:
        return "bool"
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return "complex"
    if jnp.issubdtype(dtype, jnp.floating):
        return "float"
    return "int"


def _group(group_name):
    from torch._C._distributed_c10d import _resolve_process_group

    return _resolve_process_group(str(group_name))


def _ranks(group_name) -> tuple:
    pg = _group(group_name)
    ranks = getattr(pg, "_ranks", None)
    return tuple(ranks) if ranks is not None else tuple(dist.get_process_group_ranks(pg))


def _op(reduce_op: str) -> str:
    op = str(reduce_op).lower()
    if op not in ("sum", "avg", "max", "min", "product", "band", "bor", "bxor"):
        raise ValueError(f"tpu_dist compiled all_reduce: reduce op {reduce_op!r} is not supported in a graph")
    return op


# the mesh axis of each group (by its ranks) while an SpmdProgram over a grid traces its graph
_tracing = threading.local()


def _axis(group_name) -> str:
    """The mesh axis a collective over `group_name` runs over in the program being traced."""
    axes = getattr(_tracing, "axes", None)
    return programs.AXIS if not axes else axes[_ranks(group_name)]


# -- lowerings (traced inside the group's shard_map: the group's axis is bound) -------------------------
def _all_reduce(x, reduce_op, group_name):
    g = len(_ranks(group_name))
    return programs.all_reduce_body(_op(reduce_op), _kind(x.dtype), g, None, _axis(group_name))(x[None])[0]


def _all_gather(x, group_size, group_name):
    y = programs.all_gather_body(_axis(group_name))(x[None])[0]  # (G, *x.shape)
    return y.reshape((y.shape[0] * x.shape[0], *x.shape[1:])) if x.ndim else y


def _reduce_scatter(x, reduce_op, group_size, group_name):
    g = len(_ranks(group_name))
    body = programs.reduce_scatter_body(_op(reduce_op), _kind(x.dtype), g, None, _axis(group_name))
    return body(x[None])[0]


@lowers(f"{NAMESPACE}::all_reduce", graph=True)
def all_reduce(x, reduce_op, group_name):
    return _all_reduce(x, reduce_op, group_name)


@lowers(f"{NAMESPACE}::all_reduce_coalesced", graph=True)
def all_reduce_coalesced(xs, reduce_op, group_name):
    return [_all_reduce(x, reduce_op, group_name) for x in xs]


@lowers(f"{NAMESPACE}::all_gather_into_tensor", graph=True)
def all_gather_into_tensor(x, group_size, group_name):
    return _all_gather(x, group_size, group_name)


@lowers(f"{NAMESPACE}::all_gather_into_tensor_coalesced", graph=True)
def all_gather_into_tensor_coalesced(xs, group_size, group_name):
    return [_all_gather(x, group_size, group_name) for x in xs]


@lowers(f"{NAMESPACE}::reduce_scatter_tensor", graph=True)
def reduce_scatter_tensor(x, reduce_op, group_size, group_name):
    return _reduce_scatter(x, reduce_op, group_size, group_name)


@lowers(f"{NAMESPACE}::reduce_scatter_tensor_coalesced", graph=True)
def reduce_scatter_tensor_coalesced(xs, reduce_op, group_size, group_name):
    return [_reduce_scatter(x, reduce_op, group_size, group_name) for x in xs]


@lowers(f"{NAMESPACE}::all_to_all_single", graph=True)
def all_to_all_single(x, output_split_sizes, input_split_sizes, group_name):
    g = len(_ranks(group_name))
    y = programs.all_to_all_body(_axis(group_name))(x.reshape((1, g, x.shape[0] // g, *x.shape[1:])))[0]
    return y.reshape(x.shape)


@lowers(f"{NAMESPACE}::broadcast", graph=True)
def broadcast(x, src, group_name):
    return programs.pick_body(int(src), _axis(group_name))(x[None])[0]


@lowers(f"{NAMESPACE}::wait_tensor", graph=True)
def wait_tensor(x):
    return x  # inside one program the collective's result is simply there


# -- which graphs run as one SPMD program ------------------------------------------------------------
def _collective_nodes(gm: torch.fx.GraphModule):
    for sub in gm.modules():
        if not isinstance(sub, torch.fx.GraphModule):
            continue
        for node in sub.graph.nodes:
            target = node.target
            if node.op == "call_function" and isinstance(target, torch._ops.OpOverload):
                if target.namespace == NAMESPACE:
                    yield node


@dataclass(frozen=True)
class SpmdPlan:
    """Where a graph's collectives run: `mesh` is the group's ranks (one group) or a `programs.Grid` (several
    groups, `axes` giving each group's mesh axis by its ranks); `agree_on` names the group whose ranks agree
    on the inputs before each call (every rank of the mesh)."""

    mesh: tuple | programs.Grid
    agree_on: str
    axes: dict = field(default_factory=dict, compare=False, hash=False)


def spmd_plan(gm: torch.fx.GraphModule) -> tuple[SpmdPlan | None, str | None]:
    """(the plan of a graph that runs as one SPMD program, None); (None, None) for a graph without
    collectives; (None, why) when its collectives cannot be one program (the compile backend then runs the
    graph op by op, where every collective works)."""
    groups = {}
    for node in _collective_nodes(gm):
        name = node.target.name()
        if node.target is torch.ops._c10d_functional.wait_tensor.default:
            continue
        group_name = node.args[-1] if node.args else node.kwargs.get("group_name")
        try:
            ranks = _ranks(group_name)
        except Exception as exc:  # noqa: BLE001
            return None, f"{name} (group {group_name!r} unknown: {exc})"
        if "all_to_all_single" in name:
            splits = {int(s) for s in (*node.args[1], *node.args[2])}
            if len(splits) > 1:
                return None, f"{name} (uneven split sizes: every rank would compile its own program)"
        groups[ranks] = str(group_name)
    if not groups:
        return None, None
    me = platform.jax().process_index()
    outside = [list(r) for r in groups if me not in r]
    if outside:
        return (
            None,
            f"{NAMESPACE} collectives over group {outside[0]}, which this process (rank {me}) is not in",
        )
    if len(groups) == 1:
        ((ranks, group_name),) = groups.items()
        return SpmdPlan(ranks, group_name), None
    grid, axes, why = grid_of(tuple(groups), me, dist.get_world_size())
    if grid is None:
        return None, f"{NAMESPACE} collectives over several groups ({sorted(groups)}) in one graph: {why}"
    return SpmdPlan(grid, _world_group_name(), axes), None


def grid_of(groups: tuple, me: int, world: int) -> tuple[programs.Grid | None, dict, str | None]:
    """The grid whose lines are `groups` (this rank's groups), as a DeviceMesh over all `world` ranks lays
    them out row-major: each group an ascending run of ranks with one stride; the grid's axes have strides
    1, n1, n1*n2, ... for sizes n1, n2, ... whose product is `world`; a group along several consecutive
    axes (a flattened mesh dimension, the whole world) runs over those axes together.
    Returns (grid, {group ranks: its axis name or tuple of names}, None), or (None, {}, why not)."""
    runs = []
    for ranks in groups:
        stride = ranks[1] - ranks[0] if len(ranks) > 1 else 0
        if stride <= 0 or any(b - a != stride for a, b in zip(ranks, ranks[1:])):
            return (
                None,
                {},
                f"group {list(ranks)} is not an ascending run of two or more ranks with one stride",
            )
        if ranks[0] != me - (me // stride) % len(ranks) * stride:
            return None, {}, f"group {list(ranks)} is not a line of a row-major grid through rank {me}"
        runs.append((stride, len(ranks), ranks))
    # the axes: from stride 1 up, each the shortest run that starts where the previous axis ends
    axes_sizes = []
    expected = 1
    while expected < world:
        sizes = [n for stride, n, _ in runs if stride == expected]
        if not sizes:
            return None, {}, "the groups are not the rows and columns of one grid of ranks"
        axes_sizes.append((expected, min(sizes)))
        expected *= min(sizes)
    if expected != world:
        return None, {}, f"the grid of the groups does not hold exactly the {world} ranks"
    names = {stride: f"stride{stride}" for stride, _ in axes_sizes}
    axis_at = {stride: k for k, (stride, _) in enumerate(axes_sizes)}
    axes = {}
    for stride, n, ranks in runs:
        first = k = axis_at.get(stride, len(axes_sizes))
        covered = 1
        while covered < n and k < len(axes_sizes):
            covered *= axes_sizes[k][1]
            k += 1
        if covered != n:
            return None, {}, f"group {list(ranks)} does not cover whole axes of the grid"
        span = [names[axes_sizes[i][0]] for i in reversed(range(first, k))]  # row-major: major axis first
        axes[ranks] = span[0] if len(span) == 1 else tuple(span)
    shape = tuple(n for _, n in reversed(axes_sizes))
    return (
        programs.Grid(tuple(range(world)), shape, tuple(names[s_] for s_, _ in reversed(axes_sizes))),
        axes,
        None,
    )


def _world_group_name() -> str:
    return dist.group.WORLD.group_name


class SpmdProgram:
    """`fn(keys, *arrays)` (a graph's interpreter) as `jit(shard_map(fn))` over the plan's mesh: called
    with this process's values, returns this process's results. `static` are the argument indices (of
    fn's signature) that are Python values, compiled in; `plan` is `spmd_plan`'s."""

    def __init__(self, fn, plan: SpmdPlan, static: tuple, name: str) -> None:
        self._fn = fn
        self._ranks, self._group_name, self._axes = plan.mesh, plan.agree_on, plan.axes
        self._static = frozenset(static)
        self._name = name
        self._compiled: dict = {}

    def _cache_size(self) -> int:  # read like jax.jit's by the compile backend's recompile warning
        return len(self._compiled)

    @contextlib.contextmanager
    def _axes_bound(self):
        """The plan's axis per group, for the lowerings that run while JAX traces the graph."""
        _tracing.axes = self._axes
        try:
            yield
        finally:
            _tracing.axes = None

    def _agree(self, dynamic: list) -> None:
        """Every rank's inputs must have equal shapes and dtypes (else each would compile its own program
        and the collectives inside would abort or hang): a clear error on every rank instead."""
        agreement = getattr(_group(self._group_name), "_agreement", None)
        if agreement is None or not agreement.active:
            return
        what = f"compiled graph {self._name}"
        mine = {
            "input_shapes": [list(a.shape) for a in dynamic],
            "input_dtypes": [str(a.dtype) for a in dynamic],
        }
        if isinstance(self._ranks, programs.Grid):  # each rank checked its groups are lines of this grid
            mine["grid"] = f"{self._ranks.shape} over axes {self._ranks.axes}"
        sigs = agreement.exchange(what, mine)
        differ = [k for k in ("op_name", *mine) if len({str(s.get(k)) for s in sigs}) > 1]
        if differ:
            raise agreement.mismatch(
                what, sigs, f"{' and '.join(k.replace('_', ' ') for k in differ)} differ"
            )

    def _program(self, args: tuple):
        """(the program for these arguments' statics, shapes and dtypes, its results' shapes, the dynamic
        arguments)."""
        statics = tuple((i, a) for i, a in enumerate(args) if i in self._static or a is None)
        dynamic_at = tuple(i for i, a in enumerate(args) if not (i in self._static or a is None))
        dynamic = [args[i] for i in dynamic_at]
        shapes = tuple(tuple(a.shape) for a in dynamic)
        key = (statics, dynamic_at, tuple(zip(shapes, (str(a.dtype) for a in dynamic))))
        entry = self._compiled.get(key)
        if entry is None:
            fn, n_args = self._fn, len(args)
            fixed = dict(statics)

            def values_fn(*values):
                full, it = [], iter(values)
                for i in range(n_args):
                    full.append(fixed[i] if i in fixed else next(it))
                return tuple(fn(*full))

            entry = self._compiled[key] = programs.spmd(self._ranks, values_fn, shapes)
            with _stats_lock:
                stats["compiled"] += 1
        return *entry, dynamic

    def __call__(self, *args):
        program, out_shapes, dynamic = self._program(args)
        self._agree(dynamic)
        with self._axes_bound():  # read by the lowerings if this call traces the graph
            outs = program(*[programs.flat_global(self._ranks, a) for a in dynamic])
        with _stats_lock:
            stats["calls"] += 1
        return tuple(programs.local_result(o, s) for o, s in zip(outs, out_shapes))

    def lower(self, *args):
        """As `jax.jit(...).lower`: the executable for these (abstract) arguments, over the group's mesh
        (`GraphProgram.compiled_text` shows its HLO, collectives included)."""
        program, _, dynamic = self._program(args)
        with self._axes_bound():
            return program.lower(
                *[programs.global_struct(self._ranks, tuple(a.shape), a.dtype) for a in dynamic]
            )
