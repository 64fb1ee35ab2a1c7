"""`torch.compile(model, backend="tpu")`: ATen FX graphs -> the same lowerings -> one `jax.jit`.

TorchDynamo captures the graph, `aot_autograd` lowers it to functional ATen (forward and backward),
and each graph is interpreted with the lowering table inside a single `jax.jit`, cached per input
shapes/dtypes. Parameters enter as the device buffers they already are (no per-call copies). A graph
that holds an op without a pure-JAX lowering runs op by op in tpu eager instead (one warning naming the
op; an error under `HF_TPU_COMPILE_STRICT=1`). Control flow (`torch.cond`, `while_loop`, `map`, `scan`)
lowers to its `lax` counterpart, its subgraphs interpreted the same way (`graph_control_flow`).

Outputs land on the device their traced value names (a `.cpu()` result or a CPU factory comes back as
a CPU tensor, as in eager), and a graph that touches no tpu tensor runs in PyTorch on CPU, untouched.
They alias as in eager (`plan_outputs`): an input returned comes back as that very tensor, a view of
another output or of an intermediate as a view of its storage, and a size as a Python number.

Random ops recomputed by activation checkpointing come wrapped in `run_and_save_rng_state` (forward)
and `run_with_rng_state` (backward): the saved state is the device generator's state at the draw, in
`torch.tpu.get_rng_state()`'s format, so the backward replays the very same key, compiled or op by op.

Inputs the graph overwrites whole (a StaticCache's KV buffer, BatchNorm running stats, optimizer state)
are donated to XLA so it updates them in place instead of copying (`HF_TPU_DONATE=0` turns this off).
"""

from __future__ import annotations

import contextlib
import logging
import operator
import os
import sys
import threading
import warnings
import weakref

import torch
from torch._dynamo.backends.common import aot_autograd

from hf_tpu.runtime.buffers import executables, platform
from hf_tpu.runtime.buffers.storage import REGISTRY
from hf_tpu.runtime.buffers.threads import DONATION_LOCK, update_lock
from hf_tpu.runtime.compile import control_flow as control_flow
from hf_tpu.runtime.compile import dynamo_prep, strided_reads
from hf_tpu.runtime.compile.graph_outputs import (
    AS_VIEW,
    FROM_ARG,
    FROM_JIT,
    ON_HOST,
    evaluate_on_host,
    jit_layouts,
    output_nodes,
    plan_outputs,
    replay_views,
    spec_of,
    to_caller,
    user_outputs,
    wrap_specs,
)
from hf_tpu.runtime.compile.graph_rng import (
    GRAPHSAFE_RNG,
    SAVE_RNG,
    WITH_RNG,
    eager_run_and_save_rng_state,
    eager_run_with_rng_state,
    key_of_state,
    state_of_draw,
)
from hf_tpu.runtime.distributed import compiled as spmd
from hf_tpu.runtime.execution.dispatch import op_failure
from hf_tpu.runtime.execution.out_specs import cast_like
from hf_tpu.runtime.execution.signature import Signature
from hf_tpu.runtime.launch import rng
from hf_tpu.runtime.lowerings.table import graph_lowering
from hf_tpu.runtime.tensors.graph_inputs import array_of, arrays_of
from hf_tpu.runtime.tensors.tensor import RefProbe, to_jax, wrap_spec, write

log = logging.getLogger("hf_tpu.compile")
# aot_autograd threads ops with side effects (`_linalg_check_errors`) through a token: (token, *outputs)
WITH_EFFECTS = torch.ops.higher_order.with_effects
_WRAPPERS = (SAVE_RNG, WITH_RNG, WITH_EFFECTS)  # higher-order ops `interpret` handles itself
_warned: set = set()


_lock = threading.Lock()
_RECOMPILE_WARN_AT = 8
_UNUSABLE_DONATION = "Some donated buffers were not usable"


class GraphLoweringMissing(NotImplementedError):
    pass


def _decompositions() -> dict:
    from torch._decomp import core_aten_decompositions

    table = dict(core_aten_decompositions())
    # keep ops we lower whole (one fused XLA op beats its decomposition)
    from hf_tpu.runtime.lowerings.table import GRAPH_TABLE, TABLE

    for op in list(table):
        if op in TABLE or op in GRAPH_TABLE:
            del table[op]
    # torch's decomposition of the CPU flash-attention forward saves the attention weights where its
    # backward (kept whole) expects the logsumexp: wrong q/k/v gradients in CPU graphs (torch 2.13, any
    # backend using core_aten_decompositions). CPU-only graphs run in PyTorch, so keep the op whole.
    table.pop(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default, None)
    from hf_tpu.runtime.lowerings import attention

    table[torch.ops.aten.scaled_dot_product_attention.default] = attention.graph_decomposition
    return table


def _spec(node) -> tuple | None:
    val = node.meta.get("val")
    if isinstance(val, list | tuple):
        return tuple(spec_of(v) for v in val)
    return spec_of(val)


class GraphProgram:
    """One ATen FX graph interpreted with the lowering table; `run(*tensors)` executes it jitted."""

    def __init__(
        self, gm: torch.fx.GraphModule, name: str, donation_plan: tuple = (), user_outputs: range = range(0)
    ) -> None:
        self.gm = gm
        self.name = name
        self._n_outputs = len(output_nodes(gm))  # what the caller sees (`_in_graph_mutations` adds more)
        # inputs the graph itself overwrites (`copy_` into a placeholder): their new values become extra
        # outputs, stored into the inputs by `__call__` (donated where safe), not by a copy_ per input
        written = _in_graph_mutations(gm)
        donation_plan = tuple(donation_plan) + written
        # as_strided of views reads their storage's root; what the values cannot answer runs op by op
        self.missing = strided_reads.resolve(gm) + self._find_missing()
        # (input index, index of the output that becomes its new value): see `donation_plan`
        self.donation_plan = donation_plan
        self.mutations = donation_plan  # the same pairs, kept when donation is turned off
        # the pairs nobody but `__call__` stores (aot_autograd's write-back stores the others)
        self._written = written
        # functional collectives: the graph runs as one SPMD program over their group (distributed/compiled.py)
        self._spmd, why_not = spmd.spmd_plan(gm)
        if why_not:
            self.missing.append(why_not)
        if self._spmd is not None:
            self.donation_plan = ()  # inputs become blocks of global arrays: no buffer to donate
        self._donating: dict = {}  # donated input indices -> jax.jit with those donate_argnums
        self.n_random = _count_draws(gm)
        # how each output is produced, and the nodes the jitted program returns (`plan_outputs`)
        self._plan, self._jit_nodes, self._jit_index, self._has_views = plan_outputs(gm, user_outputs)
        if written:  # returned first: XLA gives a donated buffer to the first output of its shape and dtype
            self._returns_first([self._jit_index[k] for _, k in written])
        # the outputs returned transposed into the memory order their fake tensors have (`jit_layouts`)
        self._jit_layouts = jit_layouts(self._plan, len(self._jit_nodes))
        self._wrap_specs = wrap_specs(self._plan)
        self._jitted = None
        self._static: tuple = ()
        self._storm_warned = False
        self._warmed = False  # the first call compiled ahead, outside DONATION_LOCK (`_compile_ahead`)
        self._example: tuple | None = (
            None  # the first call's (keys, *inputs) as abstract values (`compiled_text`)
        )
        PROGRAMS.add(self)
        if self.missing:
            self._prepare_op_by_op()

    def _returns_first(self, first: list) -> None:
        """Reorder the values the jitted program returns: those at indices `first` first, in that order."""
        order = first + [j for j in range(len(self._jit_nodes)) if j not in set(first)]
        moved = {old: new for new, old in enumerate(order)}
        self._jit_nodes = [self._jit_nodes[j] for j in order]
        self._jit_index = {k: moved[j] for k, j in self._jit_index.items()}
        self._plan = [
            (kind, moved[a], b, c) if kind is FROM_JIT else (kind, a, b, c) for kind, a, b, c in self._plan
        ]

    def _prepare_op_by_op(self) -> None:
        """For op-by-op execution: eager outputs are contiguous where the traced fake tensors may not
        have been, so a `view` the graph planned on fake strides becomes a `reshape` (view when it can);
        the RNG wrappers, which PyTorch implements only for CPU/CUDA/XPU/HPU, get tpu-aware versions."""
        aten = torch.ops.aten
        eager = {
            aten.view.default: aten.reshape.default,
            aten._unsafe_view.default: aten.reshape.default,
            SAVE_RNG: eager_run_and_save_rng_state,
            WITH_RNG: eager_run_with_rng_state,
        }
        for gm in self.gm.modules():  # the graph and the subgraphs of its control flow
            if not isinstance(gm, torch.fx.GraphModule):
                continue
            for node in gm.graph.nodes:
                if node.op == "call_function" and node.target in eager:
                    node.target = eager[node.target]
            gm.recompile()

    def _find_missing(self, gm: torch.fx.GraphModule | None = None, repeated: bool = False) -> list[str]:
        """The ops of `gm` (and of its control flow's subgraphs) without a graph lowering; `repeated`
        for a loop body (its random ops fold in the iteration number, `_evaluate`)."""
        missing = []
        for node in (gm or self.gm).graph.nodes:
            if node.op != "call_function":
                continue
            if node.target is GRAPHSAFE_RNG:
                raise GraphLoweringMissing(
                    f"hf_tpu compile: graph {self.name} uses graphsafe_run_with_rng_state, which needs a "
                    "torch.Generator for the tpu device; do not register 'tpu' with "
                    "register_graphsafe_rng_device_type"
                )
            if node.target in control_flow.CONTROL_FLOW:
                why = control_flow.unsupported(node)
                if why is not None:
                    missing.append(f"{node.target} ({why})")
                    continue
                inner = repeated or control_flow.repeats_body(node.target)
                for sub in control_flow.subgraphs(node):
                    missing += self._find_missing(sub, inner)
                continue
            if control_flow.is_higher_order(node.target) and node.target not in _WRAPPERS:
                missing.append(str(node.target))  # flex_attention, auto_functionalized, ...: run eagerly
                continue
            target = _wrapped_op(node)
            if control_flow.is_higher_order(target):  # `torch._higher_order_ops.print` kept for its effect
                missing.append(str(target))
                continue
            if not isinstance(target, torch._ops.OpOverload):
                continue  # Python arithmetic on sizes, getitem: evaluated as is
            lowering = graph_lowering(target)
            if lowering is None:
                missing.append(str(target))
            elif repeated and lowering.random and target is not node.target:
                # a checkpointed draw's saved RNG state names no iteration: its replay could not match
                missing.append(f"{target} (random, checkpointed in a loop body)")
        return missing

    def interpret(self, keys, *arrays):
        """Evaluate the graph on JAX values (traced under jit)."""
        draws = iter(range(self.n_random))  # the draw index of each random op, in graph order
        return self._evaluate(self.gm, list(arrays), keys, draws)

    def _evaluate(self, gm: torch.fx.GraphModule, arrays: list, keys, draws, iterations: tuple = ()):
        """`gm` (this program's graph, or a subgraph of its control flow) on JAX values: the values the
        jitted program returns for the top graph, the outputs as a list (or one value) for a subgraph.
        `iterations`: the iteration numbers of the loop bodies `gm` runs in, folded into random keys."""
        env = {}
        args = iter(arrays)

        def fetch(a):
            if isinstance(a, torch.fx.Node):
                return env[a]
            if isinstance(a, list | tuple):
                return [fetch(x) for x in a]
            return a

        def run(subgraph, values, iteration=None):
            inner = iterations if iteration is None else (*iterations, iteration)
            return self._evaluate(subgraph, list(values), keys, draws, inner)

        def key_of(i: int):
            key = rng.key_from(keys, i)
            for n in iterations:  # a loop body: a new key every iteration
                key = platform.jax().random.fold_in(key, n)
            return key

        for node in gm.graph.nodes:
            if node.op == "placeholder":
                env[node] = next(args)
            elif node.op == "call_function":
                target = node.target
                node_args = [fetch(a) for a in node.args]
                kwargs = {k: fetch(v) for k, v in node.kwargs.items()}
                if target is SAVE_RNG:  # (state, op(*args)): the state replays this draw's key
                    i = next(draws)
                    out = self._lower(node_args[0], node_args[1:], kwargs, key_of(i), node)
                    env[node] = (state_of_draw(keys, i), out)
                elif target is WITH_RNG:  # op(*args) with the key of a saved state
                    key = key_of_state(node_args[0])
                    env[node] = self._lower(node_args[1], node_args[2:], kwargs, key, node)
                elif target is WITH_EFFECTS:  # (token, *op(*args)): an op kept in order for its effect
                    token, op, *rest = node_args
                    out = self._apply(op, rest, kwargs, None)  # its outputs have no traced value to cast to
                    env[node] = (token,) + (
                        () if out is None else tuple(out) if isinstance(out, list | tuple) else (out,)
                    )
                elif target in control_flow.CONTROL_FLOW:  # torch.cond, while_loop, map: their subgraphs
                    try:
                        out = control_flow.lower(target, run, node_args)
                    except Exception as exc:  # noqa: BLE001 - name the node
                        raise RuntimeError(
                            f"hf_tpu compile: {target} failed in graph {self.name}: {exc}"
                        ) from exc
                    env[node] = cast_like(platform.jax().numpy, out, _spec(node))
                elif not isinstance(target, torch._ops.OpOverload):
                    env[node] = target(*node_args, **kwargs)
                else:
                    key = key_of(next(draws)) if _draws_key(node) else None
                    env[node] = self._lower(target, node_args, kwargs, key, node)
            elif node.op == "output":
                if gm is not self.gm:
                    return fetch(node.args[0])
                if self._jit_layouts is None:
                    return tuple(env[o] for o in self._jit_nodes)
                jnp = platform.jax().numpy
                return tuple(
                    env[o] if order is None else jnp.transpose(env[o], order)
                    for o, order in zip(self._jit_nodes, self._jit_layouts)
                )
            elif node.op == "get_attr":  # a constant: a tpu tensor, or a CPU one (`torch.tensor([...])`)
                value = getattr(gm, node.target)
                if isinstance(value, torch.Tensor):
                    value = array_of(value)
                env[node] = value  # a subgraph of control flow stays a GraphModule
        raise RuntimeError("graph without output")

    def _lower(self, op, args: list, kwargs: dict, key, node):
        """`op` applied through its lowering (`_apply`), cast to the traced result of `node`."""
        return cast_like(platform.jax().numpy, self._apply(op, args, kwargs, key), _result_spec(node))

    def _apply(self, op, args: list, kwargs: dict, key):
        """`op` applied through its lowering (given `key` first when it is random); errors name the graph."""
        lowering = graph_lowering(op)
        full = [_devicefree(v) for v in Signature(op).normalize(tuple(args), kwargs)]
        if lowering.random:
            full = [key, *full]
        try:
            out = lowering.fn(*full)
        except Exception as exc:  # noqa: BLE001 - name the node
            raise RuntimeError(f"hf_tpu compile: lowering {op} failed in graph {self.name}: {exc}") from exc
        return out

    def __call__(self, *args):
        if self.missing:  # tpu eager, op by op
            outs = self.gm(*args)
            for i, k in self._written:
                args[i].copy_(outs[k])
            return outs[: self._n_outputs] if self._written else outs
        executables.collect_if_due()  # a safe point: no JAX call under way
        jax = platform.jax()
        if self._jitted is None:
            # non-tensor inputs (the sizes of a graph Dynamo made dynamic) are static: lowerings need
            # concrete ints for shapes, and XLA compiles per shape anyway
            self._static = tuple(i + 1 for i, a in enumerate(args) if not isinstance(a, torch.Tensor))
            if self._spmd is not None:
                self._jitted = spmd.SpmdProgram(self.interpret, self._spmd, self._static, self.name)
            else:
                self._jitted = jax.jit(self.interpret, static_argnums=self._static)
        if _ARRAY[0] is None:
            _ARRAY[0] = type(jax.numpy.zeros(()))
        arrays = arrays_of(args)
        keys = rng.next_material(self.n_random) if self.n_random else None
        if self._example is None:
            self._example = _abstract(keys, arrays)
        plan = self.donation_plan if _donate_enabled() else ()
        if plan and not self._warmed:
            self._compile_ahead(args, keys, arrays)
            plan = self.donation_plan
        # donating: from the check until the payloads hold the results, so that another thread reads
        # either the old array (and its reference stops the donation) or the new one (tensor._array_of).
        # With several threads, a graph that updates its inputs reads and stores them as one step, as
        # eager in-place ops do (else two threads' `count += 1` from one old value lose an update)
        lock = update_lock() if self.mutations else contextlib.nullcontext()
        shared = lock is DONATION_LOCK
        with DONATION_LOCK if plan or shared else contextlib.nullcontext():
            if shared:  # read again under the lock: another thread may have stored since
                arrays = [to_jax(a) if _on_tpu(a) else old for a, old in zip(args, arrays)]
            donated = self._donatable(args, arrays) if plan else ()
            try:
                if donated:
                    outs = self._donating_fn(donated)(keys, *arrays)
                else:
                    outs = self._jitted(keys, *arrays)
            except Exception as exc:  # noqa: BLE001
                raise op_failure(f"compiled graph {self.name}", list(args), [0] * len(args), exc) from exc
            # a donated input's old buffer is gone: point its storage at the new value now, and return
            # the input itself (an alias) as that "updated value" output, so aot_autograd's write-back
            # `input.copy_(new)` stores the same array again and no second storage holds it (one would
            # have to be swept before the next call could donate the buffer again)
            updated = {}
            for i, k in plan:
                if i in donated:
                    REGISTRY.set_array(args[i].untyped_storage().data_ptr(), outs[self._jit_index[k]])
                    updated[k] = args[i].detach() if k < self._n_outputs else args[i]
            # the rest: those the graph writes itself, and (under the lock) those aot_autograd would
            for i, k in self._written if not shared else self.mutations:
                if k in updated:
                    continue
                if _on_tpu(args[i]):
                    write(args[i], outs[self._jit_index[k]])
                    updated[k] = args[i].detach() if k < self._n_outputs else args[i]
                elif k >= self._n_outputs:  # a CPU input the graph writes: as eager's copy_ would
                    _, a, spec, place = self._plan[k]
                    args[i].copy_(to_caller(outs[a], spec, place))
                    updated[k] = args[i]
        if not self._storm_warned:
            self._check_recompile_storm(args)
        # for synchronize(); not the donated outputs: an extra reference would block their next donation
        kept = {self._jit_index[k] for k in updated}
        platform.last_launched[0] = [o for j, o in enumerate(outs) if j not in kept] if kept else list(outs)
        return self._results(outs, args, updated)

    def compiled_text(self) -> str:
        """The optimized HLO XLA compiled for this graph's first call (inputs' shapes, dtypes and placements):
        where GSPMD put the collectives of a sharded model, for instance."""
        if self._example is None or self._jitted is None:
            raise RuntimeError(f"graph {self.name} has not run yet (or runs op by op): nothing was compiled")
        return self._jitted.lower(*self._example).compile().as_text()

    def _results(self, outs: tuple, args: tuple, updated: dict) -> list:
        """The graph's outputs as eager gives them, from the jitted program's results `outs` (see
        `plan_outputs`): first every value of its own, then the views of those values."""
        results = []
        specs = self._wrap_specs
        for k, (kind, a, b, c) in enumerate(self._plan):
            if kind is FROM_JIT:
                if k in updated:
                    results.append(updated[k])
                elif specs[k] is not None and type(outs[a]) is _ARRAY[0]:  # a tpu tensor of static shape
                    results.append(wrap_spec(outs[a], specs[k]))
                else:
                    results.append(to_caller(outs[a], b, c))
            elif kind is FROM_ARG:
                results.append(args[a])
            elif kind is ON_HOST:
                results.append(evaluate_on_host(a, args, b))
            else:  # a constant, or a view filled in below
                results.append(a)
        if self._has_views:
            for k, (kind, root, steps, inputs) in enumerate(self._plan):
                if kind is AS_VIEW:
                    results[k] = replay_views(results[root], steps, args, inputs)
        return results[: self._n_outputs]

    def _donatable(self, args, arrays) -> tuple[int, ...]:
        """The planned inputs whose buffer nothing else can read after this call, so XLA may reuse it.

        An input qualifies when it is a whole tpu storage (its array is the payload itself, not a view
        read from a larger buffer), no other argument is a view of that storage, and nothing but its
        payload and this call's argument list references the array: not another storage (`copy_` and
        same-dtype `.to` share arrays between storages), a pending DeferAndFuse recording, or user code.
        """
        chosen = []
        for i, _ in self.donation_plan:
            a = args[i]
            if not isinstance(a, torch.Tensor) or a.device.type != "tpu":
                continue
            p = REGISTRY.payload(a.untyped_storage().data_ptr())
            if p is not None and p.array is arrays[i] and _references(arrays, i) == _SOLE_REFERENCES:
                chosen.append(i)
        if not chosen:
            return ()
        ptrs = {args[i].untyped_storage().data_ptr(): i for i in chosen}
        shared = set()
        for j, a in enumerate(args):  # another view of a donated storage among the inputs
            if isinstance(a, torch.Tensor):
                ptr = a.untyped_storage().data_ptr()
                if ptrs.get(ptr, j) != j:
                    shared.add(ptr)
        return tuple(i for ptr, i in ptrs.items() if ptr not in shared)

    def _donating_fn(self, donated: tuple):
        fn = self._donating.get(donated)
        if fn is None:
            jax = platform.jax()
            fn = self._donating[donated] = jax.jit(
                self.interpret, static_argnums=self._static, donate_argnums=tuple(i + 1 for i in donated)
            )
        return fn

    def _compile_ahead(self, args, keys, arrays) -> None:
        """The first call's compile, before taking DONATION_LOCK (other threads read payloads under it):
        lower and compile the executables this call will use; the locked call then finds them in JAX's
        caches. Lowering warns when XLA cannot reuse a donated buffer: donation is then turned off."""
        self._warmed = True
        donated = self._donatable(args, arrays)  # a hint: the locked check decides
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                fn = self._donating_fn(donated) if donated else self._jitted
                fn.lower(keys, *arrays).compile()
        except Exception:  # noqa: BLE001 - the call itself reports it, with the op's context
            return
        for w in caught:
            if _UNUSABLE_DONATION in str(w.message):
                log.debug("graph %s: donation not usable, turned off: %s", self.name, w.message)
                self.donation_plan = ()
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)

    def _check_recompile_storm(self, args) -> None:
        """Warn once when this graph has been compiled for many input signatures.

        Counts the executables JAX holds for the graph (every jit keeps one per signature) instead of
        hashing the inputs' shapes on every call: with ~150 inputs that cost ~0.1-0.2 ms per decode step.
        """
        compiled = sum(_compiled_count(f) for f in (self._jitted, *self._donating.values()))
        if compiled < _RECOMPILE_WARN_AT:
            return
        self._storm_warned = True
        shapes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
        warnings.warn(
            f"hf_tpu compile: graph {self.name} has been compiled for {compiled} different input "
            f"shapes (latest: {shapes[:4]}...). Every new shape recompiles; pad inputs to a few "
            "bucket sizes (hf_tpu.compile(model, buckets=...)) to avoid a recompile storm.",
            stacklevel=3,
        )


def _abstract(keys, arrays: list) -> tuple:
    """(keys, *arrays) with every array as its shape, dtype and placement (no reference to its buffer)."""
    jax = platform.jax()

    def spec(a):
        if hasattr(a, "sharding") and hasattr(a, "shape"):  # uncommitted arrays go where they are needed
            return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding if a.committed else None)
        return a

    return (keys, *[spec(a) for a in arrays])


# the type of the arrays a jitted program returns (set at the first call: importing jax is deferred)
_ARRAY: list = [None]

# every live compiled graph (hf_tpu.compiled_programs)
PROGRAMS: weakref.WeakSet = weakref.WeakSet()


def _compiled_count(fn) -> int:
    """How many executables a `jax.jit` function has compiled (one per input signature)."""
    if fn is None:
        return 0
    size = getattr(fn, "_cache_size", None)
    return size() if size is not None else 0


def _references(arrays: list, i: int) -> int:
    return sys.getrefcount(arrays[i])


def _sole_references() -> int:
    """What `_references` reports for an array held only by a payload and the argument list."""
    holder, value = RefProbe(), object()
    holder.array = value
    arrays = [value]
    del value
    return _references(arrays, 0)


_SOLE_REFERENCES = _sole_references()


def _on_tpu(a) -> bool:
    return isinstance(a, torch.Tensor) and a.device.type == "tpu"


def _donate_enabled() -> bool:
    return os.environ.get("HF_TPU_DONATE", "1").strip().lower() not in ("0", "false", "no", "off")


def donation_plan(gm: torch.fx.GraphModule) -> tuple[tuple[int, int], ...]:
    """(input index, output index) for each input aot_autograd will overwrite whole after the call.

    For the mutations aot_autograd keeps out of the graph (an input that requires grad, outside no_grad;
    the rest are `_in_graph_mutations`), the graph returns the new value of every input it
    mutates as its first outputs (in `mutated_inp_runtime_indices` order) and aot_autograd's epilogue
    does `input.copy_(new)`. Only data-only mutations qualify (no `as_strided_`/`set_` metadata change),
    and only when the output has the input's shape and dtype (so XLA can write it into that buffer).
    """
    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
    if meta is None:
        return ()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    outputs = next((n.args[0] for n in gm.graph.nodes if n.op == "output"), ())
    plan = []
    for k, i in enumerate(meta.mutated_inp_runtime_indices):
        info = meta.input_info[i]
        if not info.mutates_data or info.mutates_metadata or info.mutates_storage_metadata:
            continue
        if i >= len(placeholders) or k >= len(outputs):
            continue
        out = outputs[k]
        if not isinstance(out, torch.fx.Node) or out.op == "placeholder":
            continue
        spec = _spec(placeholders[i])
        if spec is None or spec != _spec(out):
            continue
        plan.append((i, k))
    return tuple(plan)


def _in_graph_mutations(gm: torch.fx.GraphModule) -> tuple[tuple[int, int], ...]:
    """(input index, output index) for each input the graph overwrites itself, rewriting the graph.

    aot_autograd keeps an inference graph's data mutations of inputs in the graph (inductor's
    `keep_inference_input_mutations=True`): a `copy_(input, new)` at its end, instead of returning the
    new value for its runtime wrapper to `copy_` into the input after the call (one dispatched op per
    input: a StaticCache decode step's 8-12 buffers). Each such `copy_` becomes the functional `copy`
    (the new value cast and broadcast to the input's shape and dtype), returned as an extra output after
    those the caller sees; `GraphProgram.__call__` stores it into the input. A `copy_` whose input is read
    after it, or whose result is computed with, keeps them all (the graph then runs op by op, in order);
    one whose result is returned returns the input itself, written before the caller sees it.
    """
    copy_ = torch.ops.aten.copy_.default
    placeholders = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    output = next((n for n in gm.graph.nodes if n.op == "output"), None)
    if output is None or not isinstance(output.args[0], list | tuple):
        return ()
    order = {n: j for j, n in enumerate(gm.graph.nodes)}
    found = []
    seen = set()
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not copy_ or node.args[0] not in placeholders:
            continue
        dst = node.args[0]
        if (
            len(node.args) != 2
            or node.kwargs
            or dst in seen
            or any(u is not output for u in node.users)  # its result is computed with
            or any(u is not node and order[u] > order[node] for u in dst.users)  # read after the write
        ):
            return ()  # keep every such op: they run in order, op by op
        seen.add(dst)
        found.append(node)
    if not found:
        return ()
    for node in found:  # returned (`self.count += 1` returns the buffer): the input itself, as in eager
        node.replace_all_uses_with(node.args[0])
    outs = list(output.args[0])
    pairs = []
    for node in found:
        dst, src = node.args
        with gm.graph.inserting_before(node):
            value = gm.graph.call_function(torch.ops.aten.copy.default, (dst, src))
        value.meta = dict(dst.meta)  # the input's shape, dtype and device
        gm.graph.erase_node(node)
        pairs.append((placeholders[dst], len(outs)))
        outs.append(value)
    output.args = (type(output.args[0])(outs),)
    gm.recompile()
    return tuple(pairs)


def _touches_tpu(gm: torch.fx.GraphModule) -> bool:
    """Whether any value the graph reads, computes or returns is on a device other than the CPU."""
    for node in gm.graph.nodes:
        for value in torch.utils._pytree.tree_leaves(node.meta.get("val")):
            if isinstance(value, torch.Tensor) and value.device.type != "cpu":
                return True
    return False


def _count_draws(gm: torch.fx.GraphModule) -> int:
    """How many keys the graph draws: its random ops, and those in the branches of its control flow."""
    n = 0
    for node in gm.graph.nodes:
        if _draws_key(node):
            n += 1
        elif node.op == "call_function" and node.target in control_flow.CONTROL_FLOW:
            n += sum(_count_draws(sub) for sub in control_flow.subgraphs(node))
    return n


def _draws_key(node) -> bool:
    """Whether `node` takes the next key of the graph's draws: a random op, or an RNG wrapper that saves
    the state of its draw (the replaying `run_with_rng_state` reuses a saved one)."""
    if node.op != "call_function":
        return False
    if node.target is SAVE_RNG:
        return True
    if not isinstance(node.target, torch._ops.OpOverload):
        return False
    lowering = graph_lowering(node.target)
    return lowering is not None and lowering.random and not _draws_nothing(node)


def _draws_nothing(node) -> bool:
    """A random op whose arguments rule out a draw: attention without dropout. Eager takes no key for it
    (lowerings/attention.py), so neither does a graph: a compiled step then leaves the generator where
    eager leaves it (a seeded `generate` samples the same tokens with a compiled decode step)."""
    if node.target is not torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default:
        return False
    dropout = node.args[4] if len(node.args) > 4 else node.kwargs.get("dropout_p", 0.0)
    return isinstance(dropout, int | float) and dropout == 0


def _wrapped_op(node):
    """What `node` computes: the ATen op inside an RNG or effect wrapper, else its own target."""
    if node.target is SAVE_RNG:
        return node.args[0]
    if node.target is WITH_RNG or node.target is WITH_EFFECTS:
        return node.args[1]
    return node.target


def _result_spec(node):
    """The traced (shape, dtype) of the op `node` runs. The RNG wrappers are inserted after tracing and
    carry no value of their own: read it from the getitems that unpack them."""
    if node.target is SAVE_RNG:  # (state, result): result is item 1
        item = next((u for u in node.users if u.target is operator.getitem and u.args[1] == 1), None)
        return None if item is None else _spec(item)
    if node.target is WITH_RNG and "val" not in node.meta:
        n = len(node.args[1]._schema.returns)
        parts = {u.args[1]: _spec(u) for u in node.users if u.target is operator.getitem}
        return tuple(parts.get(k) for k in range(n)) if parts and n > 1 else None
    return _spec(node)


def _devicefree(v):
    if isinstance(v, torch.device):
        return None
    return v


_counter = [0]


def _make_compiler(kind: str):
    def compiler(gm: torch.fx.GraphModule, example_inputs):
        if not _touches_tpu(gm):
            return gm  # a CPU-only graph: PyTorch runs it on the CPU, as eager would
        with _lock:
            _counter[0] += 1
            name = f"{kind}{_counter[0]}"
        if kind == "forward":
            program = GraphProgram(gm, name, donation_plan(gm), user_outputs(gm))
        else:
            program = GraphProgram(gm, name)
        if program.missing:
            missing = sorted(set(program.missing))
            if os.environ.get("HF_TPU_COMPILE_STRICT", "") == "1" or dynamo_prep.fullgraph_requested():
                raise GraphLoweringMissing(
                    f"hf_tpu compile: no graph lowering for {', '.join(missing)} in graph {name}, so it cannot "
                    "run as one compiled program (fullgraph=True or HF_TPU_COMPILE_STRICT=1 asks for that); "
                    "without them the graph runs op by op in tpu eager, with a warning"
                )
            key = tuple(missing)
            if key not in _warned:
                _warned.add(key)
                warnings.warn(
                    f"hf_tpu compile: graph {name} contains ops without a pure-JAX lowering ({', '.join(missing[:8])}); "
                    "this region runs op by op in tpu eager instead of as one compiled program.",
                    stacklevel=2,
                )
        return program

    return compiler


def tpu_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """The TorchDynamo backend registered as "tpu" (accepts the options transformers/diffusers pass)."""
    from torch._functorch.aot_autograd import make_boxed_func

    from hf_tpu.runtime.execution import kernels

    # the lowering table loads with the first tpu op; a compiled function may be the first tpu work
    kernels.ensure_kernels()

    fw = _make_compiler("forward")
    bw = _make_compiler("backward")

    def boxed(compiler):
        def inner(gm, example_inputs):
            return make_boxed_func(compiler(gm, example_inputs))

        return inner

    return aot_autograd(
        fw_compiler=boxed(fw),
        bw_compiler=boxed(bw),
        decompositions=_decompositions(),
        keep_inference_input_mutations=True,  # see `_in_graph_mutations`
    )(gm, example_inputs)
