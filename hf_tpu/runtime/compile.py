"""`torch.compile(model, backend="tpu")`: ATen FX graphs -> the same lowerings -> one `jax.jit`.

TorchDynamo captures the graph, `aot_autograd` lowers it to functional ATen (forward and backward),
and each graph is interpreted with the lowering table inside a single `jax.jit`, cached per input
shapes/dtypes. Parameters enter as the device buffers they already are (no per-call copies). A graph
that holds an op without a pure-JAX lowering runs op by op in tpu eager instead (one warning naming the
op; an error under `HF_TPU_COMPILE_STRICT=1`).

Outputs land on the device their traced value names (a `.cpu()` result or a CPU factory comes back as
a CPU tensor, as in eager), and a graph that touches no tpu tensor runs in PyTorch on CPU, untouched.
They alias as in eager (`_plan_outputs`): an input returned comes back as that very tensor, a view of
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

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._prims import rng_prims
from torch._prims_common import is_contiguous_or_false
from torch.fx.experimental.symbolic_shapes import guard_or_false

from hf_tpu.runtime import platform, rng
from hf_tpu.runtime.dispatch import _cast_like, _Signature, op_failure
from hf_tpu.runtime.lowering_table import graph_lowering
from hf_tpu.runtime.storage import REGISTRY
from hf_tpu.runtime.tensor import DONATION_LOCK, RefProbe, to_jax, wrap

log = logging.getLogger("hf_tpu.compile")
_warned: set = set()


def _keep_dynamo_out_of_the_runtime() -> None:
    """Dynamo must never trace our eager kernels (nor JAX): after a graph break such as `loss.backward()`
    inside a compiled function, the autograd engine calls them while Dynamo's frame hook is active."""
    from torch._dynamo import trace_rules

    for module in ("hf_tpu.runtime", "jax", "jaxlib"):
        trace_rules.add(module)


_keep_dynamo_out_of_the_runtime()

_meta_lib = None


def _allow_float_grouped_mm_in_fake_tensors() -> None:
    """torch's meta kernel of `_grouped_mm` copies CUDA's bf16-only check, so Dynamo's fake-tensor pass
    rejects the float32 MoE expert matmul that CPU and tpu eager run fine (transformers picks
    `_grouped_mm` for tpu; 63 of 64 compile failures of the 5,000-model run): compute the meta result
    in bf16 and give it the real dtype. Installed where fake tensors look: the Python dispatcher's
    `py_kernels`, the meta table and the Meta dispatch key."""
    global _meta_lib
    from torch._decomp import meta_table
    from torch._meta_registrations import meta_grouped_mm

    bf16 = torch.bfloat16
    op = torch.ops.aten._grouped_mm.default

    def meta(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
        if mat_a.dtype == mat_b.dtype and mat_a.dtype in (torch.float32, torch.float16):
            cast = None if bias is None else bias.to(bf16)
            out = meta_grouped_mm(mat_a.to(bf16), mat_b.to(bf16), offs, cast, bf16)
            return out.to(out_dtype or mat_a.dtype)
        return meta_grouped_mm(mat_a, mat_b, offs, bias, out_dtype)

    op.py_kernels[torch._C.DispatchKey.Meta] = meta
    meta_table[op] = meta
    _meta_lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel": that is the point
        _meta_lib.impl("_grouped_mm", meta, "Meta")
    op._dispatch_cache.clear()


_allow_float_grouped_mm_in_fake_tensors()
_lock = threading.Lock()
_RECOMPILE_WARN_AT = 8
_UNUSABLE_DONATION = "Some donated buffers were not usable"


class GraphLoweringMissing(NotImplementedError):
    pass


# activation checkpointing's RNG wrappers (aot_autograd's `functionalize_rng_ops`)
_SAVE_RNG = rng_prims.run_and_save_rng_state
_WITH_RNG = rng_prims.run_with_rng_state
_GRAPHSAFE_RNG = rng_prims.graphsafe_run_with_rng_state


def _decompositions() -> dict:
    from torch._decomp import core_aten_decompositions

    table = dict(core_aten_decompositions())
    # keep ops we lower whole (one fused XLA op beats its decomposition)
    from hf_tpu.runtime.lowering_table import GRAPH_TABLE, TABLE

    for op in list(table):
        if op in TABLE or op in GRAPH_TABLE:
            del table[op]
    return table


def _spec(node) -> tuple | None:
    val = node.meta.get("val")
    if isinstance(val, list | tuple):
        return tuple(_spec_of(v) for v in val)
    return _spec_of(val)


def _spec_of(val):
    """(shape, dtype) of a traced value; shape None when a dim is symbolic (a graph Dynamo made
    dynamic: its size is only known per call, so only the dtype is enforced)."""
    if isinstance(val, torch.Tensor):
        if any(isinstance(s, torch.SymInt) for s in val.shape):
            return (None, val.dtype)
        return (tuple(val.shape), val.dtype)
    return None


class GraphProgram:
    """One ATen FX graph interpreted with the lowering table; `run(*tensors)` executes it jitted."""

    def __init__(
        self, gm: torch.fx.GraphModule, name: str, donation_plan: tuple = (), user_outputs: range = range(0)
    ) -> None:
        self.gm = gm
        self.name = name
        self.missing = self._find_missing()
        # (input index, index of the output that becomes its new value): see `donation_plan`
        self.donation_plan = donation_plan
        self._donating: dict = {}  # donated input indices -> jax.jit with those donate_argnums
        self.n_random = sum(1 for n in gm.graph.nodes if _draws_key(n))
        # how each output is produced, and the nodes the jitted program returns (`_plan_outputs`)
        self._plan, self._jit_nodes, self._jit_index, self._has_views = _plan_outputs(gm, user_outputs)
        self._n_outputs = len(_output_nodes(gm))
        self._jitted = None
        self._static: tuple = ()
        self._storm_warned = False
        self._warmed = False  # the first call compiled ahead, outside DONATION_LOCK (`_compile_ahead`)
        if self.missing:
            self._prepare_op_by_op()

    def _prepare_op_by_op(self) -> None:
        """For op-by-op execution: eager outputs are contiguous where the traced fake tensors may not
        have been, so a `view` the graph planned on fake strides becomes a `reshape` (view when it can);
        the RNG wrappers, which PyTorch implements only for CPU/CUDA/XPU/HPU, get tpu-aware versions."""
        aten = torch.ops.aten
        eager = {
            aten.view.default: aten.reshape.default,
            aten._unsafe_view.default: aten.reshape.default,
            _SAVE_RNG: _eager_run_and_save_rng_state,
            _WITH_RNG: _eager_run_with_rng_state,
        }
        for node in self.gm.graph.nodes:
            if node.op == "call_function" and node.target in eager:
                node.target = eager[node.target]
        self.gm.recompile()

    def _find_missing(self) -> list[str]:
        missing = []
        for node in self.gm.graph.nodes:
            if node.op != "call_function":
                continue
            if node.target is _GRAPHSAFE_RNG:
                raise GraphLoweringMissing(
                    f"hf_tpu compile: graph {self.name} uses graphsafe_run_with_rng_state, which needs a "
                    "torch.Generator for the tpu device; do not register 'tpu' with "
                    "register_graphsafe_rng_device_type"
                )
            target = _wrapped_op(node)
            if not isinstance(target, torch._ops.OpOverload):
                continue  # Python arithmetic on sizes, getitem: evaluated as is
            if graph_lowering(target) is not None:
                continue
            missing.append(str(target))
        return missing

    def interpret(self, keys, *arrays):
        """Evaluate the graph on JAX values (traced under jit)."""
        env = {}
        args = iter(arrays)
        draws = iter(range(self.n_random))  # the draw index of each random op, in graph order

        def fetch(a):
            if isinstance(a, torch.fx.Node):
                return env[a]
            if isinstance(a, list | tuple):
                return [fetch(x) for x in a]
            return a

        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                env[node] = next(args)
            elif node.op == "call_function":
                target = node.target
                node_args = [fetch(a) for a in node.args]
                kwargs = {k: fetch(v) for k, v in node.kwargs.items()}
                if target is _SAVE_RNG:  # (state, op(*args)): the state replays this draw's key
                    i = next(draws)
                    out = self._lower(node_args[0], node_args[1:], kwargs, rng.key_from(keys, i), node)
                    env[node] = (_state_of_draw(keys, i), out)
                elif target is _WITH_RNG:  # op(*args) with the key of a saved state
                    key = _key_of_state(node_args[0])
                    env[node] = self._lower(node_args[1], node_args[2:], kwargs, key, node)
                elif not isinstance(target, torch._ops.OpOverload):
                    env[node] = target(*node_args, **kwargs)
                else:
                    random = graph_lowering(target).random
                    key = rng.key_from(keys, next(draws)) if random else None
                    env[node] = self._lower(target, node_args, kwargs, key, node)
            elif node.op == "output":
                return tuple(env[o] for o in self._jit_nodes)
            elif node.op == "get_attr":
                env[node] = to_jax(getattr(self.gm, node.target))
        raise RuntimeError("graph without output")

    def _lower(self, op, args: list, kwargs: dict, key, node):
        """`op` applied through its lowering (given `key` first when it is random), cast to the traced
        result of `node`."""
        lowering = graph_lowering(op)
        full = [_devicefree(v) for v in _Signature(op).normalize(tuple(args), kwargs)]
        if lowering.random:
            full = [key, *full]
        try:
            out = lowering.fn(*full)
        except Exception as exc:  # noqa: BLE001 - name the node
            raise RuntimeError(f"hf_tpu compile: lowering {op} failed in graph {self.name}: {exc}") from exc
        return _cast_like(platform.jax().numpy, out, _result_spec(node))

    def __call__(self, *args):
        if self.missing:
            return self.gm(*args)  # tpu eager, op by op
        jax = platform.jax()
        if self._jitted is None:
            # non-tensor inputs (the sizes of a graph Dynamo made dynamic) are static: lowerings need
            # concrete ints for shapes, and XLA compiles per shape anyway
            self._static = tuple(i + 1 for i, a in enumerate(args) if not isinstance(a, torch.Tensor))
            self._jitted = jax.jit(self.interpret, static_argnums=self._static)
        arrays = []
        for a in args:
            if isinstance(a, torch.Tensor):
                arrays.append(_host(a) if a.is_cpu else to_jax(a))
            else:
                arrays.append(a)
        keys = rng.next_material(self.n_random) if self.n_random else None
        plan = self.donation_plan if _donate_enabled() else ()
        if plan and not self._warmed:
            self._compile_ahead(args, keys, arrays)
            plan = self.donation_plan
        # donating: from the check until the payloads hold the results, so that another thread reads
        # either the old array (and its reference stops the donation) or the new one (tensor._array_of)
        with DONATION_LOCK if plan else contextlib.nullcontext():
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
                    updated[k] = args[i].detach()
        if not self._storm_warned:
            self._check_recompile_storm(args)
        # for synchronize(); not the donated outputs: an extra reference would block their next donation
        kept = {self._jit_index[k] for k in updated}
        platform.last_launched[0] = [o for j, o in enumerate(outs) if j not in kept] if kept else list(outs)
        return self._results(outs, args, updated)

    def _results(self, outs: tuple, args: tuple, updated: dict) -> list:
        """The graph's outputs as eager gives them, from the jitted program's results `outs` (see
        `_plan_outputs`): first every value of its own, then the views of those values."""
        results = []
        for k, (kind, a, b, c) in enumerate(self._plan):
            if kind is _FROM_JIT:
                results.append(updated[k] if k in updated else _output(outs[a], b, c))
            elif kind is _FROM_ARG:
                results.append(args[a])
            elif kind is _ON_HOST:
                results.append(_evaluate_on_host(a, args, b))
            else:  # a constant, or a view filled in below
                results.append(a)
        if self._has_views:
            for k, (kind, root, steps, inputs) in enumerate(self._plan):
                if kind is _AS_VIEW:
                    results[k] = _replay_views(results[root], steps, args, inputs)
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


def _donate_enabled() -> bool:
    return os.environ.get("HF_TPU_DONATE", "1").strip().lower() not in ("0", "false", "no", "off")


def donation_plan(gm: torch.fx.GraphModule) -> tuple[tuple[int, int], ...]:
    """(input index, output index) for each input aot_autograd will overwrite whole after the call.

    With `keep_inference_input_mutations=False` the graph returns the new value of every input it
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


def user_outputs(gm: torch.fx.GraphModule) -> range:
    """The indices of the forward graph's outputs its caller sees: after the new values of mutated
    inputs, before what is saved for the backward (aot_autograd's `num_forward_returns`)."""
    n = len(_output_nodes(gm))
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
    saved_state = node.target is operator.getitem and getattr(node.args[0], "target", None) is _SAVE_RNG
    return not saved_state


# where a value the jitted program returns goes (`_placement`): a tpu tensor, a CPU tensor, a number
_DEVICE, _HOST, _NUMBER = "device", "host", "number"
# how a graph output is produced (`_plan_outputs`)
_FROM_JIT, _FROM_ARG, _ON_HOST, _AS_VIEW, _CONST = "jit", "arg", "on host", "view", "const"


def _output_nodes(gm: torch.fx.GraphModule) -> list:
    for node in gm.graph.nodes:
        if node.op == "output":
            return list(node.args[0])
    return []


def _plan_outputs(gm: torch.fx.GraphModule, user_outputs: range) -> tuple[list, list, dict, bool]:
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
    nodes = _output_nodes(gm)
    inputs = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    plan: list = [None] * len(nodes)
    jit_nodes: list = []
    jit_index: dict = {}
    first: dict = {}  # user output node -> its first index
    hidden: dict = {}  # viewed intermediate -> its index in `plan` (after the outputs)
    host: dict = {}
    views = []

    def from_jit(node):
        jit_nodes.append(node)
        return (_FROM_JIT, len(jit_nodes) - 1, *_placement(node))

    for k, node in enumerate(nodes):
        if not isinstance(node, torch.fx.Node):
            plan[k] = (_CONST, node, None, None)
        elif node.op == "placeholder":
            plan[k] = (_FROM_ARG, inputs[node], None, None)
        elif _number_type(node.meta.get("val")) is not None and _computable_on_host(node, host):
            plan[k] = (_ON_HOST, node, inputs, None)
        elif k in user_outputs and isinstance(node.meta.get("val"), torch.Tensor):
            if node in first:  # returned twice: the same tensor twice
                views.append((k, first[node], ()))
                continue
            first[node] = k
            root, steps = _view_chain(node, host)
            if steps:
                views.append((k, root, steps))
            else:
                plan[k] = from_jit(node)
                jit_index[k] = plan[k][1]
        else:
            plan[k] = from_jit(node)
            jit_index[k] = plan[k][1]
    updates = set(nodes[: user_outputs.start])  # new values of mutated inputs
    for k, root, steps in views:
        if root in updates:  # a view of a mutated input: aot_autograd makes it from the input itself
            plan[k] = from_jit(nodes[k])
            jit_index[k] = plan[k][1]
            continue
        if not isinstance(root, torch.fx.Node):
            index = root  # an earlier output
        elif root.op == "placeholder":
            index = len(plan)
            plan.append((_FROM_ARG, inputs[root], None, None))
        elif root in first and plan[first[root]] is not None and plan[first[root]][0] is _FROM_JIT:
            index = first[root]
        else:
            index = hidden.get(root)
            if index is None:
                index = hidden[root] = len(plan)
                plan.append(from_jit(root))
        plan[k] = (_AS_VIEW, index, steps, inputs)
    return plan, jit_nodes, jit_index, bool(views)


def _placement(node) -> tuple:
    """(spec, place) of a value the jitted program returns: a number's Python type, or a tensor's traced
    (shape, dtype) and whether eager has it on the device or on the host."""
    number = _number_type(node.meta.get("val"))
    if number is not None:
        return number, _NUMBER
    return _spec_of(node.meta.get("val")), (_HOST if _belongs_on_cpu(node) else _DEVICE)


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


def _evaluate_on_host(node, args: tuple, inputs: dict):
    """The value of a node `_computable_on_host` accepted, for this call's `args`."""
    if node.op == "placeholder":
        return args[inputs[node]]
    a, kw = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: _evaluate_on_host(n, args, inputs))
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
    """Whether a traced tensor has the layout of the tensor `wrap` makes of its result: contiguous, at
    offset 0 (views replayed on it then pick the elements the graph's views picked)."""
    if not isinstance(val, torch.Tensor):
        return False
    return is_contiguous_or_false(val) and guard_or_false(val.storage_offset() == 0)


def _arg_nodes(args) -> list:
    found: list = []
    torch.fx.node.map_arg(args, found.append)
    return found


def _replay_views(base: torch.Tensor, steps: tuple, args: tuple, inputs: dict):
    """`base` through the view ops of `_view_chain`, with this call's sizes: a view of its storage."""
    out = base
    for op, rest, kwargs in steps:
        if op is operator.getitem:
            out = out[rest[0]]
            continue
        rest, kwargs = torch.fx.node.map_arg((rest, kwargs), lambda n: _evaluate_on_host(n, args, inputs))
        out = op(out, *rest, **kwargs)
    return out


def _output(value, spec, place):
    """A result of the jitted program as eager has it: a tpu tensor of the traced dtype, a CPU tensor,
    or a Python number (`spec` its type; aot_autograd requires Python sizes)."""
    if place is _NUMBER:
        return spec(value)
    if not (hasattr(value, "dtype") and hasattr(value, "shape")):
        return value
    dtype = spec[1] if spec else None
    if place is _DEVICE:
        return wrap(value, dtype)
    from hf_tpu.runtime.copy import jax_to_host

    host = jax_to_host(value)
    return host if dtype is None or host.dtype == dtype else host.to(dtype)


def _touches_tpu(gm: torch.fx.GraphModule) -> bool:
    """Whether any value the graph reads, computes or returns is on a device other than the CPU."""
    for node in gm.graph.nodes:
        for value in torch.utils._pytree.tree_leaves(node.meta.get("val")):
            if isinstance(value, torch.Tensor) and value.device.type != "cpu":
                return True
    return False


def _draws_key(node) -> bool:
    """Whether `node` takes the next key of the graph's draws: a random op, or an RNG wrapper that saves
    the state of its draw (the replaying `run_with_rng_state` reuses a saved one)."""
    if node.op != "call_function":
        return False
    if node.target is _SAVE_RNG:
        return True
    if not isinstance(node.target, torch._ops.OpOverload):
        return False
    lowering = graph_lowering(node.target)
    return lowering is not None and lowering.random


def _wrapped_op(node):
    """What `node` computes: the ATen op inside an RNG wrapper, else its own target."""
    if node.target is _SAVE_RNG:
        return node.args[0]
    if node.target is _WITH_RNG:
        return node.args[1]
    return node.target


def _result_spec(node):
    """The traced (shape, dtype) of the op `node` runs. The RNG wrappers are inserted after tracing and
    carry no value of their own: read it from the getitems that unpack them."""
    if node.target is _SAVE_RNG:  # (state, result): result is item 1
        item = next((u for u in node.users if u.target is operator.getitem and u.args[1] == 1), None)
        return None if item is None else _spec(item)
    if node.target is _WITH_RNG and "val" not in node.meta:
        n = len(node.args[1]._schema.returns)
        parts = {u.args[1]: _spec(u) for u in node.users if u.target is operator.getitem}
        return tuple(parts.get(k) for k in range(n)) if parts and n > 1 else None
    return _spec(node)


_BYTE_SHIFTS = (0, 8, 16, 24)


def _state_of_draw(material, index: int):
    """The device generator's state just before draw `index` of `material`, in
    `torch.tpu.get_rng_state()`'s format (little-endian uint64 seed, then offset): a generator set to it
    draws that same key next, in a compiled graph (`_key_of_state`) or op by op."""
    jnp = platform.jax().numpy
    words = jnp.stack([material[1], material[0], material[2] + jnp.uint32(index), jnp.uint32(0)])
    shifts = jnp.asarray(_BYTE_SHIFTS, jnp.uint32)
    return ((words[:, None] >> shifts) & jnp.uint32(0xFF)).astype(jnp.uint8).reshape(16)


def _key_of_state(state):
    """The key of the next draw of a generator set to `state` (the inverse of `_state_of_draw`)."""
    jnp = platform.jax().numpy
    if tuple(state.shape) != (16,) or state.dtype != jnp.uint8:
        raise RuntimeError(
            f"hf_tpu compile: run_with_rng_state needs a tpu RNG state (16 uint8 values, as "
            f"torch.tpu.get_rng_state() gives), got shape {tuple(state.shape)} {state.dtype}"
        )
    shifts = jnp.asarray(_BYTE_SHIFTS, jnp.uint32)
    words = (state.reshape(4, 4).astype(jnp.uint32) << shifts).sum(axis=1, dtype=jnp.uint32)
    return rng.key_from(jnp.stack([words[1], words[0], words[2]]))


def _on_tpu(args, kwargs) -> bool:
    return any(isinstance(a, torch.Tensor) and a.device.type == "tpu" for a in (*args, *kwargs.values()))


def _eager_run_and_save_rng_state(op, *args, **kwargs):
    """`run_and_save_rng_state` op by op: the tpu generator's state, then `op`'s result."""
    if not _on_tpu(args, kwargs):
        return _SAVE_RNG(op, *args, **kwargs)
    return rng.GENERATOR.get_state(), op(*args, **kwargs)


def _eager_run_with_rng_state(state, op, *args, **kwargs):
    """`run_with_rng_state` op by op: `op` drawing from `state`, the generator left as it was."""
    if not _on_tpu(args, kwargs):
        return _WITH_RNG(state, op, *args, **kwargs)
    current = rng.GENERATOR.get_state()
    rng.GENERATOR.set_state(state)
    try:
        return op(*args, **kwargs)
    finally:
        rng.GENERATOR.set_state(current)


def _devicefree(v):
    if isinstance(v, torch.device):
        return None
    return v


def _host(t: torch.Tensor):
    from hf_tpu.runtime.copy import host_to_jax

    return host_to_jax(t)


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
            if os.environ.get("HF_TPU_COMPILE_STRICT", "") == "1":
                raise GraphLoweringMissing(
                    f"hf_tpu compile: no graph lowering for {', '.join(missing)} in graph {name}"
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

    from hf_tpu.runtime import registration

    # the lowering table loads with the first tpu op; a compiled function may be the first tpu work
    registration.ensure_kernels()

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
        keep_inference_input_mutations=False,
    )(gm, example_inputs)
