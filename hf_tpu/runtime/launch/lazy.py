"""DeferAndFuse: record tpu ops instead of running them, then run the recording as one `jax.jit`.

In this mode every jitted call the eager path would make (an op's cached executable, a view read, a
scatter through a view) is appended to a trace and returns `LazyValue`s of known shape and dtype.
A storage's payload may hold a LazyValue, so views, in-place writes and autograd work unchanged. At a
sync point — a value needed on the host (`.item()`, `.cpu()`, printing, control flow), an explicit
`torch.tpu.synchronize()`/`flush()`, a graph-size limit, or leaving the mode — the trace becomes one
function, jitted and cached on its structure (ops, argument wiring, input shapes/dtypes, live outputs),
so a training or decode step that repeats reuses its executable. Only values still referenced (by a
live storage or the caller) leave the program; intermediates stay inside XLA's fusion.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import warnings
import weakref

from hf_tpu.runtime import native
from hf_tpu.runtime.buffers import executables, platform
from hf_tpu.runtime.buffers.pending import LazyValue

log = logging.getLogger("hf_tpu.lazy")
if os.environ.get("HF_TPU_LOG"):
    logging.basicConfig()
    log.setLevel(getattr(logging, os.environ["HF_TPU_LOG"].upper(), logging.DEBUG))

MAX_OPS = int(os.environ.get("HF_TPU_DEFER_MAX_OPS", "4000"))
# compiled programs kept (least recently used dropped first): a workload whose traces keep changing
# must not hold every executable it ever compiled
MAX_PROGRAMS = int(os.environ.get("HF_TPU_DEFER_MAX_PROGRAMS", "256"))


def _trace_only_refs() -> int:
    """What `sys.getrefcount` reports, in flush's liveness loop, for a value only the trace holds."""
    values = [object()]
    counts = [sys.getrefcount(v) for v in values]
    return counts[0]


_TRACE_ONLY_REFS = _trace_only_refs()


def reshape(value: LazyValue, shape: tuple) -> LazyValue:
    """A pending value reshaped (recorded, as eager code reshapes payloads: tensor.write)."""
    return call(_reshape_fn(tuple(shape)), (value,))


def astype(value: LazyValue, dtype) -> LazyValue:
    return call(_astype_fn(dtype), (value,))


_reshape_cache: dict = {}
_astype_cache: dict = {}


def _reshape_fn(shape):
    fn = _reshape_cache.get(shape)
    if fn is None:
        jax = platform.jax()
        fn = _reshape_cache[shape] = jax.jit(lambda x: x.reshape(shape))
    return fn


def _astype_fn(dtype):
    fn = _astype_cache.get(dtype)
    if fn is None:
        jax = platform.jax()
        fn = _astype_cache[dtype] = jax.jit(lambda x: x.astype(dtype))
    return fn


class Trace:
    def __init__(self) -> None:
        self.ops: list = []  # (fn, arg refs, is_tuple, holder: what recorded it, or None)
        self.inputs: list = []
        self.input_ids: dict = {}
        # every LazyValue produced, in (node, index) order; liveness is read from reference counts at
        # flush time (cheaper than a weakref per output)
        self.values: list = []
        self.cut_at = MAX_OPS  # the graph-size limit, aligned to the trace's period (`_aligned_cut`)
        # storage pointer -> its array before this trace first overwrote it, when a recorded op read that
        # array (so keeping it costs nothing): restored if the flush fails in an op its new value needs
        self.before: dict = {}

    def note_overwrite(self, ptr: int, old) -> None:
        """A storage whose array `old` is being replaced by a value of this trace (storage.set_array)."""
        if ptr not in self.before and id(old) in self.input_ids:
            self.before[ptr] = old

    def ref(self, arg):
        if type(arg) is LazyValue:
            if arg.concrete is not None:
                return self.ref(arg.concrete)
            if arg.trace is not self:
                raise lost(arg)
            return arg.ref
        if isinstance(arg, bool | int | float | complex):
            self.inputs.append(arg)
            return ("s", len(self.inputs) - 1, type(arg))
        k = self.input_ids.get(id(arg))
        if k is None:
            self.inputs.append(arg)
            k = self.input_ids[id(arg)] = len(self.inputs) - 1
        return ("i", k)


class _State(threading.local):
    pass


_lock = threading.RLock()
_trace: Trace | None = None
_enabled = False
# recording is on only for hf_tpu's own deferral of a loop (`modes.deferred_in_this_thread`), not because
# the user chose DeferAndFuse: its recompiles are by design and not warned of
scoped = [False]
_aval_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # kernel -> {avals in: out}
_program_cache: dict = {}
stats = {"flushes": 0, "cache_hits": 0, "cache_misses": 0, "interpreted": 0, "ops": 0}


def enabled() -> bool:
    return _enabled


def set_enabled(on: bool) -> None:
    """Turn recording on or off; turning it off runs what is pending, and is off even when that fails
    (the flush's error, naming the failed op, propagates)."""
    global _enabled
    if on or not _enabled:
        if on:
            _flush_at_optimizer_steps()
        _enabled = on
        _set_native_recording(on)
        return
    _set_native_recording(False)
    try:
        flush("mode change")
    finally:
        _enabled = False


_step_hook: list = []
_native_module = native.load()
_set_native_recording = (
    (lambda on: None) if _native_module is None else _native_module.set_recording
)  # the C++ recorder (execution.native_recording) records while this mode is on
_set_native_room = (lambda n: None) if _native_module is None else _native_module.set_max_pending


def room() -> int:
    """Ops the current trace takes before the graph-size limit cuts it: the C++ recorder hands its
    trace over when it holds that many, so the limit cuts at the same op either way."""
    trace = _trace
    return MAX_OPS if trace is None else max(1, trace.cut_at - len(trace.ops))


def _flush_at_optimizer_steps() -> None:
    """End a trace where an optimizer step ends, once per process.

    A training loop that never syncs would otherwise be cut by the graph-size limit wherever the count
    falls: a 3,264-op tiny-Llama step cut every 4,000 ops starts each trace 736 ops further into the
    step, 102 distinct programs to compile (measured: 373 s over 150 steps). Cut at the step instead,
    every step is the same program: one compile (two: the first step also creates the optimizer's
    state), then cache hits. The flush dispatches asynchronously, so the host does not wait for it."""
    if _step_hook:
        return
    from torch.optim.optimizer import register_optimizer_step_post_hook

    def after_step(optimizer, args, kwargs) -> None:
        trace = _trace
        if _enabled and trace is not None and trace.ops:
            flush("optimizer step")

    _step_hook.append(register_optimizer_step_post_hook(after_step))


def _aval(arg):
    if isinstance(arg, LazyValue):
        if arg.concrete is not None:
            arg = arg.concrete
        else:
            return (arg.shape, arg.dtype)
    if isinstance(arg, bool | int | float | complex):
        return type(arg)
    return (tuple(arg.shape), arg.dtype)


def _out_avals(fn, args, cached: bool = True):
    """(is_tuple, container type, [(shape, dtype) or None per output]) of `fn(*args)`, by abstract
    evaluation; `cached`: remembered per kernel and input shapes/dtypes (a caller with a holder keeps
    its own). Per kernel in a weak dictionary: a kernel that dies (a per-offset view reader dropped by
    `_recorded_offset`) takes its entries with it, and a new kernel given its address cannot inherit
    its output shapes."""
    key = tuple(_aval(a) for a in args)
    per_fn = _aval_cache.get(fn) if cached else None
    if per_fn is not None:
        avals = per_fn.get(key)
        if avals is not None:
            return avals
    jax = platform.jax()
    abstract = []
    for a in args:
        if isinstance(a, LazyValue) and a.concrete is None:
            abstract.append(jax.ShapeDtypeStruct(a.shape, a.dtype))
        elif isinstance(a, LazyValue):
            abstract.append(a.concrete)
        else:
            abstract.append(a)
    out = jax.eval_shape(fn, *abstract)
    is_tuple = isinstance(out, list | tuple)
    leaves = list(out) if is_tuple else [out]
    # None: an undefined output (a backward's unneeded gradient), returned as None
    avals = (
        is_tuple,
        type(out) if is_tuple else None,
        [None if o is None else (tuple(o.shape), o.dtype) for o in leaves],
    )
    if cached:
        if per_fn is None:
            per_fn = _aval_cache[fn] = {}
        per_fn[key] = avals
    return avals


def call(fn, args, holder=None, avals=None):
    """Record `fn(*args)` in the current trace; returns LazyValue(s) shaped like fn's outputs.

    Output shapes come from `avals` when the caller knows them ((is_tuple, container type,
    [(shape, dtype), ...])), else from `holder` (an object with a `lazy_avals` slot whose inputs always
    have the same shapes/dtypes, e.g. a kernel's cache entry), else from an abstract evaluation cached
    per (fn, input shapes/dtypes).
    """
    global _trace
    if avals is None and holder is not None:
        avals = holder.lazy_avals
    if avals is None:
        avals = _out_avals(fn, args, cached=holder is None)
        if holder is not None:
            holder.lazy_avals = avals
    is_tuple, kind, out_avals = avals
    with _lock:
        trace = _trace
        if trace is None:
            trace = _trace = Trace()
        refs = tuple([trace.ref(a) for a in args])
        node = len(trace.ops)
        trace.ops.append((fn, refs, is_tuple, holder))
        values = trace.values
        outs = []
        for i, aval in enumerate(out_avals):
            if aval is None:
                outs.append(None)
                continue
            lv = LazyValue(aval[0], aval[1], ("v", node, i), trace)
            values.append(lv)
            outs.append(lv)
        stats["ops"] += 1
        n = node + 1
        if n == MAX_OPS // 2:
            trace.cut_at = _aligned_cut(trace.ops, n)
        too_long = n >= trace.cut_at
        if _enabled:
            _set_native_room(trace.cut_at - n)  # `room()`
    if too_long:
        flush("graph size limit")
        # computed now (they were live): hand back the arrays, which the caller stores as buffers
        outs = [o if o is None else o.concrete for o in outs]
    if is_tuple:
        return kind(outs) if kind in (list, tuple) else tuple(outs)
    return outs[0]


def _aligned_cut(ops: list, n: int) -> int:
    """Where to cut a trace that has reached half the graph-size limit without a sync point.

    A loop that never syncs (a training loop that logs its loss every 100 steps) repeats one sequence
    of kernels. Cut at a fixed op count and every flush starts at another point of that sequence: each
    is a new program to compile. Cut after a whole number of repetitions instead, and every flush is
    the same program (one compile, then cache hits). The repetition is the trace's smallest period
    over its kernels; a trace that has not repeated at least twice keeps the plain limit.
    """
    period = _smallest_period([id(op[0]) for op in ops])
    if period > n // 2:
        return MAX_OPS
    cut = -(-n // period) * period
    return cut if cut <= MAX_OPS else MAX_OPS


def _smallest_period(seq: list) -> int:
    """The smallest p with seq[i] == seq[i + p] for every i: len(seq) minus its longest proper border
    (the prefix function of Knuth-Morris-Pratt, O(len))."""
    border = [0] * len(seq)
    k = 0
    for i in range(1, len(seq)):
        while k and seq[i] != seq[k]:
            k = border[k - 1]
        if seq[i] == seq[k]:
            k += 1
        border[i] = k
    return len(seq) - (border[-1] if seq else 0)


def maybe_call(fn, args):
    """Run `fn` now, or record it when DeferAndFuse is on or an argument is still lazy."""
    if _enabled or any(isinstance(a, LazyValue) and a.concrete is None for a in args):
        return call(fn, args)
    return fn(*(a.concrete if isinstance(a, LazyValue) else a for a in args))


def concrete(value):
    """The computed array behind `value` (flushing the trace if it is still pending)."""
    if isinstance(value, LazyValue):
        if value.concrete is None and value.failed_op is None:
            flush("value needed on host")
        if value.concrete is None:
            raise lost(value)
        return value.concrete
    return value


def failed_value(shape: tuple, dtype, op_name: str) -> LazyValue:
    """A value that will never be computed because recording `op_name` failed: reading it raises,
    naming the op."""
    value = LazyValue(tuple(shape), dtype, None, None)
    value.failed_op = op_name
    return value


class LostValueError(RuntimeError):
    """A DeferAndFuse value that was never computed: the op it came from (or an input of it) failed."""


def lost(value: LazyValue) -> LostValueError:
    if value.failed_op is not None:
        return LostValueError(
            f"hf_tpu DeferAndFuse: this tensor has no value: it was computed from {value.failed_op}, which "
            "failed when its trace ran (that flush raised the error). Tensors not computed from it kept "
            "their values."
        )
    return LostValueError("hf_tpu: a lazy value from an older trace was not materialized")


def _replay(ops, outputs):
    def program(*inputs):
        vals = []
        for fn, refs, is_tuple, _ in ops:
            args = []
            for r in refs:
                if r[0] == "v":
                    args.append(vals[r[1]][r[2]])
                else:
                    args.append(inputs[r[1]])
            out = fn(*args)
            vals.append(tuple(out) if is_tuple else (out,))
        return [vals[n][i] for n, i in outputs]

    return program


def flush(reason: str = "explicit") -> None:
    """Compile (or reuse) and run the pending trace; every live LazyValue becomes concrete."""
    global _trace
    from hf_tpu.runtime.buffers.storage import REGISTRY

    REGISTRY.drain_native()  # what the C++ recorder holds joins this trace
    with _lock:
        trace = _trace
        _set_native_room(MAX_OPS)
        if trace is None or not trace.ops:
            _trace = None
            return
        _trace = None
        # drop payloads of dead storages first: the live-output set (part of the cache key) must not
        # depend on when the registry last swept
        REGISTRY.sweep_pending()
        # a value is live when something besides the trace's list (and getrefcount's argument and
        # this loop's variable) holds it: a storage's payload, or the caller
        live = [lv for lv in trace.values if sys.getrefcount(lv) > _TRACE_ONLY_REFS]
        trace.values = None
        outputs = tuple(lv.ref[1:] for lv in live)
        # the inputs' shapes and dtypes are not part of the key: the recorded kernels are specialized to
        # them already, and the jitted program compiles again for inputs of new shapes (~40 us a flush
        # for tiny T5's 53 inputs)
        key = (tuple((id(fn), refs, is_tuple) for fn, refs, is_tuple, _ in trace.ops), outputs)
        program = _program_cache.pop(key, None)
        executables.collect_if_due()  # a safe point: no JAX call under way
        t0 = time.perf_counter()
        compiling0 = executables.compile_seconds()
        compiles0 = executables.stats["compiles"]
        if (_interpret_always and key in _interpret_always) or (
            program is None and _interpret_first(key, trace.ops, outputs)
        ):
            results, failure = _run_op_by_op(trace.ops, trace.inputs, outputs, reason)
            outcome = "ran op by op"
            hit = executables.stats["compiles"] == compiles0  # every kernel had run at these shapes before
            stats["interpreted"] += 1
        else:
            results, failure, hit = _run_fused(program, key, trace, outputs, reason)
            outcome = "cache hit" if hit else "cache miss"
            stats["cache_hits" if hit else "cache_misses"] += 1
        _note_miss_streak(hit, trace)
        stats["flushes"] += 1
        platform.last_launched[0] = results
        for lv, arr in zip(live, results):
            if type(arr) is _Failed:
                lv.failed_op = arr.op
            else:
                lv.concrete = arr
            lv.trace = None  # a lost value stays in its payload: it must not keep the trace's inputs
        del live
        if failure is not None:
            _restore_overwritten(trace, failure)
        REGISTRY.materialize_pending()
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "flush (%s): %d ops, %d inputs, %d outputs, %s, compile %.1f ms, %.1f ms in all",
                reason,
                len(trace.ops),
                len(trace.inputs),
                len(outputs),
                outcome,
                (executables.compile_seconds() - compiling0) * 1e3,
                (time.perf_counter() - t0) * 1e3,
            )
        if failure is not None:
            try:
                raise failure
            finally:  # the traceback keeps this frame: not the trace's inputs and results with it
                del failure, trace, results


def _run_fused(program, key: tuple, trace: Trace, outputs: tuple, reason: str) -> tuple:
    """Run the trace as one jitted program (built on a cache miss): (results, failure, no compile).

    When the program fails, its ops run one by one to name the failing one and keep what does not
    depend on it; when they all succeed alone (the fused program ran out of memory), the flush completes
    and this trace runs op by op from then on."""
    if program is None:
        program = platform.jax().jit(_replay(trace.ops, outputs))
        while _program_cache and len(_program_cache) >= MAX_PROGRAMS:
            del _program_cache[next(iter(_program_cache))]
    compiled = program._cache_size()
    fused_error = None
    try:
        results = program(*trace.inputs)
    except Exception as exc:  # noqa: BLE001 - handled below, outside this handler's context
        fused_error = exc
    failure = None
    if fused_error is None:
        _program_cache[key] = program  # most recently used last
    else:
        results, failure = _run_op_by_op(trace.ops, trace.inputs, outputs, reason, blocking=True)
        if failure is None:
            _interpret_always.add(key)
            _warn_fused_failed(fused_error)
    return (
        results,
        failure,
        program._cache_size() == compiled,
    )  # no new executable: inputs of new shapes compile one


# -- running a trace op by op: new shapes of a known trace, and the recovery when a program fails ------
_INTERPRET_MIN_OPS = 64  # smaller programs compile about as fast as their new kernels one by one
# a kernel compiled on its own takes about as long as 8 ops of a fused program (tiny Llama: a 125-op
# decode step compiles in ~0.5 s, one small kernel in 10-30 ms)
_OPS_PER_NEW_KERNEL = 8
_MAX_REMEMBERED = 4096
_last_kernels: dict = {}  # wiring -> the kernels of its latest trace
_seen_once: set = set()  # traces run op by op once: the next sight compiles them
_interpret_always: set = set()  # traces whose fused program failed where their ops one by one did not


def _interpret_first(key: tuple, ops: list, outputs: tuple) -> bool:
    """Should this new trace run op by op instead of compiling a program?

    Yes when it is the same code as the trace before it at a few new shapes: a decode loop whose cache
    grows every token. Compiling would cost a whole program per step (~0.5 s for a tiny Llama step) to
    run it once; op by op, only the kernels whose shapes changed compile (the attention over the
    growing cache), the rest (the layers on a one-token hidden state) are the previous step's: 7 new
    kernels in a tiny Llama's 125-op step. The wiring (which recorded value feeds which op) is the
    trace minus its kernels' shapes. When many kernels are new (a training batch of another length: 93
    of 100), one program compiles faster than its kernels one by one. A trace seen a second time
    compiles after all: it repeats.
    """
    if len(ops) < _INTERPRET_MIN_OPS:
        return False
    wiring = hash((tuple(op[1] for op in ops), outputs))
    kernels = {id(op[0]) for op in ops}
    before = _last_kernels.get(wiring)
    if len(_last_kernels) >= _MAX_REMEMBERED:
        _last_kernels.clear()
    _last_kernels[wiring] = kernels
    if before is None or len(kernels - before) * _OPS_PER_NEW_KERNEL > len(ops):
        return False
    exact = hash(key)
    if exact in _seen_once:
        _seen_once.discard(exact)
        return False
    if len(_seen_once) >= _MAX_REMEMBERED:
        _seen_once.clear()
    _seen_once.add(exact)
    return True


class _Failed:
    """In place of the results of an op that failed, and of everything computed from them."""

    __slots__ = ("op",)

    def __init__(self, op: str) -> None:
        self.op = op  # the failed op's name

    def __getitem__(self, index: int) -> _Failed:  # each output of a failed op
        return self


def _run_op_by_op(
    ops: list, inputs: list, outputs: tuple, reason: str, blocking: bool = False
) -> tuple[list, BaseException | None]:
    """Run each recorded kernel on its own (each is a cached jitted function), as Strict would have.

    Returns the outputs (a `_Failed` for each that depends on a failed op) and the error to raise (None
    when every op ran). Only failures JAX reports when a program is launched (a compile error, a host
    callback raising, an allocation that fails) are found this way; an error XLA reports later, when a
    result is read, surfaces there unnamed, as it does in Strict. Ops that do not depend on a failed one still run: the caller's code went on past
    the failing op before the flush found it. `blocking` waits for each op, so an error that XLA reports
    only when the result is read is charged to the op that made it.
    """
    jax = platform.jax()
    # after which op each node's values are dropped (its last reader; never, for an output): op by op,
    # like Strict, holds an intermediate only while something still reads it
    last_read = list(range(len(ops)))
    for k, (_, refs, _, _) in enumerate(ops):
        for r in refs:
            if r[0] == "v":
                last_read[r[1]] = k
    for n, _ in outputs:
        last_read[n] = len(ops)
    drop_after: list = [[] for _ in ops]
    for n, k in enumerate(last_read):
        if k < len(ops):
            drop_after[k].append(n)
    vals: list = []
    failure = None
    for k, (fn, refs, is_tuple, holder) in enumerate(ops):
        args = [vals[r[1]][r[2]] if r[0] == "v" else inputs[r[1]] for r in refs]
        failed = next((a for a in args if type(a) is _Failed), None)
        if failed is None:
            try:
                out = fn(*args)
                if blocking:
                    jax.block_until_ready(out)
            except Exception as exc:  # noqa: BLE001 - reported, naming the op, once the rest has run
                if failure is None:
                    failure = _op_error(holder, fn, exc, reason)
                failed = _Failed(_op_name(holder, fn))
        if failed is not None:
            vals.append(failed)
        else:
            vals.append(tuple(out) if is_tuple else (out,))
        for n in drop_after[k]:
            vals[n] = None
    return [vals[n][i] for n, i in outputs], failure


def _restore_overwritten(trace: Trace, failure: BaseException) -> None:
    """After a failed flush: storages whose new value is lost get back their value from before the trace
    (a training step that failed in its loss leaves the parameters and optimizer state as they were, so
    an out-of-memory retry with a smaller batch starts from intact weights, as in Strict)."""
    from hf_tpu.runtime.buffers.storage import REGISTRY

    restored = 0
    for ptr, old in trace.before.items():
        p = REGISTRY.payload(ptr)
        if p is not None and type(p.array) is LazyValue and p.array.failed_op is not None:
            REGISTRY.store(p, old)
            restored += 1
    if restored and failure.args and isinstance(failure.args[0], str):
        failure.args = (
            f"{failure.args[0]} {restored} tensor(s) that this trace would have overwritten with values "
            "computed from it keep their values from before it.",
            *failure.args[1:],
        )


def _op_error(holder, fn, exc: BaseException, reason: str) -> BaseException:
    """The error a failed recorded op raises at the flush: the op named, out-of-memory as torch's."""
    from hf_tpu.runtime.buffers import memory, placement

    what = _op_name(holder, fn)
    where = f"{what}, recorded under DeferAndFuse and run at a flush ({reason})"
    if memory.is_jax_oom(exc):
        error = memory.oom_from_jax(exc, where)
    elif (mismatch := placement.mesh_mismatch(exc, where)) is not None:
        error = mismatch
    else:
        error = RuntimeError(
            f"hf_tpu: {where} failed: {type(exc).__name__}: {_gist(exc)}. Tensors computed from it have no value; "
            "the rest of the trace ran. To see the line that called it, run in Debug mode "
            "(torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING))."
        )
    error.__cause__ = exc
    return error


def _op_name(holder, fn) -> str:
    op = getattr(holder, "op", None)
    return str(op) if op is not None else f"a recorded tensor read/write ({getattr(fn, '__name__', fn)})"


def _gist(exc: BaseException) -> str:
    """An error's first line, and its last when it carries a traceback (a host callback's error)."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else ""
    return f"{lines[0]} ... {lines[-1].strip()}"


def _warn_fused_failed(exc: BaseException) -> None:
    warnings.warn(
        f"hf_tpu DeferAndFuse: a fused program failed ({type(exc).__name__}: {_gist(exc)}); its ops ran "
        "one by one instead, and all succeeded. The trace runs op by op from now on.",
        stacklevel=_user_stacklevel(),
    )


_STORM_AT = 24  # consecutive flushes that each compiled (a new program, or kernels at new shapes)
_streak = {"misses": 0, "warned": False}


def _note_miss_streak(hit: bool, trace: Trace) -> None:
    """Warn once when many flushes in a row each compiled: a step whose shapes or op sequence change
    every time (a growing sequence, a sync at a moving point) pays a compile per step. A flush run op
    by op counts when it compiled a kernel (at new shapes, `_interpret_first`)."""
    _streak["misses"] = 0 if hit else _streak["misses"] + 1
    if _streak["misses"] < _STORM_AT or _streak["warned"]:
        return
    if scoped[0]:  # generate's decode loop, deferred by hf_tpu: a new length per token
        return  # by design, nothing the user can pad; its first-call cost is documented, not warned
    _streak["warned"] = True
    shapes = [tuple(a.shape) for a in trace.inputs if hasattr(a, "shape")][:4]
    warnings.warn(
        f"hf_tpu DeferAndFuse: the last {_STORM_AT} flushes each compiled a new program or kernels (latest: "
        f"{len(trace.ops)} ops, input shapes {shapes}...). Shapes or the op sequence change every step: "
        "pad inputs to a few sizes (a StaticCache for generation, hf_tpu.compile(model, buckets=...)), "
        "or synchronize at the same point of every step (torch.tpu.synchronize()).",
        stacklevel=_user_stacklevel(),
    )


_LIBRARY_DIRS = (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,  # hf_tpu/
    os.path.dirname(os.path.abspath(__import__("torch").__file__)) + os.sep,
)


def _user_stacklevel() -> int:
    """The `stacklevel` that makes a warning point at the first caller outside hf_tpu and torch (the
    user's line that needed a value), however deep the runtime's own frames are."""
    frame = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(_LIBRARY_DIRS):
        frame = frame.f_back
        level += 1
    return level


def pending_ops() -> int:
    return len(_trace.ops) if _trace is not None else 0
